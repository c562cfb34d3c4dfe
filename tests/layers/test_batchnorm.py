"""Batch norms over the nodes of all partitions: forward, backward and running statistics equal
single-process PyG (ranks as threads; the multi-process run is in tests/strategy/test_batchnorm.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric.nn import models as pyg_models
from torch_geometric.nn.norm import BatchNorm as PygBatchNorm

from lightning_halo.exchange import TrafficMeter
from lightning_halo.exchange.wire import SoloTransport, Wire
from lightning_halo.layers import UnsupportedLayerError
from lightning_halo.layers.batchnorm import BatchNormHook, BoundRows, NormCall, find_batch_norms, global_batch_norm
from tests.support.graphs import awkward_graph, cora
from tests.support.models import NormNet, assert_norm_run_matches
from tests.support.threaded import on_threads, on_wires, reference, run_threaded


def _net(data, norm: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return NormNet(data.num_features, int(data.y.max()) + 1, norm).double()


NORMS = {
    "BatchNorm1d": lambda: nn.BatchNorm1d(8),
    "momentum=None": lambda: nn.BatchNorm1d(8, momentum=None),
    "no running stats": lambda: nn.BatchNorm1d(8, track_running_stats=False),
    "no affine": lambda: nn.BatchNorm1d(8, affine=False),
    "PyG BatchNorm": lambda: PygBatchNorm(8),
}


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("norm", sorted(NORMS))
def test_batch_norm_equals_single_process(norm: str, world_size: int) -> None:
    """Logits, loss, gradients and running statistics after three steps, as one process computes them."""
    data = awkward_graph(world_size)
    model = _net(data, NORMS[norm]())
    got = run_threaded(model, data, world_size, steps=3)
    ref = reference(model, data, steps=3)
    assert_norm_run_matches(got, ref)


def test_pyg_gin_with_batch_norm_equals_single_process() -> None:
    """``torch_geometric.nn.models.GIN(norm="batch_norm")``, as PyG ships it, on Cora at 3 processes."""
    data = cora()
    torch.manual_seed(0)
    model = pyg_models.GIN(data.num_features, 16, 3, int(data.y.max()) + 1, norm="batch_norm").double()
    got = run_threaded(model, data, 3, steps=2)
    ref = reference(model, data, steps=2)
    torch.testing.assert_close(got["out"], ref["out"], atol=1e-8, rtol=1e-7)
    for k, g in ref["grad"].items():
        torch.testing.assert_close(got["grad"][k], g, atol=1e-8, rtol=1e-7, msg=lambda m: f"grad {k}: {m}")
    for k, b in ref["buffers"].items():
        torch.testing.assert_close(got["ranks"][1]["buffers"][k], b, atol=1e-8, rtol=1e-7)


def test_the_partition_statistics_would_differ() -> None:
    """The test above can fail: per-partition statistics (plain torch on a partition) are not the graph's."""
    data = awkward_graph(2)
    x = torch.randn(data.num_nodes, 4, dtype=torch.float64)
    half = nn.BatchNorm1d(4).double()(x[: data.num_nodes // 3])
    whole = nn.BatchNorm1d(4).double()(x)[: data.num_nodes // 3]
    assert not torch.allclose(half, whole)


def _split_run(x: torch.Tensor, bounds: list[int], make: callable, train: bool = True):
    """Rows ``x[bounds[r]:bounds[r+1]]`` on rank ``r`` through ``global_batch_norm``; outputs, input grads, modules."""
    n = len(bounds) - 1
    gy = torch.linspace(-1, 1, x.numel(), dtype=x.dtype).reshape(x.shape)

    def rank(r: int, wire: Wire):
        module = make().train(train)
        xr = x[bounds[r] : bounds[r + 1]].clone().requires_grad_(True)
        y = global_batch_norm(xr, module, NormCall("bn", module.eps, lambda t, name: wire.all_sum(t, name)))
        (y * gy[bounds[r] : bounds[r + 1]]).sum().backward()
        return y.detach(), xr.grad, module

    return on_wires(n, rank)


@pytest.mark.parametrize("shape", [(30, 4), (30, 4, 3)])
def test_global_batch_norm_of_split_rows_equals_the_whole(shape: tuple[int, ...]) -> None:
    """1-D and 3-D input (``[n, C, L]``: statistics over rows and positions), uneven splits, a one-row rank."""
    torch.manual_seed(1)
    x = torch.randn(*shape, dtype=torch.float64) * 3 + 5
    bounds = [0, 1, 12, 30]
    make = lambda: nn.BatchNorm1d(4).double()  # noqa: E731
    ranks = _split_run(x, bounds, make)
    ref_x = x.clone().requires_grad_(True)
    ref_bn = make()
    y = ref_bn(ref_x)
    (y * torch.linspace(-1, 1, x.numel(), dtype=x.dtype).reshape(x.shape)).sum().backward()
    torch.testing.assert_close(torch.cat([r[0] for r in ranks]), y.detach())
    torch.testing.assert_close(torch.cat([r[1] for r in ranks]), ref_x.grad)
    for _, _, module in ranks:
        torch.testing.assert_close(module.running_mean, ref_bn.running_mean)
        torch.testing.assert_close(module.running_var, ref_bn.running_var)  # unbiased, as torch keeps it
        assert int(module.num_batches_tracked) == 1


def test_eval_uses_the_running_statistics_without_a_collective() -> None:
    bn = nn.BatchNorm1d(3).double().eval()
    bn.running_mean.fill_(1.0)
    x = torch.randn(5, 3, dtype=torch.float64)

    def never(t, name):
        raise AssertionError("no collective in eval")

    torch.testing.assert_close(global_batch_norm(x, bn, NormCall("bn", bn.eps, never)), bn(x))


def test_a_single_value_per_channel_over_all_ranks_is_refused_like_torch() -> None:
    bn = nn.BatchNorm1d(3).double()
    wire = Wire(SoloTransport(), TrafficMeter())
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        global_batch_norm(torch.randn(1, 3, dtype=torch.float64), bn, NormCall("bn", bn.eps, wire.all_sum))


def test_the_hook_refuses_inner_and_halo_rows_and_steps_aside_when_unbound() -> None:
    bn = nn.BatchNorm1d(3).double()
    bound = [None]
    hook = BatchNormHook(bn, "norm", lambda: bound[0]).install()
    x = torch.randn(7, 3, dtype=torch.float64)
    torch.testing.assert_close(bn(x), nn.BatchNorm1d(3).double()(x))  # no partition bound: torch's own
    bound[0] = BoundRows(lambda t, name: t, frozenset([5]), {7: ""})  # 5 inner rows and 2 halo rows
    with pytest.raises(UnsupportedLayerError, match="inner and halo nodes: the halo rows"):
        bn(x)
    # a heterogeneous partition where 7 is one type's inner rows and another's inner and halo rows: no telling
    bound[0] = BoundRows(lambda t, name: t, frozenset([7, 3]), {7: "type 'author'"})
    with pytest.raises(UnsupportedLayerError, match="cannot tell whether halo rows"):
        bn(x)
    hook.remove()
    assert "forward" not in bn.__dict__
    assert bn(x).shape == x.shape


def test_find_batch_norms_finds_torch_and_pyg_norms() -> None:
    model = nn.Sequential(nn.BatchNorm1d(3), PygBatchNorm(3), nn.LayerNorm(3))
    assert sorted(find_batch_norms(model)) == ["0", "1.module"]


def test_threads_helper_reports_rank_errors() -> None:
    """A rank that never joins the all-reduce makes its peer time out instead of hanging."""
    from lightning_halo.testing import ThreadGroup

    group = ThreadGroup(2, timeout=0.5)

    def rank(r: int):
        if r == 0:
            Wire(group.transport(0), TrafficMeter()).all_sum(torch.ones(2), "bn")

    with pytest.raises(Exception, match="timed out"):
        on_threads(2, rank)
