"""PyG's quantile aggregations on partitions: a call whose first node has no message gives PyG's quantiles."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.nn.aggr import MedianAggregation, MultiAggregation, QuantileAggregation

from lightning_halo.layers.aggregations import QuantileGuard, find_quantile_aggregations


def _lower_quantile(x: torch.Tensor, index: torch.Tensor, n: int, q: float) -> torch.Tensor:
    """Each node's ``q``-quantile of its messages (PyG's "lower" interpolation), 0 for a node without any."""
    out = torch.zeros(n, x.size(1), dtype=x.dtype)
    for i in range(n):
        rows = x[index == i]
        if len(rows):
            out[i] = rows.sort(dim=0).values[int(q * (len(rows) - 1))]
    return out


@pytest.mark.parametrize("index", [[1, 1, 2, 2, 2, 4], [], [0, 3, 3]], ids=["first node empty", "no message", "first node fed"])
def test_a_guarded_median_is_each_nodes_median_whichever_node_is_empty(index: list[int]) -> None:
    torch.manual_seed(0)
    index_t = torch.tensor(index, dtype=torch.long)
    x = torch.randn(len(index), 3, dtype=torch.float64, requires_grad=True)
    for aggr, q in [(MedianAggregation(), 0.5), (QuantileAggregation(0.25, interpolation="lower"), 0.25)]:
        guard = QuantileGuard(aggr, lambda: True).install()
        try:
            got = aggr(x, index_t, dim_size=5)
        finally:
            guard.remove()
        torch.testing.assert_close(got, _lower_quantile(x.detach(), index_t, 5, q))
        if len(index):
            got.sum().backward()  # the padded row gets no gradient; every message its own
            assert x.grad is not None and x.grad.shape == x.shape
            x.grad = None


def test_the_guard_finds_quantiles_inside_multi_aggregations_and_steps_aside_when_inactive() -> None:
    multi = MultiAggregation(["mean", MedianAggregation(), QuantileAggregation([0.2, 0.8])])
    assert [type(m).__name__ for m in find_quantile_aggregations(multi)] == ["MedianAggregation", "QuantileAggregation"]
    median = MedianAggregation()
    guard = QuantileGuard(median, lambda: False).install()
    x, index = torch.randn(4, 2), torch.tensor([0, 0, 1, 1])
    torch.testing.assert_close(median(x, index, dim_size=2), _lower_quantile(x, index, 2, 0.5))
    guard.remove()
