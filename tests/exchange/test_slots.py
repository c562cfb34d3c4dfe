"""The per-slot state machine in process: sync, stale (pipelined) and reuse (periodic), smoothing, checkpoints."""

from __future__ import annotations

import pytest
import torch

from lightning_halo.exchange import HaloExchangeError
from lightning_halo.exchange.slots import SlotTable
from tests.support.threaded import on_wires

N, D = 3, 2
BYTES = N * D * 4  # one exchange of raw float32 rows


def _counts(rank: int) -> tuple[list[int], list[int]]:
    """Two ranks, each sends the other N rows and receives N."""
    c = [0, N] if rank == 0 else [N, 0]
    return c, c


def _rows(rank: int, epoch: int) -> torch.Tensor:
    return torch.full((N, D), 10.0 * epoch + rank)


def _peer(rank: int, epoch: int) -> float:
    """The value the peer's rows of ``epoch`` hold."""
    return 10.0 * epoch + (1 - rank)


def _epochs(modes: list[str], smoothing: float = 0.0, keep_history: bool = True):
    """Every rank runs one forward and one backward exchange per epoch in the given modes."""

    def rank_fn(rank, wire):
        table, g = SlotTable(wire), torch.Generator().manual_seed(rank)
        table.set_smoothing(smoothing)
        table.set_history(keep_history)
        seen = []
        for epoch, mode in enumerate(modes):
            send = _rows(rank, epoch)
            slot = table.slot(0, "conv1", "in", send)
            halo = table.forward(slot, send, mode, 32, _counts(rank), epoch, g)
            grad = table.backward(slot, "conv1", -send, mode, 32, _counts(rank), epoch, g)
            bytes_now = sum(wire.meter.total.values())
            seen.append((float(halo[0, 0]), None if grad is None else float(grad[0, 0]), table.staleness(epoch)[0], bytes_now))
        table.flush()
        return seen, table

    return on_wires(2, rank_fn)


def test_sync_returns_this_epochs_rows_and_gradients() -> None:
    for rank, (seen, _) in enumerate(_epochs(["sync"] * 3)):
        assert [s[0] for s in seen] == [_peer(rank, e) for e in range(3)]
        assert [s[1] for s in seen] == [-_peer(rank, e) for e in range(3)]
        assert [s[2] for s in seen] == [0, 0, 0]
        assert [s[3] for s in seen] == [2 * BYTES, 4 * BYTES, 6 * BYTES]


def test_a_run_synchronous_throughout_keeps_no_rows_between_steps() -> None:
    for rank, (seen, table) in enumerate(_epochs(["sync"] * 3, keep_history=False)):
        assert [s[0] for s in seen] == [_peer(rank, e) for e in range(3)]
        assert [s[1] for s in seen] == [-_peer(rank, e) for e in range(3)]
        slot = table.slots[0]
        assert slot.halo is None and slot.grad is None and slot.fresh_epoch == 2
    # without history, a later stale epoch has no rows to reuse: it exchanges synchronously
    for rank, (seen, _) in enumerate(_epochs(["sync", "pipelined"], keep_history=False)):
        assert [s[0] for s in seen] == [_peer(rank, 0), _peer(rank, 1)]


def test_pipelined_uses_last_epochs_rows_while_this_epochs_travel_then_sync_is_fresh() -> None:
    for rank, (seen, table) in enumerate(_epochs(["sync", "pipelined", "pipelined", "sync"])):
        halos, grads, staleness, sent = zip(*seen)
        # epoch 1 still uses epoch 0's rows; epoch 2 those of epoch 1 (landed now); epoch 3 is fresh
        assert halos == (_peer(rank, 0), _peer(rank, 0), _peer(rank, 1), _peer(rank, 3))
        # owners apply the halo gradients one epoch late: epoch 1 gets epoch 0's, epoch 2 epoch 1's
        assert grads == (-_peer(rank, 0), -_peer(rank, 0), -_peer(rank, 1), -_peer(rank, 3))
        assert staleness == (0, 1, 1, 0)
        assert sent == (2 * BYTES, 4 * BYTES, 6 * BYTES, 8 * BYTES), "every epoch sends, stale ones asynchronously"
        assert table.slots[0].fwd_pending is None and table.slots[0].bwd_pending is None


def test_first_pipelined_epoch_without_rows_exchanges_synchronously() -> None:
    for rank, (seen, _) in enumerate(_epochs(["pipelined", "pipelined"])):
        assert [s[0] for s in seen] == [_peer(rank, 0), _peer(rank, 0)]


def test_periodic_sends_nothing_and_no_gradient_crosses() -> None:
    for rank, (seen, _) in enumerate(_epochs(["sync", "periodic", "periodic", "sync"])):
        halos, grads, staleness, sent = zip(*seen)
        assert halos == (_peer(rank, 0), _peer(rank, 0), _peer(rank, 0), _peer(rank, 3))
        assert grads == (-_peer(rank, 0), None, None, -_peer(rank, 3))
        assert staleness == (0, 1, 2, 0)
        assert sent == (2 * BYTES, 2 * BYTES, 2 * BYTES, 4 * BYTES)


def test_smoothing_averages_the_landed_rows_with_the_held_ones() -> None:
    m = 0.25
    for rank, (seen, table) in enumerate(_epochs(["sync", "pipelined", "pipelined"], smoothing=m)):
        landed_1 = m * _peer(rank, 0) + (1 - m) * _peer(rank, 1)  # epoch 1's rows, landing in epoch 2
        assert seen[2][0] == pytest.approx(landed_1)
        # flush lands epoch 2's rows into the slot the same way
        assert float(table.slots[0].halo[0, 0]) == pytest.approx(m * landed_1 + (1 - m) * _peer(rank, 2))


def test_a_slot_seeing_another_layer_or_width_is_refused() -> None:
    table = SlotTable(wire=None)  # type: ignore[arg-type]
    table.slot(0, "conv1", "in", torch.zeros(N, D))
    with pytest.raises(HaloExchangeError, match="same layers called in the same order"):
        table.slot(0, "conv2", "in", torch.zeros(N, D))
    with pytest.raises(HaloExchangeError, match="4 torch.float32 columns"):
        table.slot(0, "conv1", "in", torch.zeros(N, 4))


def test_state_dict_round_trip_resumes_the_same_stale_rows() -> None:
    (_, table0), _ = _epochs(["sync", "pipelined"])
    restored = SlotTable(wire=None)  # type: ignore[arg-type]
    restored.load_state_dict(table0.state_dict(), torch.device("cpu"))
    a, b = table0.slots[0], restored.slots[0]
    assert (a.layer, a.direction, a.d, a.dtype, a.fresh_epoch) == (b.layer, b.direction, b.d, b.dtype, b.fresh_epoch)
    assert torch.equal(a.halo, b.halo) and torch.equal(a.grad, b.grad)
    assert restored.staleness(5) == table0.staleness(5) == [5 - a.fresh_epoch]
