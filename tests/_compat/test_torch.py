"""What lightning-halo assumes about torch's internals (lightning_halo._compat.torch)."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_halo._compat.torch import (
    BATCH_NORM_BASE,
    compiled_original,
    make_subclass,
    plain_dispatch,
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
    assert tensor_version(torch.sparse_coo_tensor(torch.tensor([[0], [0]]), torch.ones(1), (2, 2))) >= 0


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
