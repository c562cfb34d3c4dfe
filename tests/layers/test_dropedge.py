"""lightning_halo.dropout_edge: every rank drops the edges a single-process run drops, and the
layers run exactly on the kept edges (ranks as threads; real processes in tests/strategy/test_dropedge.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv, SAGEConv

import lightning_halo
from lightning_halo.layers import UnsupportedEdgesError
from lightning_halo.layers.dropedge import (
    dropout_edge,
    edge_uniforms,
    occurrence,
    register_partition_edges,
    reset_dropout_edge,
)
from lightning_halo.partition import build_halo_partitions, partition_graph
from tests.support.graphs import awkward_graph, cora
from tests.support.threaded import reference, run_threaded


def _kept_global(edge_index: torch.Tensor, gid: torch.Tensor, mask: torch.Tensor) -> list[tuple[int, int]]:
    kept = gid[edge_index[:, mask]]
    return sorted(map(tuple, kept.t().tolist()))


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("undirected", [False, True])
def test_partitions_drop_the_edges_the_whole_graph_drops(world_size: int, undirected: bool) -> None:
    data = cora() if undirected else awkward_graph(world_size)  # repeated edges and self-loops in the awkward one
    parts = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, world_size), world_size)
    reset_dropout_edge()
    whole, whole_mask = dropout_edge(data.edge_index, p=0.4, force_undirected=undirected, seed=7)
    ids = torch.arange(data.num_nodes)
    got = []
    for part in parts:
        register_partition_edges(part.edge_index, part.global_id)
        reset_dropout_edge()
        kept, mask = dropout_edge(part.edge_index, p=0.4, force_undirected=undirected, seed=7)
        assert torch.equal(kept, part.edge_index[:, mask])
        got += _kept_global(part.edge_index, part.global_id, mask)
    assert sorted(got) == _kept_global(data.edge_index, ids, whole_mask)
    assert 0.5 < whole_mask.float().mean() < 0.7  # about 1 - p kept
    if undirected:  # u->v and v->u kept or dropped together
        pairs = set(_kept_global(data.edge_index, ids, whole_mask))
        assert all((v, u) in pairs for u, v in pairs)


def test_draws_differ_by_call_and_seed_and_repeat_after_a_reset() -> None:
    ei = cora().edge_index
    reset_dropout_edge()
    first, second = dropout_edge(ei, 0.5, seed=1)[1], dropout_edge(ei, 0.5, seed=1)[1]
    other_seed = dropout_edge(ei, 0.5, seed=2)[1]
    reset_dropout_edge()
    assert torch.equal(dropout_edge(ei, 0.5, seed=1)[1], first)
    assert not torch.equal(first, second) and not torch.equal(first, other_seed)
    kept, mask = dropout_edge(ei, 0.5, training=False)
    assert kept is ei and bool(mask.all())
    with pytest.raises(ValueError, match="between 0 and 1"):
        dropout_edge(ei, 1.0)


def test_occurrence_counts_repeated_edges_in_edge_order() -> None:
    src, dst = torch.tensor([3, 1, 3, 3, 1]), torch.tensor([2, 0, 2, 2, 1])
    assert occurrence(src, dst).tolist() == [0, 0, 1, 2, 0]
    u = edge_uniforms(src, dst, key=5)
    assert u[0] != u[2] and bool(((u >= 0) & (u < 1)).all())


class DropNet(nn.Module):
    """GCN (normalised over the kept edges) -> relu -> SAGE, both on the edges dropout_edge kept."""

    def __init__(self, d_in: int, n_cls: int, p: float = 0.3) -> None:
        super().__init__()
        self.conv1, self.conv2, self.p = GCNConv(d_in, 8), SAGEConv(8, n_cls), p

    def forward(self, x, edge_index):
        kept, _ = lightning_halo.dropout_edge(edge_index, p=self.p, training=self.training)
        return self.conv2(F.relu(self.conv1(x, kept)), kept)


def _drop_forward(model, batch):
    return model(batch.x, batch.edge_index)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("aggregation", ["auto", "edge_index"])
def test_layers_on_dropped_edges_equal_single_process(world_size: int, aggregation: str) -> None:
    data = awkward_graph(world_size)
    torch.manual_seed(0)
    model = DropNet(data.num_features, int(data.y.max()) + 1).double()

    def forward(net, batch):
        return _drop_forward(net, batch)

    def rank_forward(net, batch):  # each thread counts its own draws, from 0
        if not getattr(net, "_counted", False):
            reset_dropout_edge()
            net._counted = True
        return _drop_forward(net, batch)

    got = run_threaded(model, data, world_size, rank_forward, steps=3, aggregation=aggregation)
    reset_dropout_edge()
    ref = reference(model, data, forward, steps=3)
    torch.testing.assert_close(got["out"], ref["out"], atol=1e-9, rtol=1e-7)
    for k, g in ref["grad"].items():
        torch.testing.assert_close(got["grad"][k], g, atol=1e-9, rtol=1e-7, msg=lambda m: f"grad {k}: {m}")
    reset_dropout_edge()
    no_drop = reference(DropNet(data.num_features, int(data.y.max()) + 1, p=0.0).double(), data, forward)
    assert not torch.allclose(no_drop["out"], ref["out"])  # the drops matter: the test can fail


def test_pyg_dropout_edge_is_refused_naming_the_alternative() -> None:
    from torch_geometric.utils import dropout_edge as pyg_dropout_edge

    data = awkward_graph(2)
    torch.manual_seed(0)
    model = DropNet(data.num_features, 3).double()

    def forward(net, batch):
        kept, _ = pyg_dropout_edge(batch.edge_index, p=0.3)
        return net.conv2(net.conv1(batch.x, kept), kept)

    with pytest.raises(UnsupportedEdgesError, match="use lightning_halo.dropout_edge"):
        run_threaded(model, data, 2, forward)


def test_cached_gcn_on_dropped_edges_is_refused() -> None:
    data = awkward_graph(2)
    conv = GCNConv(data.num_features, 4, cached=True).double()

    def forward(net, batch):
        return net(batch.x, lightning_halo.dropout_edge(batch.edge_index, p=0.3)[0])

    with pytest.raises(Exception, match="cached=True"):
        run_threaded(conv, data, 2, forward)
