"""The state that checkpoints: generators seeded per rank, restored before or after a bind, foreign plans refused."""

from __future__ import annotations

import pytest
import torch

from lightning_halo.exchange import ExchangePlan, ExchangeState, HaloExchangeError, TrafficMeter
from lightning_halo.exchange.slots import SlotTable


def _plan(rank: int = 0, n_halo: int = 2, num_send: int = 2) -> ExchangePlan:
    return ExchangePlan(rank, 2, n_inner=3, n_halo=n_halo, send_index=torch.arange(num_send),
                        send_counts=(0, num_send) if rank == 0 else (num_send, 0),
                        recv_counts=(0, n_halo) if rank == 0 else (n_halo, 0))  # fmt: skip


def _state(seed: int = 1) -> ExchangeState:
    return ExchangeState(seed, SlotTable(wire=None), TrafficMeter())  # type: ignore[arg-type]


def test_generators_are_seeded_per_rank_at_the_first_bind_only() -> None:
    a, b = _state(), _state()
    a.bound({"in": _plan(0)})
    b.bound({"in": _plan(1)})
    assert not torch.equal(a.train_generator.get_state(), b.train_generator.get_state())
    draw = torch.rand(1, generator=a.train_generator)
    a.bound({"in": _plan(0)})  # a new partition of the same run continues the stream
    assert not torch.equal(torch.rand(1, generator=a.train_generator), draw)


def test_a_restored_state_is_applied_at_the_next_bind_and_checks_later_plans() -> None:
    a = _state()
    a.bound({"in": _plan(), "out": _plan(n_halo=1, num_send=1)})
    a.meter.add("conv", "fwd", 10, 40)
    saved = a.state_dict()
    assert saved["plans"] == {"in": (2, 2), "out": (1, 1)} and saved["rank"] == 0
    b = _state()
    b.load_state_dict(saved)
    assert torch.equal(b.train_generator.get_state(), a.train_generator.get_state())
    assert b.meter.total == a.meter.total
    b.bound({"in": _plan()})
    b.added("out", _plan(n_halo=1, num_send=1))  # the same shape: accepted
    c = _state()
    c.load_state_dict(saved)
    c.bound({"in": _plan()})
    with pytest.raises(HaloExchangeError, match="belongs to a different partition"):
        c.added("out", _plan(n_halo=3, num_send=1))


def test_a_state_of_another_partition_is_refused() -> None:
    a = _state()
    a.bound({"in": _plan()})
    b = _state()
    b.bound({"in": _plan(n_halo=5)})
    with pytest.raises(HaloExchangeError, match="2 halo rows, 2 sent rows; this partition has 5 and 2"):
        b.load_state_dict(a.state_dict())  # bound already: applied at once
