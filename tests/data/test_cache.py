"""The partition cache's pure parts: content fingerprints, keys, atomic publication."""

from __future__ import annotations

from pathlib import Path

import torch
from torch_geometric.data import Data

from lightning_halo.data.cache import cache_key, graph_fingerprint, publish
from tests.support.graphs import awkward_graph


def test_fingerprint_follows_the_content_not_the_object() -> None:
    a, b = awkward_graph(2), awkward_graph(2)
    assert graph_fingerprint(a) == graph_fingerprint(b)
    b.x[3, 1] += 1e-12  # one value, one ulp-ish change
    assert graph_fingerprint(a) != graph_fingerprint(b)
    c = awkward_graph(2)
    c.extra = torch.zeros(2)  # any attribute counts
    assert graph_fingerprint(c) != graph_fingerprint(a)
    assert graph_fingerprint(Data(x=torch.zeros(2, 1))) != graph_fingerprint(Data(x=torch.zeros(1, 2)))  # shape


def test_key_depends_on_every_parameter() -> None:
    base = dict(num_parts=2, partitioner="metis", balance="nodes", seed=0)
    keys = {cache_key("g", **base)}
    for k, v in (("num_parts", 3), ("partitioner", "random"), ("balance", "edges"), ("seed", 1)):
        keys.add(cache_key("g", **{**base, k: v}))
    keys.add(cache_key("h", **base))
    assert len(keys) == 6 and cache_key("g", **base) == cache_key("g", **dict(reversed(base.items())))


def test_publish_is_atomic_and_keeps_or_replaces_the_winner(tmp_path: Path) -> None:
    target = tmp_path / "key"
    first = tmp_path / ".tmp-1"
    first.mkdir()
    (first / "meta.json").write_text("first")
    assert publish(first, target, replace=False) and (target / "meta.json").read_text() == "first"
    second = tmp_path / ".tmp-2"
    second.mkdir()
    (second / "meta.json").write_text("second")
    assert not publish(second, target, replace=False)  # another writer won the race: keep it
    assert (target / "meta.json").read_text() == "first" and not second.exists()
    third = tmp_path / ".tmp-3"
    third.mkdir()
    (third / "meta.json").write_text("third")
    assert publish(third, target, replace=True) and (target / "meta.json").read_text() == "third"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key"]  # nothing half-written left behind
