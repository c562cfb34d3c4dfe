"""Where a layer call takes halo partial sums, and the adjacency that reads them."""

from __future__ import annotations

import pytest
import torch

from lightning_halo.layers.fused import FusedAdjacency
from lightning_halo.layers.reduction import check_halo_reduction, choose_reduction, operator_entries
from lightning_halo.layers.registry import layer_spec

OK = dict(option="cover", world_size=2, direction="in", subset=False, user_sparse=False, reduce="sum", linear=True)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({}, ""),
        ({"reduce": "mean"}, ""),
        ({"option": "none"}, "halo_reduction='none'"),
        ({"world_size": 1}, "one process"),
        ({"reduce": None}, "not on the fused path"),
        ({"reduce": "max"}, "max aggregation is not linear"),
        ({"linear": False}, "non-linear transform"),
        ({"direction": "out"}, "reversed edges"),
        ({"subset": True}, "dropout_edge"),
        ({"user_sparse": True}, "sparse adjacency"),
        ({"stored_input": True}, "input's halo is stored"),
    ],
)
def test_partial_sums_only_where_exact(change: dict, why: str) -> None:
    choice = choose_reduction(**{**OK, **change})
    assert choice.cover == (why == "")
    assert why in choice.why


def test_the_option_is_checked() -> None:
    check_halo_reduction("cover")
    with pytest.raises(ValueError, match="halo_reduction='vertex'.*'cover', 'none'"):
        check_halo_reduction("vertex")


def test_which_layers_are_linear_before_their_aggregation() -> None:
    from torch_geometric import nn as gnn

    assert layer_spec(gnn.GCNConv(4, 4)).linear_before_aggregation(gnn.GCNConv(4, 4))
    assert layer_spec(gnn.SAGEConv(4, 4)).linear_before_aggregation(gnn.SAGEConv(4, 4))
    projected = gnn.SAGEConv(4, 4, project=True)  # relu(lin(x)) before aggregating: not linear
    assert not layer_spec(projected).linear_before_aggregation(projected)
    gat = gnn.GATConv(4, 4)
    assert not layer_spec(gat).linear_before_aggregation(gat)


def test_operator_entries_divide_mean_by_the_row_and_operators_skip_it() -> None:
    adj = FusedAdjacency.build(torch.tensor([[0, 1, 2, 2], [0, 0, 0, 1]]), None, 2, 3, "mean", torch.float64)
    row, col, val = operator_entries(adj, "mean", 0, 2)
    assert row.tolist() == [0, 0, 0, 1] and col.tolist() == [0, 1, 2, 2]
    assert torch.allclose(val, torch.tensor([1 / 3, 1 / 3, 1 / 3, 1.0], dtype=torch.float64))
    x = torch.randn(3, 2, dtype=torch.float64)
    op = FusedAdjacency.build(torch.stack([col, row]), val, 2, 3, "sum", torch.float64).as_operator()
    torch.testing.assert_close(torch.sparse.mm(op, x, "mean"), torch.sparse.mm(adj, x, "mean"))
    with pytest.raises(ValueError, match="linear operator"):
        op.matmul_reduce(x, "max")


class _OnInputs(torch.nn.Module):
    """GCN straight on batch.x (its halo is stored: nothing crosses), then GCN on computed rows."""

    def __init__(self, d_in: int) -> None:
        super().__init__()
        from torch_geometric import nn as gnn

        self.conv1, self.conv2 = gnn.GCNConv(d_in, 8), gnn.GCNConv(8, 3)

    def forward(self, x, edge_index):
        return self.conv2(torch.relu(self.conv1(x, edge_index)), edge_index)


def test_a_layer_on_the_stored_input_features_takes_rows_the_next_takes_partial_sums() -> None:
    from tests.support.graphs import awkward_graph
    from tests.support.threaded import assert_same, plain_forward, reference, run_threaded

    data = awkward_graph(2)
    net = _OnInputs(data.num_features).to(data.x.dtype)
    got = run_threaded(net, data, 2)
    assert_same(got, reference(net, data, plain_forward), what="GCN on the input features, 2 ranks")
    choices = got["choices"]
    assert "stored in the partition (nothing crosses)" in choices["conv1"] and "partial sums" not in choices["conv1"]
    assert "partial sums" in choices["conv2"]
    for rank in got["ranks"]:
        kinds = {kind for layer, kind in rank["meter"] if layer == "conv1"}
        assert kinds <= {"aux"}, kinds  # the degrees, once; its rows are the partition's
