"""The fused kernel: same numbers as PyG's message passing, a backward that is one cached SpMM."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.utils import scatter, spmm

from lightning_halo.layers.fused import FusedAdjacency


def _graph(n_dst=7, n_src=9, e=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.stack([torch.randint(0, n_src, (e,), generator=g), torch.randint(0, n_dst, (e,), generator=g)])
    ei = torch.cat([ei, ei[:, :6]], dim=1)  # repeated edges
    w = torch.rand(ei.size(1), dtype=torch.float64, generator=g)
    x = torch.randn(n_src, 5, dtype=torch.float64, generator=g, requires_grad=True)
    return ei, w, x, n_dst, n_src


def _message_passing(ei, w, x, n_dst, reduce):
    msg = x[ei[0]] if w is None else w.view(-1, 1) * x[ei[0]]
    return scatter(msg, ei[1], dim=0, dim_size=n_dst, reduce=reduce)


@pytest.mark.parametrize(
    ("reduce", "weighted"),
    [("sum", False), ("sum", True), ("mean", False), ("mean", True), ("max", False), ("min", False)],
)
def test_equals_message_passing_with_repeated_edges(reduce: str, weighted: bool) -> None:
    ei, w, x, n_dst, n_src = _graph()
    w = w if weighted else None
    adj = FusedAdjacency.build(ei, w, n_dst, n_src, reduce, torch.float64)
    got, want = spmm(adj, x, reduce), _message_passing(ei, w, x, n_dst, reduce)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    g = torch.randn_like(want)
    (gx,) = torch.autograd.grad(got, x, g)
    (wx,) = torch.autograd.grad(want, x, g)
    torch.testing.assert_close(gx, wx, atol=1e-12, rtol=1e-12)


def test_every_product_spelling_is_routed_and_gradcheck_holds() -> None:
    ei, w, x, n_dst, n_src = _graph()
    adj = FusedAdjacency.build(ei, w, n_dst, n_src, "sum", torch.float64)
    ref = _message_passing(ei, w, x, n_dst, "sum")
    for y in (adj @ x, torch.sparse.mm(adj, x), torch.matmul(adj, x), adj.matmul(x)):
        torch.testing.assert_close(y, ref)
    assert torch.autograd.gradcheck(lambda t: torch.sparse.mm(adj, t), (x,))
    assert torch.autograd.gradcheck(lambda t: torch.sparse.mm(adj, t, "mean"), (x,))
    assert type(adj.crow_indices()) is torch.Tensor and adj.shape == (n_dst, n_src)  # everything else: plain tensors


def test_transpose_is_built_once_and_backward_is_one_spmm() -> None:
    ei, w, x, n_dst, n_src = _graph(n_dst=300, n_src=400, e=4000)
    adj = FusedAdjacency.build(ei, w, n_dst, n_src, "sum", torch.float64)
    spmm(adj, x).sum().backward()
    kernels = dict(adj._kernels)
    assert len(kernels) == 1
    with torch.profiler.profile() as prof:
        y = spmm(adj, x)
        with torch.profiler.record_function("backward_of_aggregation"):
            y.sum().backward()
    assert adj._kernels == kernels and all(a is b for a, b in zip(adj._kernels.values(), kernels.values()))
    names = [e.name for e in prof.events()]
    assert not any("to_sparse" in n or "sparse_csr" in n and "transpose" in n for n in names), names
    sparse_mm = [n for n in names if "sparse_mm" in n and "reduce_impl" in n]
    assert len(sparse_mm) == 2, sparse_mm  # one forward, one backward: no transpose of the sparse operand


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_sixteen_bit_features(dtype: torch.dtype) -> None:
    ei, w, x, n_dst, n_src = _graph()
    adj = FusedAdjacency.build(ei, None, n_dst, n_src, "mean", torch.float32)
    xd = x.detach().to(dtype).requires_grad_()
    y = spmm(adj, xd, "mean")
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), _message_passing(ei, None, xd.double(), n_dst, "mean"), atol=2e-2, rtol=2e-2)
    y.sum().backward()
    assert xd.grad is not None and xd.grad.dtype == dtype


def test_bad_reduce_and_weighted_max_are_refused() -> None:
    ei, w, _, n_dst, n_src = _graph()
    with pytest.raises(ValueError, match="reduce must be"):
        FusedAdjacency.build(ei, None, n_dst, n_src, "add")
    with pytest.raises(ValueError, match="takes no edge weights"):
        FusedAdjacency.build(ei, w, n_dst, n_src, "max")
