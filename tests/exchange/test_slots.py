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


# ---------------------------------------------------------------- adaptive: per-slot decisions from drift
def _scales(rank: int, slot: int, epoch: int) -> float:
    """Rows of each slot: slot 0 changes by 1 % per epoch on both ranks; slot 1 likewise, except
    that rank 1's rows jump by 50 % in epoch 3 (so only rank 1 sees its drift)."""
    base = 1.0 + 0.01 * epoch
    return base * (1.5 if slot == 1 and rank == 1 and epoch >= 3 else 1.0) * (rank + 1)


def _adaptive_epochs(epochs: int, bound: float = 0.05, sync_at: tuple[int, ...] = (), posted: bool = False):
    def rank_fn(rank, wire):
        table, g = SlotTable(wire), torch.Generator().manual_seed(rank)
        table.set_history(True)
        table.set_drift_bound(bound)
        seen = []
        for epoch in range(epochs):
            mode = "sync" if epoch == 0 or epoch in sync_at else "adaptive"
            if mode == "adaptive":
                table.decide(epoch)
            step = []
            for k, name in enumerate(("conv1", "conv2")):
                send = torch.full((N, D), _scales(rank, k, epoch))
                slot = table.slot(k, name, "in", send)
                halo = table.forward(slot, send, mode, 32, _counts(rank), epoch, g)
                step.append((float(halo[0, 0]), slot.decision if mode == "adaptive" else "sync"))
            if posted:  # what the exchanger does at the loss: the next decision travels during backward
                table.post_agreement()
            for k, name in enumerate(("conv1", "conv2")):
                table.backward(table.slots[k], name, -torch.full((N, D), _scales(rank, k, epoch)), mode, 32,
                               _counts(rank), epoch, g)  # fmt: skip
            seen.append(step)
        table.flush()
        return seen, table

    return on_wires(2, rank_fn)


def test_adaptive_runs_a_slot_stale_while_its_rows_barely_move_and_every_rank_agrees() -> None:
    (seen0, t0), (seen1, t1) = _adaptive_epochs(6)
    decisions = [[d for _, d in step] for step in seen0]
    assert decisions == [[d for _, d in step] for step in seen1], "every rank takes the same decision"
    # epoch 1: nothing measured yet -> sync; from epoch 2 slot 0 drifts 1 % -> stale;
    # slot 1 drifts 50 % on rank 1 in epoch 3 -> synchronous in epoch 4 on *both* ranks, stale again in 5
    assert decisions == [
        ["sync", "sync"], ["sync", "sync"], ["pipelined", "pipelined"], ["pipelined", "pipelined"],
        ["pipelined", "sync"], ["pipelined", "pipelined"],
    ]  # fmt: skip
    for rank, seen in enumerate((seen0, seen1)):
        peer = 1 - rank
        for epoch, step in enumerate(seen):
            for k, (halo, decision) in enumerate(step):
                used = epoch - 1 if decision == "pipelined" else epoch  # stale: last epoch's rows
                assert halo == pytest.approx(_scales(peer, k, used)), (rank, epoch, k)
    drift = t0.decisions()[1][1]
    assert drift == pytest.approx(0.01 / 1.03), "epoch 5 decided on the drift from epoch 3 to 4 (the same on both ranks)"
    # the agreement is one 16-byte all-reduce in each of the 5 adaptive epochs, counted as aux traffic
    assert sum(v for (layer, kind), v in t0.wire.meter.total.items() if kind == "aux") == 5 * 2 * 8


def test_a_wait_floor_keeps_a_slot_synchronous_unless_every_rank_waited_enough() -> None:
    """With a wait bound the agreement also carries each slot's share of the step its exchanges waited; a slot goes
    stale only where the least share over the ranks reaches the bound (what going stale saves on the slowest)."""
    shares = {0: (0.3, 0.5), 1: (0.2, 0.05)}  # rank -> (slot 0, slot 1)

    def rank_fn(rank, wire):
        table = SlotTable(wire)
        table.set_drift_bound(1.0)
        table.set_wait_bound(0.1)
        for k, name in enumerate(("conv1", "conv2")):
            slot = table.slot(k, name, "in", torch.ones(N, D))
            slot.drift, slot.wait_share = 0.01, shares[rank][k]
        table.decide(1)
        return [d for d, _ in table.decisions()], table.waits(), dict(wire.meter.total)

    (d0, w0, m0), (d1, w1, _) = on_wires(2, rank_fn)
    assert d0 == d1 == ["pipelined", "sync"] and w0 == w1 == [0.2, 0.05]
    assert m0[("adaptive", "aux")] == 2 * 2 * 8, "drifts and waits: one all-reduce, 8 bytes each per slot"


def test_the_wait_share_is_what_a_slots_synchronous_exchanges_waited_of_the_step() -> None:
    """Rank 1 arrives 0.2 s late at each exchange: rank 0 spends most of its step waiting for it, rank 1 little.
    A slot's first step is not measured (its peers' first steps are slow for reasons of their own)."""
    import time

    def rank_fn(rank, wire):
        table, g = SlotTable(wire), torch.Generator()
        table.set_drift_bound(0.1)
        table.set_wait_bound(0.05)
        shares = []
        for epoch in range(2):
            table.start_step()
            send = torch.ones(N, D)
            slot = table.slot(0, "conv1", "in", send)
            if rank == 1:
                time.sleep(0.2)
            table.forward(slot, send, "sync", 32, _counts(rank), epoch, g)
            if rank == 1:
                time.sleep(0.2)
            table.backward(slot, "conv1", send, "sync", 32, _counts(rank), epoch, g)
            table.end_step()
            shares.append(slot.wait_share)
        return shares

    late, waits_for_late = on_wires(2, rank_fn)[::-1]
    assert late[0] == waits_for_late[0] == 0.0, "the first step measures nothing"
    assert waits_for_late[1] > 0.5 and late[1] < waits_for_late[1] / 2, (waits_for_late, late)


def test_an_agreement_posted_after_the_forward_decides_as_one_at_the_epochs_start() -> None:
    """Posted while backward runs (and superseded by a later step's, or waited for by a flush), the agreement gives
    the decisions and drifts the blocking one gives, with one all-reduce per step."""
    (blocking, t_b), _ = _adaptive_epochs(6)
    (posted, t_p), _ = _adaptive_epochs(6, posted=True)
    assert posted == blocking and t_p.decisions() == t_b.decisions()
    aux = sum(v for (layer, kind), v in t_p.wire.meter.total.items() if kind == "aux")
    assert aux == 6 * 2 * 8, "one 16-byte all-reduce posted in each of the 6 steps"
    (sync_at, _), _ = _adaptive_epochs(6, sync_at=(3,), posted=True)
    (sync_at_b, _), _ = _adaptive_epochs(6, sync_at=(3,))
    assert sync_at == sync_at_b, "a sync epoch's posted agreement is superseded or used as a blocking one would be"


def test_adaptive_with_a_tight_bound_is_synchronous_and_sync_epochs_stay_synchronous() -> None:
    for seen, _ in _adaptive_epochs(5, bound=0.001):
        assert {d for step in seen for _, d in step} == {"sync"}
    for seen, _ in _adaptive_epochs(5, sync_at=(3,)):
        assert [d for _, d in seen[3]] == ["sync", "sync"]


def test_adaptive_state_round_trips_and_other_modes_keep_nothing() -> None:
    (_, table0), _ = _adaptive_epochs(4)
    restored = SlotTable(wire=None)  # type: ignore[arg-type]
    restored.load_state_dict(table0.state_dict(), torch.device("cpu"))
    for a, b in zip(table0.slots, restored.slots):
        assert torch.equal(a.sent, b.sent) and a.drift == b.drift
    restored.set_drift_bound(None)
    assert all(s.sent is None and s.drift == -1.0 for s in restored.slots)


# ---------------------------------------------------------------- adaptive bit widths (bits="adaptive")
WD = 64  # row width: each bit width has its own row bytes (13, 21, 37, 69)


def _width_rows(rank: int, slot: int, epoch: int, jump: bool) -> torch.Tensor:
    """Slot 0's rows sit in a narrow band around 5 (little relative noise at 1 bit); slot 1's spread around 0
    (much). With ``jump``, rank 1's slot-0 rows spread too from epoch 3: only that rank's signal changes."""
    g = torch.Generator().manual_seed(1000 * rank + 10 * slot + epoch)
    noise = torch.randn(N, WD, generator=g, dtype=torch.float64)
    if slot == 0 and jump and rank == 1 and epoch >= 3:
        return 10.0 * noise
    return 5.0 + 0.01 * noise if slot == 0 else noise


def _width_epochs(epochs: int, jump: bool = False, budget: float = 1.93, progress=None, patience: int = 2):
    def rank_fn(rank, wire):
        table, g = SlotTable(wire), torch.Generator().manual_seed(rank)
        table.set_widths((1, 2, 4, 8), budget, ("fwd", "bwd"))
        if progress is not None:  # a monitored metric: this rank's value after epoch e is progress(rank, e)
            table.set_plateau("max", patience)
        seen = []
        for epoch in range(epochs):
            wire.meter.reset_epoch()
            table.decide_widths(epoch)
            for k, name in enumerate(("conv1", "conv2")):
                send = _width_rows(rank, k, epoch, jump)
                slot = table.slot(k, name, "in", send)
                table.forward(slot, send, "sync", "adaptive", _counts(rank), epoch, g)
                table.backward(slot, name, 1e-6 * send, "sync", "adaptive", _counts(rank), epoch, g)
            seen.append((table.widths(), dict(wire.meter.epoch)))
            if progress is not None:
                table.observe(progress(rank, epoch))
        return seen, table

    return on_wires(2, rank_fn)


def test_adaptive_widths_are_agreed_and_follow_the_variance_bound() -> None:
    (seen0, _), (seen1, _) = _width_epochs(4)
    assert [w for w, _ in seen0] == [w for w, _ in seen1], "every rank takes the same widths"
    # epoch 0: nothing measured, all at 1 bit; then the spread slot's rows and gradients take the budget
    # (1.93x: exactly both at 4 bits), the narrow band's stay at 1 bit
    assert seen0[0][0] == [{"fwd": 1, "bwd": 1}, {"fwd": 1, "bwd": 1}]
    assert seen0[1][0] == [{"fwd": 1, "bwd": 1}, {"fwd": 4, "bwd": 4}], seen0[1][0]


def test_adaptive_bytes_are_exactly_the_chosen_widths_within_the_budget() -> None:
    from lightning_halo.quant import row_nbytes

    for rank, (seen, _) in enumerate(_width_epochs(4)):
        for epoch, (widths, counts) in enumerate(seen):
            for k, name in enumerate(("conv1", "conv2")):
                for d in ("fwd", "bwd"):
                    assert counts[(name, d)] == N * row_nbytes(WD, widths[k][d]), (rank, epoch, name, d)
            train = sum(v for (_, d), v in counts.items() if d in ("fwd", "bwd"))
            assert train <= 1.93 * 4 * N * row_nbytes(WD, 1)
            # one all-reduce per decided epoch, counted as aux traffic: [slots, directions, 3] signals, [slots, 2]
            # reaches and the monitored metric's [sum, count], float64
            assert counts.get(("bits", "aux"), 0) == (0 if epoch == 0 else (2 * 2 * 3 + 2 * 2 + 2) * 8)


def test_one_ranks_signal_moves_every_ranks_widths_the_same_way() -> None:
    (still, _), _ = _width_epochs(6)
    (moved0, _), (moved1, _) = _width_epochs(6, jump=True)
    assert [w for w, _ in moved0] == [w for w, _ in moved1]
    assert [w for w, _ in moved0[:4]] == [w for w, _ in still[:4]], "the same until the change is measured"
    assert moved0[4][0][0]["fwd"] > still[4][0][0]["fwd"], "rank 1's spread rows of epoch 3 widen slot 0 on both ranks"


def test_the_budget_opens_when_the_agreed_metric_plateaus() -> None:
    # the ranks' values differ (rank 0 stalls after epoch 1, rank 1 after epoch 2): their mean decides, so both
    # ranks take the same step. Means after epochs 0-4: 0.1, 0.2, 0.25, 0.25, 0.25; epoch e's decision reads the
    # value after epoch e - 1, so epochs 4 and 5 see no improvement and, with patience 2, the budget opens at 5
    values = {0: [0.2, 0.3, 0.3, 0.3, 0.3, 0.3], 1: [0.0, 0.1, 0.2, 0.2, 0.2, 0.2]}
    (seen0, t0), (seen1, t1) = _width_epochs(7, progress=lambda rank, e: values[rank][min(e, 5)])
    assert [w for w, _ in seen0] == [w for w, _ in seen1], "every rank takes the same widths"
    narrow = [{"fwd": 1, "bwd": 1}, {"fwd": 1, "bwd": 1}]
    assert all(w == narrow for w, _ in seen0[:5]), [w for w, _ in seen0]
    (free, _), _ = _width_epochs(7)  # no monitor: the budget is open from the first decision
    assert seen0[5][0] == free[5][0] != narrow and seen0[6][0] == free[6][0]
    assert t0.plateau == t1.plateau and t0.plateau.open and t0.plateau.best == 0.25 and t0.budget_now == 1.93


def test_a_monitor_that_keeps_improving_keeps_the_narrowest_widths_and_their_bytes() -> None:
    from lightning_halo.quant import row_nbytes

    (seen, table), _ = _width_epochs(5, progress=lambda rank, e: e + rank)
    assert not table.plateau.open and table.budget_now == 1.0
    for widths, counts in seen:
        assert widths == [{"fwd": 1, "bwd": 1}, {"fwd": 1, "bwd": 1}]
        assert all(counts[(name, d)] == N * row_nbytes(WD, 1) for name in ("conv1", "conv2") for d in ("fwd", "bwd"))


def test_a_trial_that_improves_nothing_gives_the_budget_back_for_good() -> None:
    from lightning_halo.quant import row_nbytes

    # the agreed mean rises to 0.25 after epoch 2 and stays there: the decisions of epochs 4-5 see no improvement
    # (patience 2), so the budget is on trial from epoch 5; epochs 6-7 see none either, so from epoch 7 on every
    # exchange is back at 1 bit, with 1-bit bytes, and a later improvement does not reopen it
    values = [0.1, 0.2, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.9]
    (seen0, t0), (seen1, t1) = _width_epochs(10, progress=lambda rank, e: values[min(e, 8)])
    assert [w for w, _ in seen0] == [w for w, _ in seen1], "every rank takes the same widths"
    narrow = [{"fwd": 1, "bwd": 1}, {"fwd": 1, "bwd": 1}]
    (free, _), _ = _width_epochs(10)
    assert [w == narrow for w, _ in seen0] == [True] * 5 + [False] * 2 + [True] * 3, [w for w, _ in seen0]
    assert seen0[5][0] == free[5][0] and seen0[6][0] == free[6][0]
    for widths, counts in seen0[7:]:
        assert all(counts[(name, d)] == N * row_nbytes(WD, 1) for name in ("conv1", "conv2") for d in ("fwd", "bwd"))
    # the decision of epoch 7 closes it (one all-reduce); closed, nothing is left to agree on
    assert [counts.get(("bits", "aux"), 0) > 0 for _, counts in seen0[6:]] == [True, True, False, False]
    assert t0.plateau == t1.plateau and t0.plateau.phase == "closed" and t0.budget_now == 1.0
    assert not t0.measuring and t0.noise() == [{}, {}], "no signal measured, no noise reported"


def test_rows_are_measured_only_where_the_next_decision_can_open_the_budget(monkeypatch) -> None:
    import lightning_halo.exchange.slots as slots

    calls: list[int] = []
    measure = slots.signal_terms
    monkeypatch.setattr(slots, "signal_terms", lambda rows: calls.append(1) or measure(rows))
    _width_epochs(4)  # no monitor: every exchange, both directions, every epoch, on both ranks
    assert len(calls) == 2 * 4 * 2 * 2
    calls.clear()
    (_, table), _ = _width_epochs(4, progress=lambda rank, e: e + rank)  # improving, patience 2: never
    assert calls == [] and not table.measuring
    # stale once (patience 2): the next value may open the trial, so epoch 3's rows are measured for it
    values = [0.1, 0.2, 0.2, 0.2]
    (_, table), _ = _width_epochs(4, progress=lambda rank, e: values[e])
    assert len(calls) == 2 * 1 * 2 * 2 and table.measuring and table.plateau.stale == 1


def test_a_trial_that_improves_the_metric_keeps_the_budget_for_good() -> None:
    # as above, but the value after epoch 5 beats 0.25: the decision of epoch 6 keeps the budget, and later
    # values that never improve again do not close it
    values = [0.1, 0.2, 0.25, 0.25, 0.25, 0.3, 0.3, 0.3, 0.3]
    (seen, table), _ = _width_epochs(10, progress=lambda rank, e: values[min(e, 8)])
    (free, _), _ = _width_epochs(10)
    assert [w for w, _ in seen[5:]] == [w for w, _ in free[5:]]
    assert table.plateau.phase == "open" and table.plateau.best == 0.3 and table.budget_now == 1.93


def test_the_plateau_rule_step_by_step() -> None:
    from lightning_halo.quant.allocate import Plateau, plateau_step

    def run(values, mode="max", patience=2):
        s, phases = Plateau(), []
        for v in values:
            s = plateau_step(s, v, mode, patience)
            phases.append(s.phase)
        return s, phases

    assert run([1.0, 0.9, 0.8, 0.7, 0.6], mode="min")[1] == ["narrow"] * 5, "a falling loss keeps improving"
    assert run([1.0, 1.0, 1.0, 1.0, 1.0])[1] == ["narrow", "narrow", "trial", "trial", "closed"], "strictly better"
    assert run([1.0, float("nan"), float("nan"), 2.0, 0.0, 0.0])[1] == ["narrow", "narrow", "trial", "open", "open", "open"]
    s, _ = run([0.5, 0.4, 0.4, 0.4, 0.4])
    assert s == Plateau(best=0.5, stale=2, phase="closed") and not s.open
    assert run([0.5, 0.4, 0.4], patience=1)[1] == ["narrow", "trial", "closed"]


def test_a_checkpoint_from_before_the_trial_rule_resumes_and_a_damaged_one_is_refused() -> None:
    table = SlotTable(wire=None)  # type: ignore[arg-type]
    table.set_widths((1, 2, 4, 8), 1.93, ("fwd", "bwd"))
    table.set_plateau("max", 3)
    table.restore_plateau({"best": 0.7, "stale": 3, "open": True, "pending": None})  # it opened, and stayed open
    assert table.plateau.phase == "open" and table.budget_now == 1.93
    table.restore_plateau({"best": 0.7, "stale": 1, "open": False, "pending": 0.6})
    assert table.plateau.phase == "narrow" and table.budget_now == 1.0
    with pytest.raises(ValueError, match="plateau phase 'ajar'.*damaged"):
        table.restore_plateau({"best": 0.7, "stale": 1, "phase": "ajar", "pending": None})


def test_the_plateau_and_the_value_not_yet_agreed_round_trip() -> None:
    (_, table0), _ = _width_epochs(4, progress=lambda rank, e: [0.5, 0.4, 0.4, 0.4][e], patience=5)
    state = table0.plateau_state()
    assert state == {"best": 0.5, "stale": 2, "phase": "narrow", "pending": 0.4}
    restored = SlotTable(wire=None)  # type: ignore[arg-type]
    restored.set_plateau("max", 5)
    restored.restore_plateau(state)
    assert restored.plateau == table0.plateau and restored.plateau_state() == state


def test_adaptive_width_state_round_trips() -> None:
    (_, table0), _ = _width_epochs(3)
    table0.slots[0].signal = {"fwd": torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)}
    table0.slots[1].reach = (2.5, 7.0)
    restored = SlotTable(wire=None)  # type: ignore[arg-type]
    restored.set_widths((1, 2, 4, 8), 1.93, ("fwd", "bwd"))
    restored.load_state_dict(table0.state_dict(), torch.device("cpu"))
    assert restored.widths() == table0.widths() and restored.slots[0].signal["fwd"].tolist() == [1.0, 2.0, 3.0]
    assert restored.slots[1].reach == (2.5, 7.0) and restored.noise() == table0.noise()


# the reach each rank gives its two slots: (W, N) of the edges that read them (rank 1's slot 1 has none known)
REACH = {(0, 0): (3.0, 40.0), (1, 0): (5.0, 60.0), (0, 1): (0.5, 40.0), (1, 1): (0.0, 0.0)}


def test_a_target_widens_only_what_reaches_the_outputs_above_it_and_all_ranks_agree() -> None:
    """Each group's output noise is the codec's bound times its weight from the ranks' summed reaches: W/N for halo
    rows, n/N for gradients; the width is the narrowest whose noise meets the target (bytes to spare)."""
    from lightning_halo.exchange.slots import group_weight
    from lightning_halo.quant.allocate import GroupSignal, output_variance, signal_of

    target, epochs, sent = 0.02, 3, {}

    def rank_fn(rank, wire):
        table, g = SlotTable(wire), torch.Generator().manual_seed(rank)
        table.set_widths((1, 2, 4, 8), 8.0, ("fwd", "bwd"), target)
        seen = []
        for epoch in range(epochs):
            table.decide_widths(epoch)
            seen.append((table.widths(), table.noise()))
            for k, name in enumerate(("conv1", "conv2")):
                send = _width_rows(rank, 1, epoch + 10 * k, False)  # spread rows: much relative noise at 1 bit
                slot = table.slot(k, name, "in", send, reach=REACH[(rank, k)])
                table.forward(slot, send, "sync", "adaptive", _counts(rank), epoch, g)
                table.backward(slot, name, 1e-6 * send, "sync", "adaptive", _counts(rank), epoch, g)
                sent[(rank, epoch, k)] = send
        return seen

    seen0, seen1 = on_wires(2, rank_fn)
    assert seen0 == seen1, "every rank takes the same widths and sees the same noise"
    for epoch in range(1, epochs):
        for k in range(2):
            rows = [sent[(r, epoch - 1, k)] for r in range(2)]
            w = sum(REACH[(r, k)][0] for r in range(2))
            outputs = sum(REACH[(r, k)][1] for r in range(2))
            for d, scale in (("fwd", 1.0), ("bwd", 1e-6)):
                r_, e_ = (sum(v) for v in zip(*(signal_of(scale * x) for x in rows)))
                g = GroupSignal(r_, e_, 2 * N, WD, 8, group_weight(d, False, 2 * N, w, outputs))
                want = next((b for b in (1, 2, 4, 8) if output_variance(g, b) <= target), 8)
                widths, noise = seen0[epoch]
                assert widths[k][d] == want, (epoch, k, d, widths)
                assert noise[k][d] == pytest.approx(output_variance(g, want)), (epoch, k, d)
    # slot 1's rows reach the outputs with W/N = 0.5/40, their gradients with n/N = 6/40, at the same relative
    # variance: the weights alone separate their widths
    assert seen0[1][0][1]["fwd"] < seen0[1][0][1]["bwd"], seen0[1][0]
