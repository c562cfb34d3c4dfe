"""Query-conditioned propagation (NBFNet-style states per query): what runs through the hooks, measured.

States laid out ``[N, B, d]`` (nodes first) in a layer with ``node_dim=0`` run exactly on
partitions; PyG's batched ``[B, N, d]`` (``node_dim=-2``) is refused with an error naming the
row count. docs/link-prediction.md states both.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric.nn import GCNConv, MessagePassing

from lightning_halo import register_layer
from tests.support.graphs import cora
from tests.support.threaded import reference, run_threaded


class NodeFirstConv(MessagePassing):
    """Sum of the sources' transformed states; states ``[N, B, d]``."""

    def __init__(self, d_in: int, d: int) -> None:
        super().__init__(aggr="add", node_dim=0)
        self.lin = nn.Linear(d_in, d)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.lin(x))


@pytest.fixture(autouse=True)
def _node_first_registered():
    """Registered for these tests only: a registration left behind would reach every later test that
    runs all supported layers (their workers cannot build this test's class)."""
    from lightning_halo.layers import registry

    register_layer(NodeFirstConv, "full")
    yield
    registry._REG.specs.pop(NodeFirstConv, None)


class QueryStates(nn.Module):
    """B queries, each a learnt vector broadcast over the nodes, propagated twice, averaged over queries."""

    def __init__(self, conv, num_features: int, d: int = 8, classes: int = 7, queries: int = 4, nodes_first: bool = True):
        super().__init__()
        self.nodes_first = nodes_first
        self.q = nn.Parameter(torch.randn(queries, d))
        self.lin_in, self.out = nn.Linear(num_features, d), nn.Linear(d, classes)
        self.conv1, self.conv2 = conv(d, d), conv(d, d)

    def forward(self, x, edge_index):
        h = self.lin_in(x)[None] * self.q[:, None]  # [B, n, d]
        if self.nodes_first:
            h = h.transpose(0, 1)  # [n, B, d]
        h = self.conv2(self.conv1(h, edge_index).relu(), edge_index)
        return self.out(h.mean(1 if self.nodes_first else 0))


@pytest.fixture(scope="module")
def data():
    return cora()


@pytest.mark.parametrize("world_size", [2, 3])
def test_nodes_first_query_states_are_exact(data, world_size) -> None:
    torch.manual_seed(0)
    model = QueryStates(NodeFirstConv, data.num_features).double()
    ref, got = reference(model, data), run_threaded(model, data, world_size)
    torch.testing.assert_close(got["out"], ref["out"], rtol=1e-10, atol=1e-12)
    for k, g in ref["grad"].items():
        torch.testing.assert_close(got["grad"][k], g, rtol=1e-10, atol=1e-12)
    assert sum(v for (_, t), v in got["meters"][0].items() if t == "fwd") > 0, "the states' halo rows travel"


def test_queries_first_states_are_refused_with_the_reason(data) -> None:
    torch.manual_seed(0)
    model = QueryStates(GCNConv, data.num_features, nodes_first=False).double()
    with pytest.raises(ValueError, match="got x with 4 rows"):
        run_threaded(model, data, 2)
