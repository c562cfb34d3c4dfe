"""What lightning-halo assumes about torch's internals (lightning_halo._compat.torch)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from lightning_halo._compat.torch import (
    BATCH_NORM_BASE,
    checkpoint_hooks_active,
    compiled_original,
    fake_tensor_mode,
    in_backward,
    is_fake,
    make_subclass,
    mark_sizes_dynamic,
    plain_dispatch,
    saved_tensors,
    sparse_mm_functions,
    tensor_version,
)


def test_the_version_counter_moves_with_every_in_place_change_and_only_then() -> None:
    t = torch.zeros(3)
    v0 = tensor_version(t)
    _ = t + 1  # out of place: no change
    assert tensor_version(t) == v0
    t.add_(1)
    v1 = tensor_version(t)
    assert v1 > v0
    t[0] = 5.0  # indexing assignment is in place too
    t.view(-1).mul_(2)  # through a view: the base's counter moves
    assert tensor_version(t) > v1
    sparse = torch.sparse_coo_tensor(torch.tensor([[0], [0]]), torch.ones(1), (2, 2))
    s0 = tensor_version(sparse)
    sparse.mul_(2)  # a sparse tensor has a counter too, and in-place changes move it
    assert tensor_version(sparse) > s0


class _Tagged(Tensor):
    seen: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(func)
        with plain_dispatch():
            return func(*args, **(kwargs or {}))


def test_a_subclass_view_shares_storage_and_plain_dispatch_bypasses_it() -> None:
    base = torch.arange(4.0)
    tagged = make_subclass(_Tagged, base)
    assert type(tagged) is _Tagged and tagged.data_ptr() == base.data_ptr()
    _Tagged.seen.clear()
    out = tagged + 1
    assert _Tagged.seen and type(out) is Tensor  # results come back plain inside plain_dispatch
    _Tagged.seen.clear()
    with plain_dispatch():
        _ = tagged * 2
    assert not _Tagged.seen
    csr = torch.eye(2).to_sparse_csr()
    assert make_subclass(_Tagged, csr).layout == torch.sparse_csr


def test_sparse_dense_products_reach_torch_function_through_the_listed_functions() -> None:
    funcs = sparse_mm_functions()
    a = make_subclass(_Tagged, torch.eye(3).to_sparse_csr())
    x = torch.randn(3, 2)
    for product in (lambda: torch.sparse.mm(a, x), lambda: a @ x, lambda: torch.mm(a, x), lambda: a.matmul(x)):
        _Tagged.seen.clear()
        product()
        assert _Tagged.seen[0] in funcs, _Tagged.seen[:1]


def test_every_batch_norm_derives_from_the_base() -> None:
    for cls in (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.SyncBatchNorm):
        assert issubclass(cls, BATCH_NORM_BASE), cls
    assert isinstance(torch.nn.LazyBatchNorm1d(), BATCH_NORM_BASE)
    assert not issubclass(torch.nn.LayerNorm, BATCH_NORM_BASE)


def test_compiled_original_finds_the_module_torch_compile_wraps() -> None:
    lin = torch.nn.Linear(2, 2)
    compiled = torch.compile(lin, backend="eager")
    assert compiled_original(compiled) is lin
    assert compiled_original(lin) is None
    assert any(m is lin for m in compiled.modules()), "the wrapped module is a submodule of the wrapper"


def test_saved_tensors_names_each_tensors_own_record_whatever_order_and_size(tmp_path) -> None:
    base = torch.arange(12, dtype=torch.float64)
    state = {
        "n": 3, "name": "part", "pair": ("k", 2),  # not tensors: not listed
        "c": torch.arange(12) * 3, "a": torch.arange(12), "b": torch.arange(12) * 2,  # one size and dtype
        "x": base.view(3, 4), "halo": base.view(3, 4)[1:],  # a view shares its base's record
        "u": torch.arange(5).to(torch.uint16),  # pickled by _rebuild_tensor_v3
        "empty": torch.zeros(0, 2),
    }  # fmt: skip
    torch.save(state, tmp_path / "t.pt")
    found = saved_tensors(tmp_path / "t.pt")
    assert set(found) == {k for k, v in state.items() if isinstance(v, Tensor)}
    raw = open(tmp_path / "t.pt", "rb").read()
    for key, s in found.items():
        t = state[key]
        assert s.record_bytes == t.untyped_storage().nbytes(), key
        start = s.record_offset + s.storage_offset * t.element_size()
        assert raw[start : start + t.numel() * t.element_size()] == t.contiguous().view(-1).view(torch.uint8).numpy().tobytes(), key
    assert found["halo"].record_offset == found["x"].record_offset and found["halo"].storage_offset == 4


def test_skip_data_saves_fake_tensors_with_records_of_their_size(tmp_path) -> None:
    with fake_tensor_mode():
        big = torch.empty(1000, 3)
    assert is_fake(big) and not is_fake(torch.zeros(1))
    with torch.serialization.skip_data(materialize_fake_tensors=True):
        torch.save({"big": big, "idx": torch.arange(4)}, tmp_path / "s.pt")
    found = saved_tensors(tmp_path / "s.pt")
    assert found["big"].record_bytes == 12000 and found["idx"].record_bytes == 32
    loaded = torch.load(tmp_path / "s.pt", mmap=True, weights_only=True)
    assert loaded["big"].shape == (1000, 3)


def test_saved_tensors_refuses_what_it_cannot_place(tmp_path) -> None:
    import pytest

    torch.save({"s": torch.eye(2).to_sparse()}, tmp_path / "sparse.pt")
    with pytest.raises(ValueError, match="pickled a tensor in an unknown way"):
        saved_tensors(tmp_path / "sparse.pt")
    (tmp_path / "plain.zip").write_bytes(b"")
    import zipfile

    with zipfile.ZipFile(tmp_path / "plain.zip", "w") as zf:
        zf.writestr("a/other.txt", "x")
    with pytest.raises(ValueError, match="not a torch.save zip file"):
        saved_tensors(tmp_path / "plain.zip")


def test_marked_sizes_are_symbols_in_a_static_compilation_and_size_one_is_allowed() -> None:
    """``mark_sizes_dynamic``: one graph for every shape under ``torch.compile(dynamic=False)``."""
    graphs = []

    def count(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    fn = torch.compile(lambda x: (x * 2).sum(-1), dynamic=False, backend=count)
    for shape in ((3, 4), (5, 7), (1, 9)):
        x = torch.ones(shape)
        mark_sizes_dynamic(x)
        assert torch.equal(fn(x), (x * 2).sum(-1))
    assert len(graphs) <= 2, "sizes were specialised: one graph per shape"  # size 1 may take a graph of its own


def test_a_checkpointed_forward_packs_through_saved_tensor_hooks_and_its_recomputation_runs_in_backward() -> None:
    seen = []

    def segment(x):
        seen.append((torch.is_grad_enabled(), checkpoint_hooks_active(), in_backward()))
        return x.sin()

    x = torch.ones(3, requires_grad=True)
    assert not in_backward() and not checkpoint_hooks_active()
    checkpoint(segment, x, use_reentrant=False).sum().backward()
    checkpoint(segment, x * 1, use_reentrant=True).sum().backward()
    # non-reentrant: forward under hooks, recomputed in backward; reentrant: forward without gradients, then in backward
    assert [s[2] for s in seen] == [False, True, False, True]
    assert seen[0][:2] == (True, True) and seen[2][0] is False
    with torch.autograd.graph.save_on_cpu():
        assert not checkpoint_hooks_active()  # offloading recomputes nothing
