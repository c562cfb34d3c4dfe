"""Never silently wrong: a layer call the partition cannot answer exactly is refused, on every rank.

The ranks are threads over an in-process transport; a refusal that only some ranks made would
leave the others waiting, which the transport turns into a timeout error, so every test below
also checks that all ranks raise the same error.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric import nn as gnn
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import add_self_loops, dropout_edge, subgraph

from lightning_halo import UnsupportedEdgesError, UnsupportedLayerError, register_layer
from lightning_halo.layers import registry
from lightning_halo.layers.hooks import check_model
from tests.support.graphs import awkward_graph
from tests.support.threaded import assert_same, reference, run_threaded

H = 8


class _Net(nn.Module):
    def __init__(self, d_in: int, conv: nn.Module) -> None:
        super().__init__()
        self.lin, self.conv, self.out = nn.Linear(d_in, H), conv, nn.Linear(H, 3)

    def forward(self, x, edge_index):
        return self.out(F.relu(self.conv(self.lin(x), edge_index)))


def _all_ranks_raised(info, cls) -> None:
    errors = info.value.rank_errors
    assert all(isinstance(e, cls) for e in errors), [type(e).__name__ for e in errors]


def _transforms(world_size: int):
    g = torch.Generator().manual_seed(0)

    def drop(batch):
        keep = torch.rand(batch.edge_index.size(1), generator=g) > 0.2
        return batch.edge_index[:, keep]

    return {
        "dropout_edge": lambda b: dropout_edge(b.edge_index, p=0.3, training=True)[0],
        "random drop": drop,
        "subgraph": lambda b: subgraph(torch.arange(b.num_nodes // 2), b.edge_index, num_nodes=b.num_nodes + 99)[0],
        "add_self_loops": lambda b: add_self_loops(b.edge_index, num_nodes=b.num_nodes)[0],
        "one edge less": lambda b: b.edge_index[:, 1:],
        "edges permuted": lambda b: b.edge_index[:, torch.randperm(b.edge_index.size(1), generator=g)],
        "float tensor": lambda b: b.edge_index.double(),
    }


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("transform", list(_transforms(2)))
def test_transformed_edges_are_refused_on_every_rank(transform: str, world_size: int) -> None:
    data = awkward_graph(world_size)
    torch.manual_seed(0)
    net = _Net(data.num_features, gnn.SAGEConv(H, H)).double()
    make = _transforms(world_size)[transform]
    with pytest.raises(UnsupportedEdgesError, match="not this partition's") as info:
        run_threaded(net, data, world_size, lambda m, b: m(b.x, make(b)), timeout=20)
    assert "Transform the graph before partitioning" in str(info.value)
    _all_ranks_raised(info, UnsupportedEdgesError)


def test_reversed_edges_and_copies_are_accepted() -> None:
    data = awkward_graph(3)
    torch.manual_seed(0)
    net = _Net(data.num_features, gnn.GCNConv(H, H)).double()
    ref = reference(net, data, lambda m, b: m(b.x, b.edge_index.clone()))
    assert_same(run_threaded(net, data, 3, lambda m, b: m(b.x, b.edge_index.clone())), ref, what="a copy")
    ref_rev = reference(net, data, lambda m, b: m(b.x, b.edge_index.flip(0)))
    assert_same(run_threaded(net, data, 3, lambda m, b: m(b.x, b.edge_index.flip(0))), ref_rev, what="reversed")


def test_one_process_runs_any_edge_set_and_says_it_would_be_refused() -> None:
    data = awkward_graph(1)
    torch.manual_seed(0)
    net = _Net(data.num_features, gnn.SAGEConv(H, H)).double()

    def fwd(m, b):
        return m(b.x, add_self_loops(b.edge_index, num_nodes=b.num_nodes)[0])

    with pytest.warns(UserWarning, match="would be refused on several"):
        got = run_threaded(net, data, 1, fwd)
    assert_same(got, reference(net, data, fwd), what="one process")


class KHop(MessagePassing):
    """A user's layer: K mean-propagations in one call (each reads the previous one's output)."""

    def __init__(self, k: int = 2) -> None:
        super().__init__(aggr="mean")
        self.k = k

    def forward(self, x, edge_index):
        for _ in range(self.k):
            x = self.propagate(edge_index, x=x)
        return x


@pytest.mark.parametrize("world_size", [2, 3])
def test_multi_hop_layer_registered_as_single_step_is_refused(world_size: int) -> None:
    class MisRegistered(KHop):
        pass

    register_layer(MisRegistered, "full")
    try:
        data = awkward_graph(world_size)
        net = _Net(data.num_features, MisRegistered()).double()
        with pytest.raises(UnsupportedLayerError, match="called propagate 2 times") as info:
            run_threaded(net, data, world_size, timeout=20)
        _all_ranks_raised(info, UnsupportedLayerError)
    finally:
        registry._REG.specs.pop(MisRegistered)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_multi_hop_layer_registered_as_steps_is_exact(world_size: int) -> None:
    class Steps(KHop):
        pass

    register_layer(Steps, "steps")
    try:
        data = awkward_graph(world_size)
        torch.manual_seed(0)
        net = _Net(data.num_features, Steps(3)).double()
        got = run_threaded(net, data, world_size)
        assert_same(got, reference(net, data), what="user steps layer")
        if world_size > 1:  # one exchange per propagation step
            assert {layer for meter in got["meters"] for layer, _ in meter} >= {"conv#1", "conv#2", "conv#3"}
    finally:
        registry._REG.specs.pop(Steps)


def test_reversed_edges_with_an_unalignable_edge_tensor_are_refused() -> None:
    class Reversed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.conv, self.out = nn.Linear(8, H), gnn.GINEConv(nn.Linear(H, H), edge_dim=3), nn.Linear(H, 3)

        def forward(self, x, edge_index, edge_attr):
            return self.out(self.conv(self.lin(x), edge_index.flip(0), edge_attr * 2))  # a computed edge tensor

    data = awkward_graph(2)
    net = Reversed().double()
    with pytest.raises(UnsupportedEdgesError, match="cannot reorder it") as info:
        run_threaded(net, data, 2, lambda m, b: m(b.x, b.edge_index, b.edge_attr), timeout=20)
    _all_ranks_raised(info, UnsupportedEdgesError)
    ok = lambda m, b: m.out(m.conv(m.lin(b.x), b.edge_index.flip(0), b.edge_attr))  # noqa: E731 - the partition's own
    assert_same(run_threaded(net, data, 2, ok), reference(net, data, ok), what="edge_attr along reversed edges")


def test_compiling_is_refused(monkeypatch) -> None:
    data = awkward_graph(2)
    net = _Net(data.num_features, gnn.SAGEConv(H, H)).double()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(UnsupportedLayerError, match="torch.compile"):
        run_threaded(net, data, 2, timeout=20)


def test_wrappers_with_global_computations_are_refused_before_anything_runs() -> None:
    gps = nn.Module()
    gps.block = gnn.GPSConv(H, gnn.GCNConv(H, H), heads=2)
    with pytest.raises(UnsupportedLayerError, match="global attention"):
        check_model(gps)
    with pytest.raises(UnsupportedLayerError, match="no torch_geometric MessagePassing layer"):
        check_model(nn.Linear(2, 2))
    with pytest.raises(UnsupportedLayerError, match="EGConv cannot run"):
        check_model(_Net(4, gnn.EGConv(H, H)))


def test_edges_changed_in_place_are_refused() -> None:
    data = awkward_graph(2)
    net = _Net(data.num_features, gnn.SAGEConv(H, H)).double()

    def fwd(m, b):
        b.edge_index[0, 0] = b.edge_index[0, 1]  # e.g. a "cleaning" step in the model
        return m(b.x, b.edge_index)

    with pytest.raises(UnsupportedEdgesError, match="changed in place") as info:
        run_threaded(net, data, 2, fwd, timeout=20)
    _all_ranks_raised(info, UnsupportedEdgesError)
