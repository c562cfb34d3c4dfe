"""PyG's graph-wide norms over the nodes of all partitions: forward, backward and running statistics equal
single-process PyG (ranks as threads), and the calls they cannot take refused with the reason."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric.nn import GCNConv
from torch_geometric.nn import models as pyg_models
from torch_geometric.nn import norm as pyg_norm

from lightning_halo.layers import UnsupportedLayerError
from lightning_halo.layers.graphnorm import find_graph_norms, global_graph_norm, is_global_graph_norm
from tests.support.graphs import awkward_graph
from tests.support.models import NormNet, assert_norm_run_matches
from tests.support.threaded import on_wires, reference, run_threaded

NORMS = {
    "LayerNorm (graph)": lambda: pyg_norm.LayerNorm(8),
    "LayerNorm (graph, no affine)": lambda: pyg_norm.LayerNorm(8, affine=False),
    "GraphNorm": lambda: pyg_norm.GraphNorm(8),
    "InstanceNorm": lambda: pyg_norm.InstanceNorm(8),
    "InstanceNorm (affine, running stats)": lambda: pyg_norm.InstanceNorm(8, affine=True, track_running_stats=True),
    "PairNorm": lambda: pyg_norm.PairNorm(scale=2.0),
    "PairNorm (rows scaled individually)": lambda: pyg_norm.PairNorm(scale_individually=True),
    "MeanSubtractionNorm": lambda: pyg_norm.MeanSubtractionNorm(),
    "GraphSizeNorm": lambda: pyg_norm.GraphSizeNorm(),
}


def _net(data, norm: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    net = NormNet(data.num_features, int(data.y.max()) + 1, norm).double()
    if isinstance(norm, pyg_norm.GraphNorm):  # not the identity at initialisation: the test sees every term
        with torch.no_grad():
            norm.mean_scale.uniform_(0.2, 0.8)
            norm.weight.uniform_(0.5, 1.5)
    return net


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("norm", sorted(NORMS))
def test_graph_norm_equals_single_process(norm: str, world_size: int) -> None:
    """Logits, loss, gradients and running statistics after three steps, as one process computes them."""
    data = awkward_graph(world_size)
    model = _net(data, NORMS[norm]())
    assert_norm_run_matches(run_threaded(model, data, world_size, steps=3), reference(model, data, steps=3))


@pytest.mark.parametrize("kind", ["layer_norm", "graph_norm", "instance_norm"])
def test_pyg_models_with_their_graph_norms_equal_single_process(kind: str) -> None:
    """``torch_geometric.nn.models.GCN(norm=...)`` as PyG ships it (``"layer_norm"`` is graph mode by default)."""
    data = awkward_graph(3)
    torch.manual_seed(0)
    model = pyg_models.GCN(data.num_features, 16, 3, int(data.y.max()) + 1, norm=kind).double()
    got = run_threaded(model, data, 3, steps=2)
    ref = reference(model, data, steps=2)
    torch.testing.assert_close(got["out"], ref["out"], atol=1e-9, rtol=1e-7)
    for k, g in ref["grad"].items():
        torch.testing.assert_close(got["grad"][k], g, atol=1e-9, rtol=1e-7, msg=lambda m: f"grad {k}: {m}")


def test_the_partition_statistics_would_differ() -> None:
    """The tests above can fail: a graph norm of a partition's rows alone is not the whole graph's."""
    x = torch.randn(60, 8, dtype=torch.float64) * 3 + 1
    for make in NORMS.values():
        norm = make().double()
        assert not torch.allclose(norm(x[:20]), norm(x)[:20]), norm


def test_split_rows_equal_the_whole_with_a_one_row_rank() -> None:
    torch.manual_seed(1)
    x = torch.randn(30, 8, dtype=torch.float64) * 3 + 5
    bounds = [0, 1, 12, 30]
    gy = torch.linspace(-1, 1, x.numel(), dtype=x.dtype).reshape(x.shape)
    for name, make in NORMS.items():
        def rank(r: int, wire, make=make):
            torch.manual_seed(0)
            module = make().double()
            xr = x[bounds[r] : bounds[r + 1]].clone().requires_grad_(True)
            y = global_graph_norm(xr, module, "norm", lambda t, n: wire.all_sum(t, n))
            (y * gy[bounds[r] : bounds[r + 1]]).sum().backward()
            return y.detach(), xr.grad

        ranks = on_wires(3, rank)
        torch.manual_seed(0)
        ref_x = x.clone().requires_grad_(True)
        y = make().double()(ref_x)
        (y * gy).sum().backward()
        torch.testing.assert_close(torch.cat([r[0] for r in ranks]), y.detach(), msg=lambda m: f"{name}: {m}")
        torch.testing.assert_close(torch.cat([r[1] for r in ranks]), ref_x.grad, msg=lambda m: f"{name}: {m}")


class HaloNorm(nn.Module):
    """A norm on the inner *and* halo rows (what a layer's input holds on a partition): counted twice."""

    def __init__(self, d_in: int, n_cls: int) -> None:
        super().__init__()
        self.conv, self.norm = GCNConv(d_in, n_cls), pyg_norm.GraphNorm(d_in)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


def test_rows_counted_twice_and_several_graphs_are_refused() -> None:
    data = awkward_graph(2)
    torch.manual_seed(0)

    def halo_rows(net, part):
        full = torch.cat([part.x, part.halo_x])
        return net.conv(part.x, part.edge_index) + 0 * net.norm(full).sum()

    with pytest.raises(UnsupportedLayerError, match="the partition's inner and halo nodes"):
        run_threaded(HaloNorm(data.num_features, 3).double(), data, 2, halo_rows)

    def two_graphs(net, part):
        batch = torch.arange(part.x.size(0)) % 2
        return net.conv(net.norm(part.x, batch), part.edge_index)

    with pytest.raises(UnsupportedLayerError, match="batch vector of several graphs"):
        run_threaded(HaloNorm(data.num_features, 3).double(), data, 2, two_graphs)


def test_only_pygs_graph_wide_norms_are_found() -> None:
    net = nn.Sequential(pyg_norm.LayerNorm(4), pyg_norm.LayerNorm(4, mode="node"), pyg_norm.PairNorm(),
                        pyg_norm.BatchNorm(4), pyg_norm.MessageNorm(), type("PairNorm", (nn.Module,), {})())  # fmt: skip
    assert sorted(find_graph_norms(net)) == ["0", "2"]
    assert not is_global_graph_norm(pyg_norm.HeteroBatchNorm(4, num_types=2))
