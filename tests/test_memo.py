"""Values kept while their tensors are the same, unchanged objects; warnings said once per key."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch

from lightning_halo.memo import TensorMemo, WarnOnce


def test_a_hit_needs_the_same_unchanged_tensors() -> None:
    memo = TensorMemo()
    w, v = torch.ones(3), torch.ones(3)
    memo.put("k", (w, None), "value")
    assert memo.get("k", (w, None)) == "value"
    assert memo.get("k", (v, None)) is None, "an equal tensor is another object"
    assert memo.get("k", (w,)) is None and memo.get("other", (w, None)) is None
    w.add_(1)
    assert memo.get("k", (w, None)) is None, "changed in place"


def test_a_freed_tensor_never_matches_its_successor_at_the_same_address() -> None:
    memo = TensorMemo()
    t = torch.zeros(4)
    memo.put("k", (t,), "old")
    address = id(t)
    del t
    gc.collect()
    for _ in range(100):  # an object at the freed address must not hit
        u = torch.zeros(4)
        if id(u) == address:
            break
    assert memo.get("k", (u,)) is None


def test_the_memo_is_bounded_oldest_first() -> None:
    memo = TensorMemo(limit=2)
    ts = [torch.zeros(1) for _ in range(3)]
    for i, t in enumerate(ts):
        memo.put(i, (t,), i)
    assert memo.get(0, (ts[0],)) is None and memo.get(2, (ts[2],)) == 2
    assert memo.get_or_build(1, (ts[1],), lambda: pytest.fail("kept")) == 1


def test_warn_once_per_instance() -> None:
    once, other = WarnOnce(), WarnOnce()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        once("k", "first")
        once("k", "again")
        other("k", "another run")
    assert [str(w.message) for w in seen] == ["first", "another run"]
