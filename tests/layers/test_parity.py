"""Every supported layer gives the whole-graph result on partitions, on both aggregation paths.

In-process: each rank is a thread with its own copy of the model, lightning-halo's hooks and
an exchange over an in-process transport (the multi-process runs are in tests/strategy). On a
directed float64 graph with repeated edges, self-loops, isolated nodes and a rank without train
nodes, at 1-4 ranks: logits of every node, the loss and every parameter's gradient equal
single-process PyG on the whole graph, with the fused sparse kernel (``aggregation="auto"``)
and with PyG's ``edge_index`` path.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric import nn as gnn

from lightning_halo.partition import build_halo_partitions, partition_graph
from tests.support.device import ON_CUDA
from tests.support.graphs import awkward_graph, cora
from tests.support.models import HOMOGENEOUS_LAYERS, LAYER_VARIANTS, build_any
from tests.support.threaded import assert_same, reference, run_threaded

LAYERS = [*HOMOGENEOUS_LAYERS, *LAYER_VARIANTS]


def _layer_forward(model, batch):
    return model(batch.x, batch.edge_index, batch.get("edge_attr"), batch.get("edge_type"))


#: On CUDA (tools/gpu_check.sh) one rank: threaded ranks cannot exchange in a CUDA backward (tests/support/threaded.py).
WORLD_SIZES = [1] if ON_CUDA else [1, 2, 3, 4]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("layer", LAYERS)
def test_every_supported_layer_matches_the_whole_graph(layer: str, world_size: int) -> None:
    data = awkward_graph(world_size)
    net = build_any(f"layer:{layer}", data)
    ref = reference(net, data, _layer_forward)
    for aggregation, halo_reduction in (("auto", "cover"), ("auto", "none"), ("edge_index", "cover")):
        got = run_threaded(net, data, world_size, _layer_forward, aggregation=aggregation, halo_reduction=halo_reduction)
        assert_same(got, ref, what=f"{layer} at {world_size} ranks, aggregation={aggregation}, {halo_reduction}")


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("layer", LAYERS)
def test_every_supported_layer_matches_on_kaminpar_partitions(layer: str, world_size: int) -> None:
    data = awkward_graph(world_size)
    net = build_any(f"layer:{layer}", data)
    assignment = partition_graph(data.edge_index, data.num_nodes, world_size, partitioner="kaminpar")
    parts = build_halo_partitions(data, assignment, world_size)
    got = run_threaded(net, data, world_size, _layer_forward, parts=parts)
    assert_same(got, reference(net, data, _layer_forward), what=f"{layer} at {world_size} ranks, KaMinPar")


PARTIAL_SUM_LAYERS = ("GCNConv", "SAGEConv", "GINConv", "GraphConv", "LGConv", "SimpleConv", "ClusterGCNConv", "APPNP",
                      "SGConv", "TAGConv", "GCN2Conv", "MixHopConv", "SSGConv", "GatedGraphConv")  # fmt: skip


def test_fused_path_is_taken_where_pyg_has_one() -> None:
    data = awkward_graph(2)
    for layer in PARTIAL_SUM_LAYERS:
        choices = run_threaded(build_any(f"layer:{layer}", data), data, 2, _layer_forward)["choices"]
        assert all("fused sparse" in how and "partial sums" in how for how in choices.values()), (layer, choices)
    for layer in ("GATConv", "TransformerConv", "GINEConv", "ChebConv", "FAConv", "SimpleConv/self_loop", "GCNConv/t2s"):
        choices = run_threaded(build_any(f"layer:{layer}", data), data, 2, _layer_forward)["choices"]
        assert all("on edge_index" in how and "every halo row" in how for how in choices.values()), (layer, choices)


# -- wrappers and PyG's ready models ---------------------------------------------------------------

H = 8


class _Wrapped(nn.Module):
    def __init__(self, d_in: int, n_cls: int, make) -> None:
        super().__init__()
        self.lin_in, self.c1, self.c2, self.lin = nn.Linear(d_in, H), make(), make(), nn.Linear(H, n_cls)

    def forward(self, x, edge_index):
        return self.lin(self.c2(F.relu(self.c1(self.lin_in(x), edge_index)), edge_index))


WRAPPERS = {
    "DirGNNConv(GCNConv)": lambda: gnn.DirGNNConv(gnn.GCNConv(H, H), alpha=0.3),
    "DirGNNConv(SAGEConv)": lambda: gnn.DirGNNConv(gnn.SAGEConv(H, H), alpha=0.6, root_weight=False),
    "DirGNNConv(GATConv)": lambda: gnn.DirGNNConv(gnn.GATConv(H, H), alpha=0.5),
    "AntiSymmetricConv": lambda: gnn.AntiSymmetricConv(H, num_iters=2),
}


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("name", list(WRAPPERS))
def test_wrappers_run_their_inner_layers_exactly(name: str, world_size: int) -> None:
    data = awkward_graph(world_size)
    torch.manual_seed(0)
    net = _Wrapped(data.num_features, 3, WRAPPERS[name]).double()
    ref = reference(net, data)
    for aggregation in ("auto", "edge_index"):
        assert_same(run_threaded(net, data, world_size, aggregation=aggregation), ref, what=f"{name} {aggregation}")


def _models():
    from torch_geometric.nn import models as m

    def classes(d):
        return int(d.y.max()) + 1

    return {
        "GCN(jk=cat)": lambda d: m.GCN(d.num_features, 16, 3, classes(d), jk="cat"),
        "GraphSAGE(jk=lstm)": lambda d: m.GraphSAGE(d.num_features, 16, 3, classes(d), jk="lstm"),
        "GIN(jk=max, layer norm per node)": lambda d: m.GIN(
            d.num_features, 16, 3, classes(d), jk="max", norm="layer_norm", norm_kwargs={"mode": "node"}
        ),
        "GAT(v2, heads 2)": lambda d: m.GAT(d.num_features, 16, 2, classes(d), v2=True, heads=2),
        "EdgeCNN": lambda d: m.EdgeCNN(d.num_features, 16, 2, classes(d)),
    }


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("name", list(_models()))
def test_pyg_ready_models(name: str, world_size: int) -> None:
    data = cora() if "GAT" in name else awkward_graph(world_size)
    torch.manual_seed(0)
    net = _models()[name](data).double()
    ref = reference(net, data)
    assert_same(run_threaded(net, data, world_size), ref, what=name)


def test_sixteen_bit_features_fall_back_and_stay_close() -> None:
    """bfloat16 activations: the fused kernel (bf16 on CPU) agrees with PyG's edge_index path in bf16."""
    data = awkward_graph(2, dtype=torch.float32)
    data.x = data.x.bfloat16()
    torch.manual_seed(0)
    net = build_any("gcn:2", data).bfloat16()
    fused = run_threaded(net, data, 2)
    plain = run_threaded(net, data, 2, aggregation="edge_index")
    torch.testing.assert_close(fused["out"].float(), plain["out"].float(), atol=0.05, rtol=0.05)
