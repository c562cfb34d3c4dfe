"""Layers that propagate several times: one exchange per step, quantized, counted and staled per step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric import nn as gnn

from lightning_halo.quant import row_nbytes
from tests.support.graphs import awkward_graph
from tests.support.threaded import run_threaded

H, K = 8, 3


class _APPNP(nn.Module):
    def __init__(self, d_in: int, cached_sgc: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(d_in, H)
        self.prop = gnn.SGConv(H, 3, K=K, cached=True) if cached_sgc else gnn.APPNP(K=K, alpha=0.1)
        self.out = nn.Identity() if cached_sgc else nn.Linear(H, 3)

    def forward(self, x, edge_index):
        return self.out(self.prop(F.relu(self.lin(x)), edge_index))


def _rows(rank: dict, halo_reduction: str) -> tuple[int, int]:
    """Rows one exchange sends and receives: the plan's, or the cover's (fewer)."""
    plan, cover = rank["plan"], rank["cover"]
    if halo_reduction == "none":
        return plan.num_send, plan.n_halo
    assert cover.block <= plan.n_halo
    return cover.num_send, cover.block


@pytest.mark.parametrize("halo_reduction", ["cover", "none"])
def test_every_step_is_one_exchange_counted_exactly_at_one_bit(halo_reduction: str) -> None:
    data = awkward_graph(3, dtype=torch.float32)
    got = run_threaded(_APPNP(data.num_features), data, 3, bits=1, steps=2, halo_reduction=halo_reduction)
    for rank in got["ranks"]:
        meter = rank["meter"]
        sent, received = _rows(rank, halo_reduction)
        assert rank["slots"] == [f"prop#{k}" for k in range(1, K + 1)]  # one training slot per step
        for k in range(1, K + 1):
            assert meter[(f"prop#{k}", "fwd")] == 2 * sent * row_nbytes(H, 1)
            assert meter[(f"prop#{k}", "bwd")] == 2 * received * row_nbytes(H, 1)


def test_pipelined_steps_are_stale_per_step() -> None:
    data = awkward_graph(2, dtype=torch.float32)
    modes = ["sync", "pipelined", "pipelined", "sync"]
    got = run_threaded(_APPNP(data.num_features), data, 2, steps=3, mode=lambda e: modes[e])
    for rank in got["ranks"]:
        assert rank["staleness"] == [1] * K  # epoch 2 used epoch 1's rows, at every step


@pytest.mark.parametrize("halo_reduction", ["cover", "none"])
def test_cached_layers_exchange_exactly_once(halo_reduction: str) -> None:
    """SGConv(cached=True) keeps the partition's exact result: 32-bit exchanges, at the first call only."""
    data = awkward_graph(2, dtype=torch.float32)
    got = run_threaded(_APPNP(data.num_features, cached_sgc=True), data, 2, bits=1, steps=3, halo_reduction=halo_reduction)
    for rank in got["ranks"]:
        meter = rank["meter"]
        sent, _ = _rows(rank, halo_reduction)
        assert rank["slots"] == []  # outside the training slots: never stale, never quantized
        for k in range(1, K + 1):
            assert meter[(f"prop#{k}", "fwd")] == sent * H * 4  # raw float32 rows, once
