"""Never silently wrong: a layer call the partition cannot answer exactly is refused, on every rank.

The ranks are threads over an in-process transport; a refusal that only some ranks made would
leave the others waiting, which the transport turns into a timeout error, so every test below
also checks that all ranks raise the same error.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric import nn as gnn
from torch_geometric.nn import MessagePassing, aggr
from torch_geometric.utils import add_self_loops, dropout_edge, subgraph

import lightning_halo
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


# ---------------------------------------------------------------- options of a supported layer


@pytest.fixture(autouse=True)
def _fresh_classes(monkeypatch):
    """Non-fusable instances below are built from throwaway subclasses (registered like their base).

    PyG generates one ``propagate`` per class for its first instance: a first ``SAGEConv`` with an
    LSTM aggregation would take the fused path from every later ``SAGEConv`` of the test process.
    """
    for cls in (gnn.SAGEConv, gnn.GraphConv):
        sub = type(cls.__name__, (cls,), {})
        monkeypatch.setitem(registry._REG.specs, sub, registry._REG.specs[cls])
        monkeypatch.setattr(gnn, cls.__name__, sub)


def _dst_sorted(world_size: int):
    data = awkward_graph(world_size)
    order = torch.argsort(data.edge_index[1] * data.num_nodes + data.edge_index[0])
    data.edge_index, data.edge_attr = data.edge_index[:, order], data.edge_attr[order]
    return data


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda: gnn.SAGEConv(H, H, aggr="lstm"), "LSTMAggregation"),
        (lambda: gnn.SAGEConv(H, H, aggr=aggr.GRUAggregation(H, H)), "GRUAggregation"),
        (lambda: gnn.GraphConv(H, H, aggr=aggr.LCMAggregation(H, H)), "LCMAggregation"),
        (lambda: gnn.SAGEConv(H, H, aggr=aggr.EquilibriumAggregation(H, H, [4])), "EquilibriumAggregation"),
        (lambda: gnn.SAGEConv(H, H, aggr=["mean", aggr.LSTMAggregation(H, H)]), "LSTMAggregation"),
    ],
)
def test_aggregations_that_see_the_whole_call_are_refused(make, what: str) -> None:
    with pytest.raises(UnsupportedLayerError, match=f"'conv' .*{what} is not exact on a partition"):
        check_model(_Net(8, make()))


def test_the_lstm_refusal_is_needed() -> None:
    # Declared exact on purpose, the LSTM aggregation gives other results on 3 partitions: it pads
    # every neighbourhood to the largest in-degree of the call.
    data = _dst_sorted(3)
    torch.manual_seed(0)
    net = _Net(data.num_features, gnn.SAGEConv(H, H, aggr="lstm")).double()
    registry.register_aggregation(aggr.LSTMAggregation)
    try:
        got = run_threaded(net, data, 3)
    finally:
        registry._REG.aggregations.discard(aggr.LSTMAggregation)
    assert (got["out"] - reference(net, data)["out"]).abs().max() > 1e-4


@pytest.mark.parametrize(
    "make",
    [
        lambda: gnn.SAGEConv(H, H, aggr=aggr.SoftmaxAggregation(learn=True)),
        lambda: gnn.SAGEConv(H, H, aggr=["mean", "max", "std"]),
        lambda: gnn.SAGEConv(H, H, aggr=aggr.MedianAggregation()),
        lambda: gnn.SAGEConv(H, H, aggr=aggr.SetTransformerAggregation(H, heads=1)),
    ],
)
def test_aggregations_of_a_node_s_own_messages_are_exact(make) -> None:
    data = _dst_sorted(3)
    torch.manual_seed(0)
    net = _Net(data.num_features, make()).double()
    assert_same(run_threaded(net, data, 3), reference(net, data), what="local aggregation")


def test_every_pyg_aggregation_has_a_status() -> None:
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    known = registry._LOCAL_AGGREGATIONS | set(registry._CALL_WIDE_AGGREGATIONS)
    names = {c.__name__ for c in subclasses(aggr.Aggregation) if c.__module__.startswith("torch_geometric.")}
    assert not names - known, f"aggregations without a status in the registry: {sorted(names - known)}"


def test_a_custom_aggregation_is_refused_until_declared() -> None:
    class Mine(aggr.Aggregation):
        def forward(self, x, index=None, ptr=None, dim_size=None, dim=-2, max_num_elements=None):
            return self.reduce(x, index, ptr, dim_size, dim, reduce="sum")

    net = _Net(8, gnn.SAGEConv(H, H, aggr=Mine()))
    with pytest.raises(UnsupportedLayerError, match=r"register_aggregation\(Mine\)"):
        check_model(net)
    lightning_halo.register_aggregation(Mine)
    try:
        check_model(net)
    finally:
        registry._REG.aggregations.discard(Mine)
    with pytest.raises(TypeError, match="Aggregation subclass"):
        lightning_halo.register_aggregation(nn.Linear)


T2S = "target_to_source"


def test_options_that_read_the_sources_edges_under_target_to_source_are_refused() -> None:
    with pytest.raises(UnsupportedLayerError, match="degree of their sources"):
        check_model(_Net(8, gnn.ClusterGCNConv(H, H, flow=T2S)))
    with pytest.raises(UnsupportedLayerError, match="fill_value='mean'"):
        check_model(_Net(8, gnn.GATConv(H, H, edge_dim=3, flow=T2S)))
    check_model(_Net(8, gnn.GATConv(H, H, edge_dim=3, flow=T2S, fill_value=0.5)))  # a constant is exact


class _EdgeAttrNet(nn.Module):
    def __init__(self, d_in: int, conv: nn.Module) -> None:
        super().__init__()
        self.lin, self.conv, self.out = nn.Linear(d_in, H), conv, nn.Linear(H, 3)

    def forward(self, x, edge_index, edge_attr):
        return self.out(F.relu(self.conv(self.lin(x), edge_index, edge_attr)))


def test_gat_with_a_constant_self_loop_attribute_is_exact_under_target_to_source() -> None:
    data = awkward_graph(3)
    torch.manual_seed(0)
    net = _EdgeAttrNet(data.num_features, gnn.GATConv(H, H, edge_dim=3, flow=T2S, fill_value=0.5)).double()
    fwd = lambda m, b: m(b.x, b.edge_index, b.edge_attr)  # noqa: E731
    assert_same(run_threaded(net, data, 3, fwd), reference(net, data, fwd), what="GAT t2s fill_value=0.5")


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize(
    "make",
    [
        lambda: gnn.APPNP(K=2, alpha=0.1, flow=T2S),
        lambda: gnn.TAGConv(H, H, K=2, flow=T2S),
        lambda: gnn.ARMAConv(H, H, num_stacks=2, num_layers=2, flow=T2S),
        lambda: gnn.GatedGraphConv(H, 2, flow=T2S),
    ],
)
def test_multi_step_layers_run_exactly_under_target_to_source(make, world_size: int) -> None:
    data = awkward_graph(world_size)
    torch.manual_seed(0)
    net = _Net(data.num_features, make()).double()
    assert_same(run_threaded(net, data, world_size), reference(net, data), what="steps layer, t2s")


def test_a_multi_step_layer_propagating_a_pair_under_target_to_source_is_refused() -> None:
    class FA(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.conv, self.out = nn.Linear(8, H), gnn.FAConv(H, flow=T2S), nn.Linear(H, 3)

        def forward(self, x, edge_index):
            h = self.lin(x)
            return self.out(self.conv(h, h, edge_index))

    data = awkward_graph(2)
    with pytest.raises(UnsupportedLayerError, match="propagates the pair `alpha`") as info:
        run_threaded(FA().double(), data, 2, timeout=20)
    _all_ranks_raised(info, UnsupportedLayerError)


_FIRST_SAGE_CANNOT_FUSE = """
import torch, torch.nn.functional as F
from torch import nn
from torch_geometric import nn as gnn
from torch_geometric.nn import aggr
from lightning_halo.layers.registry import class_propagate_fuses
from tests.support.graphs import awkward_graph
from tests.support.threaded import assert_same, reference, run_threaded

class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = gnn.SAGEConv(8, 8, aggr=aggr.SoftmaxAggregation(learn=True))  # the process's first SAGEConv
        self.b = gnn.SAGEConv(8, 3)  # aggr="mean" could fuse, but the class's generated propagate cannot

    def forward(self, x, edge_index):
        return self.b(F.relu(self.a(x, edge_index)), edge_index)

torch.manual_seed(0)
net, data = Two().double(), awkward_graph(2)
assert not class_propagate_fuses(gnn.SAGEConv)
got = run_threaded(net, data, 2)
assert_same(got, reference(net, data), what="SAGE after a non-fusable SAGE")
assert "generated its class's propagate" in got["choices"]["b"], got["choices"]
print("ok")
"""


def test_a_class_whose_generated_propagate_cannot_fuse_runs_on_edge_index(tmp_path: Path) -> None:
    # PyG generates a class's propagate for its first instance: only a process that made no SAGEConv yet shows it,
    # such as one forked from the tests' server (it imported PyG and built no layer; the script checks that).
    from benchmarks.launch import run_forked
    from tests.support.launch import PRELOAD

    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "first_sage.py"
    script.write_text(_FIRST_SAGE_CANNOT_FUSE)
    res = run_forked([str(script)], {**os.environ, "PYTHONPATH": str(root)}, root, PRELOAD, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout[-2000:] + res.stderr[-3000:]


def test_a_cached_gcn_called_with_other_weights_is_refused() -> None:
    class Annealed(nn.Module):  # edge weights sharpened every step, without gradients
        def __init__(self) -> None:
            super().__init__()
            self.conv = gnn.GCNConv(8, 3, cached=True)
            self.step = 0

        def forward(self, x, edge_index, weight):
            self.step += 1
            return self.conv(x, edge_index, weight**self.step)

    data = awkward_graph(2)
    data.edge_weight = torch.rand(data.edge_index.size(1), dtype=torch.float64) + 0.1
    fwd = lambda m, b: m(b.x, b.edge_index, b.edge_weight)  # noqa: E731
    with pytest.raises(UnsupportedLayerError, match="cached=True and was called with other edge weights") as info:
        run_threaded(Annealed().double(), data, 2, fwd, steps=2, timeout=20)
    _all_ranks_raised(info, UnsupportedLayerError)
    torch.manual_seed(0)
    fixed = _Net(data.num_features, gnn.GCNConv(H, H, cached=True)).double()  # the same edges every step: exact
    assert_same(run_threaded(fixed, data, 2, steps=2), reference(fixed, data), what="cached GCN")


def test_graph_coarsening_modules_are_refused_before_anything_runs() -> None:
    from torch_geometric.nn import models

    with pytest.raises(UnsupportedLayerError, match="coarsens the graph"):
        check_model(models.GraphUNet(8, H, 3, depth=2))
    net = _Net(8, gnn.GCNConv(H, H))
    net.pool = gnn.TopKPooling(H)
    with pytest.raises(UnsupportedLayerError, match="'pool' \\(TopKPooling\\).*coarsens"):
        check_model(net)
