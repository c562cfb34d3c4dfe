"""sparse_adjacency: fused-spmm input that equals message passing over the edge list."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv, GINConv, GraphConv, SAGEConv

from lightning_halo import build_halo_partitions, partition_graph, sparse_adjacency
from tests.support.graphs import awkward_graph


def _repeated_edges_graph(seed: int = 0) -> Data:
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, 40, (2, 400), generator=g)  # 400 draws over 1,600 pairs: many repeats
    ei = ei[:, ei[0] != ei[1]]  # GCN's self-loop rule differs between the two inputs; tested elsewhere
    return Data(x=torch.randn(45, 6, generator=g, dtype=torch.float64), edge_index=ei)  # 5 isolated nodes


@pytest.mark.parametrize(
    "make, reduce",
    [
        (lambda: SAGEConv(6, 4), "mean"),
        (lambda: SAGEConv(6, 4, aggr="max"), "max"),
        (lambda: SAGEConv(6, 4, aggr="min"), "min"),
        (lambda: SAGEConv(6, 4, aggr="sum"), "sum"),
        (lambda: GINConv(nn.Linear(6, 4)), "sum"),
        (lambda: GraphConv(6, 4), "sum"),
        (lambda: GCNConv(6, 4), "sum"),
    ],
)
def test_equals_edge_list_message_passing_with_repeated_edges(make, reduce) -> None:
    data = _repeated_edges_graph()
    assert data.edge_index.t().unique(dim=0).size(0) < data.edge_index.size(1), "the graph must repeat edges"
    torch.manual_seed(0)
    conv = make().double()
    x = data.x.clone().requires_grad_()
    adj = sparse_adjacency(data, reduce=reduce)
    assert adj.layout == torch.sparse_csr and adj.shape == (45, 45) and adj.dtype == torch.float64
    a, b = conv(x, data.edge_index), conv(x, adj)
    torch.testing.assert_close(b, a, atol=1e-12, rtol=1e-12)
    (ga,) = torch.autograd.grad(a.square().sum(), x)
    (gb,) = torch.autograd.grad(b.square().sum(), x)
    torch.testing.assert_close(gb, ga, atol=1e-12, rtol=1e-12)


def test_values_by_reduction() -> None:
    # target 0 gets 1->0 twice and 2->0 once; target 1 gets 0->1 once
    data = Data(edge_index=torch.tensor([[1, 2, 1, 0], [0, 0, 0, 1]]), num_nodes=3)
    dense = {r: sparse_adjacency(data, reduce=r).to_dense() for r in ("sum", "mean", "max")}
    assert dense["sum"].tolist() == [[0, 2, 1], [1, 0, 0], [0, 0, 0]]
    # spmm's mean divides by the 2 stored entries of row 0; the true mean divides by 3 edges
    torch.testing.assert_close(dense["mean"], torch.tensor([[0, 4 / 3, 2 / 3], [1, 0, 0], [0, 0, 0]]))
    assert dense["max"].tolist() == [[0, 1, 1], [1, 0, 0], [0, 0, 0]]
    assert sparse_adjacency(data).dtype == torch.float32  # no x: float32


def test_partition_shape_is_inner_by_inner_plus_halo() -> None:
    data = awkward_graph(3)
    parts = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, 3), 3)
    for part in parts:
        adj = sparse_adjacency(part, reduce="sum")
        n_in, n_halo = int(part.n_inner), int(part.n_halo)
        assert adj.shape == (n_in, n_in + n_halo) and adj.dtype == part.x.dtype
        assert int(adj.values().sum()) == part.edge_index.size(1)  # every edge counted, repeats included


def test_bad_input_is_named() -> None:
    data = Data(edge_index=torch.tensor([[0, 5], [1, 2]]), num_nodes=3)
    with pytest.raises(ValueError, match="outside the graph"):
        sparse_adjacency(data)
    with pytest.raises(ValueError, match="reduce must be"):
        sparse_adjacency(Data(edge_index=torch.tensor([[0], [1]]), num_nodes=2), reduce="add")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\[2, E\]"):
        sparse_adjacency(Data(num_nodes=2))
