"""The propagate pre-hook's pieces: propagations counted against the kind, each step's halo fetched."""

from __future__ import annotations

import pytest
import torch
from torch_geometric import nn as gnn

from lightning_halo import UnsupportedLayerError
from lightning_halo.exchange import HaloExchanger
from lightning_halo.layers.call import build_call
from lightning_halo.layers.edges import PartitionEdges
from lightning_halo.layers.propagate import count_propagation, step_inputs, with_halo_along
from lightning_halo.layers.registry import layer_spec
from lightning_halo.partition import build_halo_partitions
from tests.support.graphs import awkward_graph


def _call(conv, aggregation="auto"):
    data = awkward_graph(1)
    part = build_halo_partitions(data, torch.zeros(data.num_nodes, dtype=torch.long), 1)[0]
    ex = HaloExchanger(None, bits=32)
    ex.bind(part)
    edges = PartitionEdges(part, ex, ex.collectives)
    arguments = {"x": part.x, "edge_index": part.edge_index}
    return part, build_call("conv", conv, layer_spec(conv), arguments, edges, aggregation)


def test_more_propagations_than_the_kind_declares_are_refused() -> None:
    _, call = _call(gnn.SAGEConv(8, 4).double())
    count_propagation(call, "bipartite", 1)
    with pytest.raises(UnsupportedLayerError, match="called propagate 2 times.*register_layer\\(SAGEConv, 'steps'\\)"):
        count_propagation(call, "bipartite", 2)
    _, steps = _call(gnn.APPNP(K=3, alpha=0.1))
    count_propagation(steps, "steps", 50)  # any number


def test_the_halo_is_appended_along_the_node_dimension() -> None:
    t = torch.arange(12.0).view(2, 3, 2)  # [stacks, nodes, features]
    full = with_halo_along(t, -2, lambda rows: rows[:1] * 0 - 1)
    assert full.shape == (2, 4, 2) and torch.equal(full[:, :3], t) and (full[:, 3] == -1).all()


def test_each_step_reads_its_sources_with_their_halo() -> None:
    part, call = _call(gnn.APPNP(K=2, alpha=0.1), aggregation="edge_index")
    n = int(part.n_inner)
    fetched = []

    def fetch(rows, step):
        fetched.append(step)
        return rows[:0]

    h = torch.randn(n, 4, dtype=torch.float64)
    ei, size, kwargs = step_inputs(call, gnn.APPNP(K=2, alpha=0.1), "conv#1", part.edge_index, {"x": h}, fetch)
    assert fetched == ["conv#1"] and size == (call.edges.n_src, n)
    src, dst = kwargs["x"]
    assert torch.equal(src, h) and dst is h
    with pytest.raises(ValueError, match="propagated `x` with 3 rows"):
        step_inputs(call, gnn.APPNP(K=2, alpha=0.1), "conv#1", part.edge_index, {"x": h[:3]}, fetch)
