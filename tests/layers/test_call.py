"""The stages that build a LayerCall, each on its own (on one rank: the partition is the whole graph)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch_geometric import nn as gnn

from lightning_halo import UnsupportedEdgesError, UnsupportedLayerError, sparse_adjacency
from lightning_halo.exchange import HaloExchanger
from lightning_halo.layers.call import (
    AggregationChoice,
    LayerCall,
    aligned_edge_arguments,
    build_call,
    check_node_features,
    choose_aggregation,
    choose_feed,
    choose_normalization,
    edge_weight,
    resolve_edges,
    validate_call,
)
from lightning_halo.layers.edges import PartitionEdges
from lightning_halo.layers.registry import layer_spec
from lightning_halo.partition import build_halo_partitions
from tests.support.graphs import awkward_graph

T2S = "target_to_source"


@pytest.fixture
def part_and_edges():
    data = awkward_graph(1)
    part = build_halo_partitions(data, torch.zeros(data.num_nodes, dtype=torch.long), 1)[0]
    ex = HaloExchanger(None, bits=32)
    ex.bind(part)
    return part, PartitionEdges(part, ex, ex.collectives)


def test_validate_refuses_compiling_and_explicit_sizes() -> None:
    validate_call("conv", {"x": 1, "size": None}, compiling=False)
    with pytest.raises(UnsupportedLayerError, match="torch.compile"):
        validate_call("conv", {}, compiling=True)
    with pytest.raises(ValueError, match="sets sizes itself"):
        validate_call("conv", {"size": (3, 3)}, compiling=False)


def test_resolve_edges_names_the_set_and_flips_for_target_to_source(part_and_edges) -> None:
    part, edges = part_and_edges
    own = resolve_edges(edges, part.edge_index, "conv", flipped=False)
    assert own is not None and own.given.direction == own.target.direction == "in" and own.sparse_values is None
    flipped = resolve_edges(edges, part.edge_index, "conv", flipped=True)
    assert flipped is not None and flipped.given.direction == "in" and flipped.target.direction == "out"
    back = resolve_edges(edges, part.edge_index.flip(0), "conv", flipped=True)
    assert back is not None and back.given.direction == "out" and back.target.direction == "in"
    adj = sparse_adjacency(part)
    sparse = resolve_edges(edges, adj, "conv", flipped=False)
    assert sparse is not None and sparse.sparse_values is not None
    assert sparse.sparse_values.numel() == adj.values().numel()
    with pytest.raises(UnsupportedLayerError, match="does not run on a sparse adjacency"):
        resolve_edges(edges, adj, "conv", flipped=True)
    assert resolve_edges(edges, part.edge_index[:, 1:], "conv", flipped=False) is None  # one process: runs as written


def test_edge_arguments_follow_the_reversed_edges(part_and_edges) -> None:
    part, edges = part_and_edges
    ein, eout = edges.sets["in"], edges.out_edges("conv")
    args = {"x": part.x, "edge_index": part.edge_index, "edge_attr": part.edge_attr, "edge_weight": None}
    assert aligned_edge_arguments(args, ein, ein, "conv") == {}
    aligned = aligned_edge_arguments(args, ein, eout, "conv")
    assert set(aligned) == {"edge_attr"} and aligned["edge_attr"] is eout.attrs["edge_attr"]
    with pytest.raises(UnsupportedEdgesError, match="cannot reorder it along the reversed edges"):
        aligned_edge_arguments({**args, "edge_attr": part.edge_attr.clone()}, ein, eout, "conv")


def test_feed_follows_the_kind_and_the_flow() -> None:
    sage, gcn, appnp = gnn.SAGEConv(4, 4), gnn.GCNConv(4, 4), gnn.APPNP(K=2, alpha=0.1)
    assert choose_feed(layer_spec(sage), sage, flipped=False) == "bipartite"
    assert choose_feed(layer_spec(sage), sage, flipped=True) == "full"
    assert choose_feed(layer_spec(gcn), gcn, flipped=False) == "full"
    assert choose_feed(layer_spec(appnp), appnp, flipped=False) == "steps"
    self_loop = gnn.SimpleConv(combine_root="self_loop")
    assert choose_feed(layer_spec(self_loop), self_loop, flipped=False) == "full"


def test_node_features_must_be_the_inner_rows_in_a_form_the_feed_takes() -> None:
    x = torch.zeros(5, 3, dtype=torch.float64)
    assert check_node_features("conv", "SAGEConv", x, "bipartite", 5, -2) == torch.float64
    assert check_node_features("conv", "SAGEConv", (x, None), "bipartite", 5, -2) == torch.float64
    assert check_node_features("conv", "GCNConv", x.long(), "full", 5, -2) == torch.get_default_dtype()
    assert check_node_features("conv", "APPNP", torch.zeros(2, 5, 3), "steps", 5, -2) == torch.float32
    with pytest.raises(ValueError, match="got x with 4 rows, but this rank owns 5 nodes"):
        check_node_features("conv", "GCNConv", x[:4], "full", 5, -2)
    with pytest.raises(UnsupportedLayerError, match="does not take bipartite input here"):
        check_node_features("conv", "GCNConv", (x, x), "full", 5, -2)
    with pytest.raises(TypeError, match="must be a tensor"):
        check_node_features("conv", "GCNConv", [1, 2, 3], "full", 5, -2)


def test_normalization_is_the_layers_own_or_refused() -> None:
    gcn, plain, cheb = gnn.GCNConv(4, 4, improved=True), gnn.GCNConv(4, 4, normalize=False), gnn.ChebConv(4, 4, K=2)
    norm = choose_normalization("conv", layer_spec(gcn), gcn, {}, None, flipped=False)
    assert norm is not None and norm.rule == "gcn" and norm.improved and norm.add_self_loops
    assert choose_normalization("conv", layer_spec(plain), plain, {}, None, flipped=False) is None
    learned = torch.ones(3, requires_grad=True)
    with pytest.raises(UnsupportedLayerError, match="learned edge weights with a normalisation"):
        choose_normalization("conv", layer_spec(gcn), gcn, {}, learned, flipped=False)
    with pytest.raises(UnsupportedLayerError, match="ChebConv with flow='target_to_source'"):
        choose_normalization("conv", layer_spec(cheb), cheb, {}, None, flipped=True)


def _aggregation(module, option="auto", weight=None, flipped=False, on_cuda=False) -> AggregationChoice:
    return choose_aggregation(option, "conv", layer_spec(module), module, weight, flipped, on_cuda)


def test_aggregation_is_fused_where_pyg_can_and_says_why_not() -> None:
    assert _aggregation(gnn.GCNConv(4, 4)) == AggregationChoice("sum")
    assert _aggregation(gnn.SAGEConv(4, 4, aggr="max")).reduce == "max"
    assert _aggregation(gnn.GCNConv(4, 4), option="edge_index").why == "aggregation='edge_index'"
    assert "no fused sparse aggregation" in _aggregation(gnn.GATConv(4, 4)).why
    assert "target_to_source" in _aggregation(gnn.GCNConv(4, 4), flipped=True).why
    assert "need gradients" in _aggregation(gnn.GraphConv(4, 4), weight=torch.ones(2, requires_grad=True)).why
    assert "with edge weights" in _aggregation(gnn.GraphConv(4, 4, aggr="max"), weight=torch.ones(2)).why
    assert "no CUDA kernel" in _aggregation(gnn.SAGEConv(4, 4, aggr="min"), on_cuda=True).why
    with pytest.raises(UnsupportedLayerError, match="cannot use the fused sparse aggregation"):
        _aggregation(gnn.GATConv(4, 4), option="sparse")


def test_edge_weight_is_the_sparse_values_or_the_weight_argument(part_and_edges) -> None:
    part, edges = part_and_edges
    spec = layer_spec(gnn.GCNConv(4, 4))
    w = torch.rand(part.edge_index.size(1))
    given = resolve_edges(edges, part.edge_index, "conv", flipped=False)
    assert edge_weight(spec, {"edge_weight": w}, given) is w
    sparse = resolve_edges(edges, sparse_adjacency(part), "conv", flipped=False)
    assert edge_weight(spec, {"edge_weight": w}, sparse) is sparse.sparse_values


def test_build_call_runs_every_stage_into_a_frozen_call(part_and_edges) -> None:
    part, edges = part_and_edges
    conv = gnn.GCNConv(8, 4, cached=True).double()
    call = build_call("convs.0", conv, layer_spec(conv), {"x": part.x, "edge_index": part.edge_index}, edges, "auto")
    assert isinstance(call, LayerCall) and call.direction == "in" and call.feed == "full" and call.exact
    assert call.keep_rows == call.n_inner == int(part.n_inner) and call.n_dst == call.edges.n_src
    assert call.describe() == (
        "fused sparse aggregation (sum, cached CSR and transpose), gcn normalisation with global degrees"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.feed = "bipartite"  # type: ignore[misc]
    sage = gnn.SAGEConv(8, 4, flow=T2S).double()
    flipped = build_call("s", sage, layer_spec(sage), {"x": part.x, "edge_index": part.edge_index}, edges, "auto")
    assert flipped.direction == "out" and flipped.feed == "full" and flipped.describe().endswith("[reversed edges]")
    unknown = {"x": part.x, "edge_index": part.edge_index[:, 1:]}
    assert build_call("s", sage, layer_spec(sage), unknown, edges, "auto") is None
