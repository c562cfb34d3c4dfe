r"""Per-slot state of the training exchanges, in the modes of :data:`~lightning_halo.exchange.policy.MODE_TABLE`.

The :math:`k`-th halo exchange of a training step is *slot* :math:`k`; its state lives across
epochs: the rows and gradients a stale mode uses instead of this epoch's, and the exchanges
still in flight. In an ``"adaptive"`` epoch each slot runs ``"pipelined"`` or ``"sync"``, as
:meth:`SlotTable.decide` agreed at the epoch's start from the drift of the rows every rank sent
in the previous epoch. With adaptive bit widths (``bits="adaptive"``) each slot and direction
sends at the width :meth:`SlotTable.decide_widths` agreed at the epoch's start from the codec's
variance bound of what every rank sent in the previous epoch (:mod:`lightning_halo.quant.allocate`).

Example:
    >>> from lightning_halo.exchange.meter import TrafficMeter
    >>> from lightning_halo.exchange.wire import SoloTransport, Wire
    >>> table, rows, gen = SlotTable(Wire(SoloTransport(), TrafficMeter())), torch.ones(2, 3), torch.Generator()
    >>> slot = table.slot(0, "conv1", "in", rows)
    >>> halo = table.forward(slot, rows, "pipelined", 32, ((2,), (2,)), 0, gen)  # nothing held yet: sync
    >>> table.staleness(epoch=3)
    [3]
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union, get_args

import torch
from torch import Tensor

from lightning_halo.exchange.plan import Direction
from lightning_halo.exchange.policy import Mode
from lightning_halo.exchange.wire import HaloExchangeError, Pending, PendingMax, Wire
from lightning_halo.quant.allocate import (
    GroupSignal,
    MonitorMode,
    Plateau,
    PlateauPhase,
    choose_widths,
    is_adaptive,
    output_variance,
    plateau_step,
    signal_terms,
)

#: A slot's bit width as the exchanger gives it: a number, or ``"adaptive"`` (the slot's agreed width).
Bits = Union[int, str]
#: The directions of a slot, in the order of the agreement's tensor.
DIRECTIONS = ("fwd", "bwd")
#: ``"adaptive"`` measures the drift of a slot's sent rows on every k-th row, at most this many.
DRIFT_ROWS = 256
#: ``"adaptive"`` with a wait threshold: the weight of the old wait share when a synchronous step measures a new one.
WAIT_SMOOTHING = 0.5


@dataclass
class Slot:
    """State of one training exchange, kept across epochs."""

    layer: str
    direction: Direction
    d: int
    dtype: torch.dtype
    halo: Optional[Tensor] = None  # rows to use when the step is pipelined/periodic
    grad: Optional[Tensor] = None  # halo gradients received for my sent rows, [num_send, d]
    fwd_pending: Optional[Pending] = None
    bwd_pending: Optional[Pending] = None
    fresh_epoch: int = -1  # epoch whose rows `halo` holds (staleness = now - fresh_epoch)
    partial: bool = False  # it carries partial sums (lightning_halo.exchange.cover), not the plan's rows
    # adaptive: my rows of the last step, the relative change measured against them in the last
    # step (-1: not measured yet), and what this epoch does (agreed by every rank in `decide`)
    sent: Optional[Tensor] = None
    drift: float = -1.0
    decision: Mode = "sync"
    agreed_drift: float = float("inf")
    # adaptive with a wait threshold: seconds this step's synchronous exchanges of the slot waited and how many
    # of its two directions were synchronous; the share of the step they waited in the last step where both
    # were (what `decide` agrees on), and the agreed share (the least over the ranks)
    wait: float = 0.0
    synced: int = 0
    wait_share: float = 0.0
    agreed_wait: float = 0.0
    # adaptive bit widths: this epoch's width per direction (agreed in `decide_widths`; absent: the narrowest), and
    # what this rank sent since the last decision, per direction: float64 [variance numerator, energy, rows] on the
    # rows' device (summed there, read once per decision)
    widths: dict[str, int] = field(default_factory=dict)
    signal: dict[str, Tensor] = field(default_factory=dict)
    # this rank's [W, N] of the slot's edges (quant.allocate.halo_reach and its outputs; N = 0: not known), and the
    # output noise the last decision left per direction (what the metrics show)
    reach: tuple[float, float] = (0.0, 0.0)
    noise: dict[str, float] = field(default_factory=dict)


class SlotTable:
    """The slots of one rank, driven by :class:`~lightning_halo.exchange.HaloExchanger`.

    Args:
        wire (Wire): sends and receives the rows.
    """

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.slots: list[Slot] = []
        self.smoothing = 0.0
        self.keep_history = True
        self.drift_bound: Optional[float] = None
        self.wait_bound: Optional[float] = None
        self._step_start: Optional[float] = None
        self._agreement: Optional[PendingMax] = None  # the next decision's all-reduce, posted after a forward
        self._agreed: Optional[Tensor] = None  # ... and its result, where a flush waited for it
        self._decided_epoch = -1
        self.bit_choices: tuple[int, ...] = ()  # adaptive widths: the choices (empty: every width is fixed)
        self.bit_budget = 1.0
        self.bit_target = 0.0
        self.adaptive_directions: tuple[str, ...] = ()
        self._widths_epoch = -1
        # the budget opens when a monitored metric stops improving (``None``: open from the first decision)
        self._plateau_rule: Optional[tuple[MonitorMode, int]] = None
        self.plateau = Plateau()
        self._progress: Optional[float] = None  # this rank's last validation value, agreed at the next decision
        self._signal_device = torch.device("cpu")  # where the rows were measured (the all-reduce's device)

    def set_widths(
        self, choices: tuple[int, ...], budget: float, directions: tuple[str, ...], target: float = 0.0
    ) -> None:
        """Adaptive bit widths for ``directions`` (of :data:`DIRECTIONS`): chosen from ``choices`` under ``budget``
        down to the output noise ``target`` (checked by the exchanger,
        :func:`~lightning_halo.quant.allocate.check_bit_choices`; ``target=0``: widen while the budget allows)."""
        self.bit_choices, self.bit_budget, self.bit_target = tuple(choices), float(budget), float(target)
        self.adaptive_directions = tuple(d for d in DIRECTIONS if d in directions)

    def set_plateau(self, mode: Optional[MonitorMode], patience: int = 1) -> None:
        """Open the byte budget only once a monitored metric plateaus (``mode=None``: from the first decision;
        checked by the exchanger, :func:`~lightning_halo.quant.allocate.check_bit_monitor`)."""
        self._plateau_rule = None if mode is None else (mode, int(patience))

    def observe(self, value: float) -> None:
        """This rank's latest value of the monitored metric: agreed (the mean over the ranks) at the next
        :meth:`decide_widths`, which steps the plateau (:func:`~lightning_halo.quant.allocate.plateau_step`)."""
        self._progress = float(value)

    def plateau_state(self) -> dict[str, Any]:
        """The plateau and the value not yet agreed, for a checkpoint (:meth:`restore_plateau`)."""
        p = self.plateau
        return {"best": p.best, "stale": p.stale, "phase": p.phase, "pending": self._progress}

    def restore_plateau(self, state: dict[str, Any]) -> None:
        best, pending = state.get("best"), state.get("pending")
        # checkpoints from before the trial rule hold "open": a budget that opened stayed open
        phase = state.get("phase", "open" if state.get("open") else "narrow")
        if phase not in get_args(PlateauPhase):
            raise ValueError(f"the checkpoint's bit plateau phase {phase!r} is not one of {get_args(PlateauPhase)}; "
                             "the checkpoint is damaged or from a newer lightning-halo")  # fmt: skip
        self.plateau = Plateau(None if best is None else float(best), int(state.get("stale", 0)), phase)
        self._progress = None if pending is None else float(pending)

    @property
    def budget_now(self) -> float:
        """The budget the next decision spends: ``bit_budget``, or ``1`` (the narrowest widths) while a monitored
        metric still improves or after a trial of the budget failed to improve it."""
        return self.bit_budget if self._plateau_rule is None or self.plateau.open else 1.0

    @property
    def measuring(self) -> bool:
        """Whether this epoch's sent rows and gradients are measured for the next decision: always, except under
        a monitored metric whose next value cannot open the budget (narrow, with more than one check of patience
        left) or once a trial gave the budget back (:func:`~lightning_halo.quant.allocate.plateau_step`). A
        decision at the narrowest widths needs no signal, so those epochs cost what a fixed width costs."""
        if self._plateau_rule is None:
            return True
        p, patience = self.plateau, self._plateau_rule[1]
        return p.open or (p.phase == "narrow" and p.stale >= patience - 1)

    def width(self, slot: Optional[Slot], direction: str, bits: Bits) -> int:
        """The width a slot's ``direction`` sends at: ``bits``, or where that is ``"adaptive"`` the slot's agreed
        width (outside the slots, ``slot=None``: the widest choice)."""
        if not is_adaptive(bits):
            return int(bits)
        if slot is None:
            return self.bit_choices[-1]
        return slot.widths.get(direction, self.bit_choices[0])

    def _measure_width(self, slot: Slot, rows: Tensor, direction: str) -> None:
        terms = signal_terms(rows)
        slot.signal[direction] = terms if direction not in slot.signal else slot.signal[direction] + terms
        self._signal_device = terms.device

    def decide_widths(self, epoch: int) -> None:
        """Agree, once per epoch, every slot's width per adaptive direction (one all-reduce, ``aux`` traffic).

        The signals every rank measured since the last decision (the variance numerator and energy of the
        rows it sent, and their count) and each slot's reach (:func:`~lightning_halo.quant.allocate.halo_reach`
        of its edges, and the outputs it counts) are summed over the ranks; every rank then runs the same greedy
        choice (:func:`~lightning_halo.quant.allocate.choose_widths`) on the same numbers, so all take the same
        widths. A slot and direction that sent nothing anywhere since then keeps its width and is left out.

        The weight of a group's relative variance in its layer's outputs (:func:`group_weight`) is ``W/N`` for
        halo rows, and ``n/N`` (each of its ``n`` rows lands on one of ``N`` rows unscaled) for partial sums
        and for gradients.
        """
        if self._widths_epoch == epoch or not self.adaptive_directions or not self.slots:
            return
        self._widths_epoch = epoch
        dirs = self.adaptive_directions
        if self.plateau.phase == "closed":  # agreed on every rank: nothing left to decide, no all-reduce
            for s in self.slots:
                s.noise = {}  # nothing measured since: no noise to report
            return
        device = self._signal_device  # NCCL reduces device tensors only
        zero = torch.zeros(3, dtype=torch.float64, device=device)
        local = torch.stack([torch.stack([s.signal.get(d, zero).to(device) for d in dirs]) for s in self.slots])
        reach = torch.tensor([s.reach for s in self.slots], dtype=torch.float64, device=device)
        # the monitored metric's value and whether this rank has one, summed with the rest: its mean over the ranks
        seen = self._progress is not None
        progress = torch.tensor([self._progress if seen else 0.0, float(seen)], dtype=torch.float64, device=device)
        self._progress = None
        agreed = self.wire.all_sum(torch.cat([local.reshape(-1), reach.reshape(-1), progress]), "bits").cpu()
        signals, reaches = agreed[: local.numel()].view(local.shape), agreed[local.numel() : -2].view(-1, 2)
        total, count = agreed[-2:].tolist()
        if self._plateau_rule is not None and count > 0:
            self.plateau = plateau_step(self.plateau, total / count, *self._plateau_rule)
        groups, where = [], []
        for i, s in enumerate(self.slots):
            w, outputs = reaches[i].tolist()
            for j, d in enumerate(dirs):
                r, e, n = signals[i, j].tolist()
                if n > 0:
                    weight = group_weight(d, s.partial, n, w, outputs)
                    size = torch.empty((), dtype=s.dtype).element_size()
                    groups.append(GroupSignal(r, e, int(round(n)), s.d, size, weight))
                    where.append((s, d))
            s.signal = {}
        if self._plateau_rule is not None and not self.plateau.open:
            # the narrowest widths everywhere, also where nothing was measured (a closing trial's wide widths);
            # no noise is reported where nothing was measured
            for s in self.slots:
                s.widths.update({d: self.bit_choices[0] for d in dirs})
                s.noise = {}
        for (s, d), g, b in zip(where, groups, choose_widths(groups, self.bit_choices, self.budget_now, self.bit_target)):
            s.widths[d], s.noise[d] = b, output_variance(g, b)

    def widths(self) -> list[dict[str, int]]:
        """Per slot: the width each adaptive direction sends at this epoch."""
        return [{d: self.width(s, d, "adaptive") for d in self.adaptive_directions} for s in self.slots]

    def noise(self) -> list[dict[str, float]]:
        """Per slot: the output noise (:func:`~lightning_halo.quant.allocate.output_variance`) each adaptive
        direction's agreed width leaves, as of the last decision (absent before the first measured one)."""
        return [dict(s.noise) for s in self.slots]

    def set_history(self, keep: bool) -> None:
        """Whether a synchronous step keeps its rows and gradients for later stale steps.

        A run that is synchronous throughout never reads them: not keeping them frees each
        layer's halo rows and gradients between steps (``halo`` and ``grad`` stay ``None``, so a
        later stale step, e.g. after a switch of mode, starts with a synchronous exchange).
        """
        self.keep_history = bool(keep)

    def set_smoothing(self, smoothing: float) -> None:
        """Weight of the old rows/gradients when a stale exchange lands (``0``: keep only the new).

        Checked where the option is given (:class:`~lightning_halo.exchange.policy.HaloPolicy`).
        """
        self.smoothing = float(smoothing)

    def set_drift_bound(self, bound: Optional[float]) -> None:
        """``"adaptive"``'s threshold (``None``: another mode; nothing is measured or kept)."""
        self.drift_bound = None if bound is None else float(bound)
        if bound is None:
            self._take_agreement()  # posted in an adaptive epoch that a schedule change ended: waited for, dropped
            for s in self.slots:
                s.sent, s.drift, s.decision, s.wait_share = None, -1.0, "sync", 0.0

    def set_wait_bound(self, bound: Optional[float]) -> None:
        """``"adaptive"``'s wait floor (``None`` or ``0``: the drift alone decides; checked by the policy)."""
        self.wait_bound = None if bound is None else float(bound)

    def start_step(self) -> None:
        """A training step begins: the time its exchanges wait is measured against it (adaptive only)."""
        if self.drift_bound is None:
            return
        self._step_start = time.perf_counter()
        for s in self.slots:
            s.wait, s.synced = 0.0, 0

    def end_step(self) -> None:
        """The step's backward is done: each slot whose exchanges were synchronous both ways in it takes the share of
        the step (forward and backward) they waited, averaged with the shares before (:data:`WAIT_SMOOTHING`); a
        stale step keeps the share of the last synchronous one, and a slot's first step (no drift measured yet; its
        peers' first steps are slow for reasons of their own) none."""
        if self._step_start is None:
            return
        step, self._step_start = time.perf_counter() - self._step_start, None
        for s in self.slots:
            # not a slot's first step (its peers' first steps build plans and caches: they arrive late)
            if s.synced >= 2 and step > 0 and s.drift >= 0:
                # a moving average over the synchronous steps: one slow step of a peer must not flip the decision
                share = s.wait / step
                s.wait_share = share if s.wait_share <= 0 else WAIT_SMOOTHING * s.wait_share + (1 - WAIT_SMOOTHING) * share

    def _timed(self, slot: Optional[Slot], exchange: Any) -> Tensor:
        """Run a synchronous ``exchange()``; in an adaptive run add the time it waited for the peers to ``slot``."""
        if slot is None or self._step_start is None:
            return exchange()
        before = self.wire.meter.epoch_wait_s
        out = exchange()
        slot.wait += self.wire.meter.epoch_wait_s - before
        slot.synced += 1
        return out

    def decide(self, epoch: int) -> None:
        r"""Agree, once per epoch, which slots run stale (``"pipelined"``) in this ``"adaptive"`` epoch.

        A slot's local drift is :math:`\lVert S_{t-1} - S_{t-2} \rVert_F / \lVert S_{t-2} \rVert_F`
        over the rows :math:`S` this rank sent for it in the last two steps (every k-th row, at
        most :data:`DRIFT_ROWS` of them), on the entries non-zero in both (measured in
        :meth:`forward`, before quantization). One all-reduce of the per-slot maxima over all
        ranks (exact, so every rank gets the same value) decides: stale when the largest drift
        is at most :attr:`drift_bound`, synchronous otherwise (also while unmeasured). With a
        :attr:`wait_bound`, the same all-reduce carries each slot's share of the step its last
        synchronous exchanges waited (:meth:`end_step`; negated, so the maximum is the least share
        over the ranks: what going stale saves on the slowest rank), and a slot runs stale only where
        that share is at least the bound.
        """
        if self._decided_epoch == epoch or self.drift_bound is None or not self.slots:
            return
        self._decided_epoch = epoch
        agreed = self._take_agreement()
        if agreed is None:  # nothing posted since the last step (the first one, or a resumed run): agree now
            agreed = self.wire.finish_max(self.wire.post_max(self._decision_values(), "adaptive", async_op=False))
        n, values = len(self.slots), agreed.tolist()
        shares = [-w for w in values[n:]] or [math.inf] * n
        for s, d, w in zip(self.slots, values[:n], shares):
            s.agreed_drift, s.agreed_wait = d, w
            s.decision = "pipelined" if d <= self.drift_bound and w >= (self.wait_bound or 0.0) else "sync"

    def _decision_values(self) -> Tensor:
        """Per slot the drift, and with a wait bound the negated wait share (its maximum is the least share)."""
        device = next((s.sent.device for s in self.slots if s.sent is not None), torch.device("cpu"))
        drifts = [s.drift if s.drift >= 0 else math.inf for s in self.slots]  # NaN fails `>= 0`: synchronous
        waits = [-s.wait_share for s in self.slots] if self.wait_bound else []
        return torch.tensor(drifts + waits, dtype=torch.float64, device=device)  # NCCL reduces device tensors only

    def post_agreement(self) -> None:
        """Post the next decision's all-reduce once the step's forward has measured every drift (from the strategy's
        loss, before backward): it completes while the step goes on, and :meth:`decide` only reads it. Every rank
        posts at the same point of the same step, so the collectives stay in order. The wait shares it carries are
        those of the steps before this one (this step's is measured after its backward)."""
        if self.drift_bound is None or not self.slots:
            return
        self._take_agreement()  # an earlier step's of this epoch: superseded
        self._agreement = self.wire.post_max(self._decision_values(), "adaptive")

    def _take_agreement(self) -> Optional[Tensor]:
        """The posted agreement's result (waiting for it), or None where none was posted."""
        pending, self._agreement = self._agreement, None
        if pending is not None:
            return self.wire.finish_max(pending)
        agreed, self._agreed = self._agreed, None
        return agreed

    def decisions(self) -> list[tuple[Mode, float]]:
        """Per slot: what the current ``"adaptive"`` epoch does, and the agreed drift that decided it."""
        return [(s.decision, s.agreed_drift) for s in self.slots]

    def waits(self) -> list[float]:
        """Per slot: the agreed share of the step its synchronous exchanges waited (``inf`` without a wait bound)."""
        return [s.agreed_wait for s in self.slots]

    def _measure(self, slot: Slot, send: Tensor) -> None:
        """The relative change of my sent rows since the last step (kept for :meth:`decide`).

        Only entries non-zero in both steps count: dropout draws a new mask every step (and ReLU
        zeroes entries near 0), and a change of mask is noise of the same law in stale and fresh
        rows, not drift of the representation; measured over all entries, dropout 0.5 alone
        reads as a change of more than 100 %.
        """
        # Every k-th row, at most DRIFT_ROWS of them: the same rows every step (the plan's order is fixed), a
        # relative norm over them estimates the whole one, and the measurement stays a small share of a step
        # (1024 rows of a 256-wide layer took 2.6-3.5 ms a step, a third of what adaptive cost over sync on
        # Tolokers; 256 rows, masked in place and read with one host sync, 0.3 ms).
        stride = max(1, -(-send.size(0) // DRIFT_ROWS))
        prev, cur = slot.sent, send.detach()[::stride]
        if prev is not None and stride > 1 and prev.size(0) == send.size(0):
            prev = prev[::stride]  # a checkpoint that kept every row
        if prev is not None and prev.shape == cur.shape:
            both = (prev != 0).logical_and_(cur != 0)
            diff, base = cur.sub(prev).mul_(both).reshape(-1), prev.mul(both).reshape(-1)
            # sums of squares as dot products in the rows' dtype (float32 is ample for a ratio against a
            # threshold); in float64 only where that overflowed
            num, den = torch.stack([torch.dot(diff, diff), torch.dot(base, base)]).tolist()
            if not (math.isfinite(num) and math.isfinite(den)):
                num, den = float(diff.double().square().sum()), float(base.double().square().sum())
            slot.drift = math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)
        slot.sent = cur.clone() if stride > 1 else cur  # not a view: the step's send buffer is freed

    def slot(
        self, index: int, layer: str, direction: Direction, rows: Tensor, partial: bool = False,
        reach: Optional[tuple[float, float]] = None,
    ) -> Slot:  # fmt: skip
        """Slot ``index`` (created at its first use); it must see the same layer every step. ``reach``: this rank's
        ``(W, N)`` of the slot's edges (:meth:`decide_widths`), where adaptive widths need it."""
        d, dtype = int(rows.size(1)), rows.dtype
        if index == len(self.slots):
            self.slots.append(Slot(layer, direction, d, dtype, partial=partial))
            self._signal_device = rows.device  # also where no signal is measured yet (a narrow plateau)
        slot = self.slots[index]
        if reach is not None:
            slot.reach = reach
        if slot.partial != partial:
            raise HaloExchangeError(
                f"halo exchange #{index} (layer '{layer}') {'carries' if partial else 'does not carry'} partial sums "
                f"now but {'did not' if partial else 'did'} in earlier steps or in the checkpoint: resume with the "
                "strategy's halo_reduction of the run that wrote it."
            )
        if (slot.layer, slot.direction, slot.d, slot.dtype) != (layer, direction, d, dtype):
            raise HaloExchangeError(
                f"halo exchange #{index} of this training step is layer '{layer}' with {d} {dtype} "
                f"columns, but in earlier steps it was '{slot.layer}' with {slot.d} {slot.dtype} columns. "
                "Stale/periodic halo modes need the same layers called in the same order every step."
            )
        return slot

    def forward(
        self,
        slot: Slot,
        send: Tensor,
        mode: Mode,
        bits: Bits,
        counts: tuple[Sequence[int], Sequence[int]],
        epoch: int,
        generator: torch.Generator,
    ) -> Tensor:
        """The halo rows for this step's forward; ``send`` are my rows for the peers."""
        if self.drift_bound is not None:
            self._measure(slot, send)
        if mode == "adaptive":
            mode = slot.decision
        if mode != "pipelined" and slot.fwd_pending is not None:
            self._land_fwd(slot)  # a pipelined epoch's rows, superseded by this epoch's
        if mode == "periodic" and slot.halo is not None:
            return slot.halo.clone()
        if is_adaptive(bits):  # what is sent now (a periodic epoch sends nothing)
            if self.measuring:
                self._measure_width(slot, send, "fwd")
            bits = self.width(slot, "fwd", bits)
        if mode == "pipelined" and (slot.halo is not None or slot.fwd_pending is not None):
            if slot.fwd_pending is not None:
                self._land_fwd(slot)
            assert slot.halo is not None
            stale = slot.halo.clone()
            slot.fwd_pending = self.wire.post(
                send, bits, *counts, slot.layer, "fwd", generator=generator, async_op=True, epoch=epoch
            )
            return stale
        halo = self._timed(slot, lambda: self.wire.exchange(send, bits, *counts, slot.layer, "fwd", generator))
        slot.halo, slot.fresh_epoch = (halo.detach() if self.keep_history or mode != "sync" else None), epoch
        return halo

    def backward(
        self,
        slot: Optional[Slot],
        layer: str,
        grad_halo: Tensor,
        mode: Mode,
        bits: Bits,
        counts: tuple[Sequence[int], Sequence[int]],
        epoch: int,
        generator: torch.Generator,
    ) -> Optional[Tensor]:
        """Gradients for my sent rows (``[num_send, d]``), or None when none cross partitions."""
        if mode == "adaptive":  # the slot's forward of this epoch decided
            mode = slot.decision if slot is not None else "sync"
        if slot is not None and mode != "pipelined" and slot.bwd_pending is not None:
            self._land_bwd(slot)
        if mode == "periodic":
            return None  # between periodic refreshes no gradient crosses partitions
        if is_adaptive(bits) and slot is not None and self.measuring:
            self._measure_width(slot, grad_halo, "bwd")
        bits = self.width(slot, "bwd", bits)
        if mode == "pipelined" and slot is not None:
            if slot.bwd_pending is not None:
                self._land_bwd(slot)
            recv = slot.grad
            slot.bwd_pending = self.wire.post(
                grad_halo, bits, *counts, layer, "bwd", generator=generator, async_op=True, epoch=epoch
            )
            return recv
        recv = self._timed(slot, lambda: self.wire.exchange(grad_halo, bits, *counts, layer, "bwd", generator))
        if slot is not None and (self.keep_history or mode != "sync"):
            slot.grad = recv
        return recv

    def flush(self) -> None:
        """Wait for every asynchronous exchange in flight and fold it into its slot (a posted agreement's result is
        kept for the next :meth:`decide`)."""
        if self._agreement is not None:
            self._agreed = self.wire.finish_max(self._agreement)
            self._agreement = None
        for slot in self.slots:
            if slot.fwd_pending is not None:
                self._land_fwd(slot)
            if slot.bwd_pending is not None:
                self._land_bwd(slot)

    def staleness(self, epoch: int) -> list[int]:
        """Epochs since each slot last held fresh rows."""
        return [max(0, epoch - s.fresh_epoch) if s.fresh_epoch >= 0 else 0 for s in self.slots]

    def layers(self) -> list[str]:
        return [s.layer for s in self.slots]

    def _land_fwd(self, slot: Slot) -> None:
        pending, slot.fwd_pending = slot.fwd_pending, None
        assert pending is not None
        slot.halo, slot.fresh_epoch = self._smooth(slot.halo, self.wire.finish(pending)), pending.epoch

    def _land_bwd(self, slot: Slot) -> None:
        pending, slot.bwd_pending = slot.bwd_pending, None
        assert pending is not None
        slot.grad = self._smooth(slot.grad, self.wire.finish(pending))

    def _smooth(self, old: Optional[Tensor], new: Tensor) -> Tensor:
        """PipeGCN's moving average of stale rows/gradients (``smoothing=0``: the new ones)."""
        m = self.smoothing
        return old * m + new * (1.0 - m) if m and old is not None else new

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> list[dict[str, Any]]:
        """Plain tensors and scalars (call :meth:`flush` first)."""
        return [
            {
                "layer": s.layer,
                "direction": s.direction,
                "d": s.d,
                "dtype": str(s.dtype).replace("torch.", ""),
                "halo": None if s.halo is None else s.halo.detach().cpu(),
                "grad": None if s.grad is None else s.grad.detach().cpu(),
                "fresh_epoch": s.fresh_epoch,
                "partial": s.partial,
                "sent": None if s.sent is None else s.sent.detach().cpu(),
                "drift": s.drift,
                "wait_share": s.wait_share,
                "widths": dict(s.widths),
                "signal": {d: v.detach().cpu() for d, v in s.signal.items()},
                "reach": list(s.reach),
                "noise": dict(s.noise),
            }
            for s in self.slots
        ]

    def load_state_dict(self, state: list[dict[str, Any]], device: torch.device) -> None:
        self.slots = [
            Slot(
                layer=s["layer"],
                direction=s["direction"],
                d=s["d"],
                dtype=getattr(torch, s["dtype"]),
                halo=None if s["halo"] is None else s["halo"].to(device),
                grad=None if s["grad"] is None else s["grad"].to(device),
                fresh_epoch=s["fresh_epoch"],
                partial=bool(s.get("partial", False)),
                sent=None if s.get("sent") is None else s["sent"].to(device),
                drift=float(s.get("drift", -1.0)),
                wait_share=float(s.get("wait_share", 0.0)),
                widths={d: int(b) for d, b in s.get("widths", {}).items()},
                signal={d: torch.as_tensor(v, dtype=torch.float64).to(device) for d, v in s.get("signal", {}).items()},
                reach=tuple(float(v) for v in s.get("reach", (0.0, 0.0))),  # type: ignore[arg-type]
                noise={d: float(v) for d, v in s.get("noise", {}).items()},
            )
            for s in state
        ]
        if self.slots:  # the all-reduce's device before anything is measured again
            self._signal_device = torch.device(device)


def group_weight(direction: str, partial: bool, n: float, w: float, outputs: float) -> float:
    """The weight of a group's relative variance in its layer's outputs (:meth:`SlotTable.decide_widths`), from the
    ranks' sums: its rows ``n``, the reach ``w`` of its edges and their outputs ``outputs`` (``0``: not known, 1)."""
    if outputs <= 0:
        return 1.0
    return (w if direction == "fwd" and not partial else n) / outputs
