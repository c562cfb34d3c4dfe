"""Applying a LayerCall: features with their halo, the edges a layer gets, and its rewritten arguments."""

from __future__ import annotations

import torch
from torch_geometric import nn as gnn

from lightning_halo.exchange import HaloExchanger
from lightning_halo.layers.apply import LayerEdges, layer_edges, rewrite_arguments, with_halo
from lightning_halo.layers.call import build_call
from lightning_halo.layers.edges import PartitionEdges
from lightning_halo.layers.fused import FusedAdjacency
from lightning_halo.layers.registry import layer_spec
from lightning_halo.partition import build_halo_partitions
from tests.support.graphs import awkward_graph


def _fetch(rows: torch.Tensor) -> torch.Tensor:
    return rows[:2] + 100  # two made-up halo rows


def test_features_get_their_halo_rows_as_the_feed_takes_them() -> None:
    x = torch.arange(6.0).view(3, 2)
    full = with_halo(x, "full", _fetch)
    assert full.shape == (5, 2) and torch.equal(full[3:], x[:2] + 100)
    src, dst = with_halo(x, "bipartite", _fetch)
    assert torch.equal(src, full) and dst is x
    pair = with_halo((x, None), "bipartite", _fetch)
    assert torch.equal(pair[0], full) and pair[1] is None
    assert with_halo(x, "steps", _fetch) is x  # fetched before every propagation instead


def _setup(aggregation: str = "auto"):
    data = awkward_graph(1)
    part = build_halo_partitions(data, torch.zeros(data.num_nodes, dtype=torch.long), 1)[0]
    ex = HaloExchanger(None, bits=32)
    ex.bind(part)
    return part, ex, PartitionEdges(part, ex, ex.collectives)


def _edges(conv, part, ex, edges, aggregation="auto", **args):
    arguments = {"x": part.x, "edge_index": part.edge_index, **args}
    call = build_call("conv", conv, layer_spec(conv), arguments, edges, aggregation)
    return call, layer_edges(call, arguments["edge_index"], edges, ex.collectives, ex.plan(call.direction))


def test_a_normalising_fused_layer_gets_one_adjacency_kept_per_edge_set() -> None:
    part, ex, edges = _setup()
    conv = gnn.GCNConv(8, 4).double()
    call, first = _edges(conv, part, ex, edges)
    assert isinstance(first.edge_index, FusedAdjacency) and first.weight is None
    _, again = _edges(conv, part, ex, edges)
    assert again.edge_index is first.edge_index, "normalised and built once"
    _, plain = _edges(conv, part, ex, edges, aggregation="edge_index")
    assert plain.edge_index.dim() == 2 and plain.weight is not None and plain.weight.dtype == torch.float64


def test_edge_index_layers_get_the_canonical_edges_flipped_under_target_to_source() -> None:
    part, ex, edges = _setup()
    _, got = _edges(gnn.GATConv(8, 4).double(), part, ex, edges)
    assert got.edge_index is part.edge_index and got.weight is None
    call, flipped = _edges(gnn.GATConv(8, 4, flow="target_to_source").double(), part, ex, edges)
    assert torch.equal(flipped.edge_index, call.edges.edge_index.flip(0)) and call.direction == "out"


def test_arguments_get_the_edges_or_a_placeholder_for_renormalising_layers() -> None:
    part, ex, edges = _setup()
    gcn = gnn.GCNConv(8, 4).double()
    call, got = _edges(gcn, part, ex, edges)
    arguments = {"x": part.x, "edge_index": part.edge_index, "edge_weight": None}
    assert rewrite_arguments(call, layer_spec(gcn), arguments, got, takes_weight=True) is None
    assert arguments["edge_index"] is got.edge_index and arguments["edge_weight"] is None
    sgc = gnn.SGConv(8, 4, K=2).double()
    call, got = _edges(sgc, part, ex, edges)
    arguments = {"x": part.x, "edge_index": part.edge_index, "edge_weight": torch.ones(3)}
    propagate = rewrite_arguments(call, layer_spec(sgc), arguments, got, takes_weight=True)
    assert propagate == got and isinstance(propagate, LayerEdges)
    assert arguments["edge_index"].shape == (2, 0) and arguments["edge_weight"] is None


def test_covered_edges_of_a_call_without_a_fused_adjacency_is_an_internal_error() -> None:
    from types import SimpleNamespace

    import pytest

    from lightning_halo.errors import InternalError
    from lightning_halo.layers.apply import covered_edges

    call = SimpleNamespace(aggregation=SimpleNamespace(reduce=None))  # call.py decides partial sums only with a reduce
    with pytest.raises(InternalError, match="partial sums"):
        covered_edges(call, LayerEdges(torch.zeros(2, 0, dtype=torch.long)), None)  # type: ignore[arg-type]
