r"""The one halo exchange: an autograd function over the wire, driven step by step by the strategy.

:class:`HaloExchanger` owns the exchange state of one rank: the plans of its partition, the
training slots (:mod:`~lightning_halo.exchange.slots`), the traffic meter and the
stochastic-rounding generators. One caller drives it: the strategy calls :meth:`begin_step`
before every step with the epoch, the schedule's mode and smoothing; layer hooks call
:meth:`fetch` and friends; callbacks only read (:meth:`staleness`, :attr:`meter`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from lightning_halo.exchange.meter import TrafficMeter
from lightning_halo.exchange.plan import ExchangePlan
from lightning_halo.exchange.slots import STEP_MODES, SlotTable, StepMode
from lightning_halo.exchange.wire import HaloExchangeError, SoloTransport, Transport, Wire
from lightning_halo.partition.halo_partition import HaloPartition, tensor_digest

#: Observer of training exchanges (tests): ``fn(direction, epoch, slot, sent, received)``.
Observer = Callable[[str, int, Optional[int], Tensor, Tensor], None]


@dataclass(frozen=True)
class _Call:
    layer: str
    slot: Optional[int]
    mode: StepMode
    training: bool
    plan: str
    exact: bool = False


class _HaloFetch(torch.autograd.Function):
    """Forward: halo rows from their owners. Backward: halo gradients back to their owners."""

    @staticmethod
    def forward(ctx: Any, x_inner: Tensor, exchanger: HaloExchanger, call: _Call) -> Tensor:  # type: ignore[override]
        ctx.exchanger, ctx.call = exchanger, call
        return exchanger._forward_rows(x_inner.detach(), call)

    @staticmethod
    def backward(ctx: Any, grad_halo: Tensor) -> tuple[Optional[Tensor], None, None]:  # type: ignore[override]
        return ctx.exchanger._backward_rows(grad_halo.contiguous(), ctx.call), None, None


def _seed(base: int) -> int:
    return base & 0x7FFF_FFFF_FFFF_FFFF


class HaloExchanger:
    r"""Moves halo rows between ranks for every hooked message-passing layer.

    One collective per layer call (or propagation step) and direction, on a process group of
    its own (so it never interleaves with DDP's gradient all-reduce on the default group), with
    a timeout so a dead peer raises instead of hanging. Rows that cross the wire are encoded
    by :mod:`lightning_halo.quant` (``bits=32``: raw rows in their own dtype, exact); a rank's
    own rows are never touched.

    Args:
        transport: the rank's :class:`~lightning_halo.exchange.wire.Transport`; ``None`` until
            :meth:`connect` (world size 1 needs none).
        bits (int): forward bits for training. (default: ``1``)
        grad_bits (int): backward bits. (default: ``bits``)
        eval_bits (int): bits for validation/test/predict. (default: ``32``)
        seed (int): seed of the per-rank stochastic-rounding generator. (default: ``0``)
        check_finite (bool): raise on NaN/Inf in halo rows. (default: ``True``)

    Example:
        >>> ex = HaloExchanger(None, bits=32)
        >>> ex.bind(part); ex.begin_step(training=True, epoch=0)  # doctest: +SKIP
        >>> halo = ex.fetch(h, "conv2")  # doctest: +SKIP
    """

    def __init__(
        self,
        transport: Optional[Transport] = None,
        *,
        bits: int = 1,
        grad_bits: Optional[int] = None,
        eval_bits: int = 32,
        seed: int = 0,
        check_finite: bool = True,
    ) -> None:
        self.bits = bits
        self.grad_bits = bits if grad_bits is None else grad_bits
        self.eval_bits = eval_bits
        self.seed = seed
        self.meter = TrafficMeter()
        self._wire = Wire(transport or SoloTransport(), self.meter, check_finite)
        self._slots = SlotTable(self._wire)
        # Separate streams: how often you validate must not change the training codes.
        self._gen = torch.Generator()
        self._eval_gen = torch.Generator()
        self._seeded = False
        self._plans: dict[str, ExchangePlan] = {}
        self._part: Optional[HaloPartition] = None
        self._mode: StepMode = "sync"
        self._training = False
        self._epoch = 0
        self._call_index = 0
        self._anchors: list[Tensor] = []
        self._restored: Optional[dict[str, Any]] = None
        self._restored_plans: dict[str, tuple[int, int]] = {}
        self._input_cache: dict[tuple[int, str], tuple[Tensor, int, Tensor]] = {}
        self._observers: list[Observer] = []

    # ------------------------------------------------------------------ wiring and binding
    def connect(self, transport: Optional[Transport]) -> None:
        """Use ``transport`` for all traffic (``None``: world size 1)."""
        self._wire.connect(transport or SoloTransport())

    @property
    def world_size(self) -> int:
        return self._wire.transport.world_size

    @property
    def bound(self) -> bool:
        """Whether a partition is bound (a step is running or ran)."""
        return "in" in self._plans

    @property
    def active(self) -> bool:
        """Whether halos travel at all (a partition is bound and there are peers)."""
        return self.bound and self._plans["in"].world_size > 1

    @property
    def part(self) -> Optional[HaloPartition]:
        return self._part

    def bind(self, part: HaloPartition) -> bool:
        """Use ``part``'s plan (cheap when it is the same object as last time). Returns True if new."""
        if part is self._part:
            return False
        self._part = part
        self._plans = {"in": ExchangePlan.from_partition(part)}
        if not self._seeded:  # once per exchanger (or never, when restored from a checkpoint)
            base = self.seed * 1_000_003 + self._plans["in"].rank
            self._gen.manual_seed(_seed(base))
            self._eval_gen.manual_seed(_seed(base + 7919))
            self._seeded = True
        self._apply_restored()
        self._input_cache.clear()
        return True

    def plan(self, key: str = "in") -> ExchangePlan:
        """The plan ``key`` (``"in"``: the partition's; others are added by :meth:`add_plan`)."""
        if not self._plans:
            raise RuntimeError(
                "a message-passing layer ran outside a training/validation/test/predict step, so lightning-halo does not "
                "know which partition it belongs to; run the model inside a step on a HaloPartition batch."
            )
        return self._plans[key]

    def has_plan(self, key: str) -> bool:
        return key in self._plans

    def add_plan(self, key: str, plan: ExchangePlan) -> None:
        """Register a further plan of the bound partition (e.g. its out-edges' halo)."""
        want = self._restored_plans.pop(key, None)
        if want is not None and want != (plan.n_halo, plan.num_send):
            raise self._foreign_checkpoint(want, plan)
        self._plans[key] = plan

    def inner_rows(self) -> int:
        """Rows this rank owns (what every layer input must have)."""
        return self.plan().n_inner

    # ------------------------------------------------------------------ steps
    def begin_step(self, training: bool, epoch: int = 0, mode: StepMode = "sync", smoothing: float = 0.0) -> None:
        """Called by the strategy before each training/validation/test/predict step.

        A new training epoch starts the meter's epoch counts.
        """
        if mode not in STEP_MODES:
            raise ValueError(f"unknown step mode {mode!r}; choose one of {STEP_MODES}")
        if training and epoch != self._epoch:
            self.meter.reset_epoch()
        if training:
            self._epoch = epoch
        self._training, self._mode = training, mode if training else "sync"
        self._slots.set_smoothing(smoothing)
        self._call_index = 0
        self._anchors.clear()

    def end_training(self) -> None:
        """After fit: later steps (validate/test/predict) are synchronous."""
        self._mode = "sync"

    @property
    def mode(self) -> StepMode:
        return self._mode

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def training(self) -> bool:
        return self._training

    def staleness(self) -> list[int]:
        """Epochs since each training slot last held fresh rows (one entry per slot)."""
        return self._slots.staleness(self._epoch)

    def slot_layers(self) -> list[str]:
        """The layer (or propagation step) of each training slot, in call order."""
        return self._slots.layers()

    def observe(self, fn: Observer) -> None:
        """Call ``fn(direction, epoch, slot, sent, received)`` for every training exchange (tests, tracing)."""
        self._observers.append(fn)

    # ------------------------------------------------------------------ public exchange
    def fetch(self, x_inner: Tensor, layer: str, *, plan: str = "in", exact: bool = False) -> Tensor:
        """Halo rows ``[n_halo, ...]`` of ``x_inner`` (``[n_inner, ...]``), differentiable.

        Input features (a node-level tensor of the bound partition that needs no gradient)
        come from the partition's ``halo_x`` while ``x`` is unchanged, else they are
        exchanged once at full precision; either way they are cached. ``exact`` forces a
        synchronous 32-bit exchange outside the training slots (for layers that cache results).
        """
        p = self.plan(plan)
        if x_inner.dim() != 2:
            x2 = x_inner.reshape(x_inner.size(0), -1)
            return self.fetch(x2, layer, plan=plan, exact=exact).reshape(p.n_halo, *x_inner.shape[1:])
        if p.world_size == 1:
            return x_inner[:0]
        if not x_inner.requires_grad and self._is_partition_tensor(x_inner):
            key = (id(x_inner), plan)
            hit = self._input_cache.get(key)
            if hit is not None and hit[0] is x_inner and hit[1] == x_inner._version:
                return hit[2]
            halo = self._stored_halo(x_inner, layer) if plan == "in" else None
            if halo is None:
                halo = self._wire.exchange(x_inner[p.send_index], 32, *p.counts(True), layer, "input")
            self._input_cache[key] = (x_inner, x_inner._version, halo)
            return halo
        if self._training and torch.is_grad_enabled() and not exact:
            call = _Call(layer, self._call_index, self._mode, True, plan)
            self._call_index += 1
        else:
            call = _Call(layer, None, "sync", self._training, plan, exact=True)
        out = _HaloFetch.apply(x_inner, self, call)
        if out.requires_grad:
            self._anchors.append(out)
        return out

    def exchange_constant(self, rows_inner: Tensor, layer: str, *, plan: str = "in") -> Tensor:
        """Exact, non-differentiable exchange of per-node values (e.g. degrees): ``[n_halo, ...]``."""
        p = self.plan(plan)
        if p.world_size == 1:
            return rows_inner[:0]
        with torch.no_grad():
            rows = rows_inner[p.send_index].reshape(p.num_send, -1)
            halo = self._wire.exchange(rows, 32, *p.counts(True), layer, "aux")
        return halo.reshape(p.n_halo, *rows_inner.shape[1:])

    def reduce_to_owners(self, values_halo: Tensor, layer: str, *, plan: str = "in") -> Tensor:
        """Per inner node, the sum of the values its peers hold for it as a halo node: ``[n_inner, ...]``.

        The reverse direction of :meth:`exchange_constant` (exact, non-differentiable), e.g.
        for out-degrees, whose parts are spread over the partitions of the edges' targets.
        """
        p = self.plan(plan)
        out = values_halo.new_zeros((p.n_inner, *values_halo.shape[1:]))
        if p.world_size == 1:
            return out
        with torch.no_grad():
            recv = self._wire.exchange(values_halo.reshape(p.n_halo, -1), 32, *p.counts(False), layer, "aux")
            out.index_add_(0, p.send_index, recv.reshape(p.num_send, *values_halo.shape[1:]).to(out.dtype))
        return out

    def all_to_all_rows(self, chunks: list[Tensor], layer: str) -> list[Tensor]:
        """Send ``chunks[q]`` (rows of any length) to peer ``q``; returns what each peer sent me.

        Raw and exact; first the row counts travel, then the rows (used once per partition,
        e.g. to build its out-edges).
        """
        n = self.world_size
        if len(chunks) != n:
            raise ValueError(f"all_to_all_rows needs one chunk per rank ({n}), got {len(chunks)}")
        ref = chunks[0]
        counts = torch.tensor([c.size(0) for c in chunks], dtype=torch.long, device=ref.device)
        ones = (1,) * n
        got = self._wire.exchange(counts.view(-1, 1), 32, ones, ones, layer, "aux").view(-1).tolist()
        width = int(math.prod(ref.shape[1:]))
        rows = torch.cat(chunks).reshape(sum(c.size(0) for c in chunks), width)
        out_counts = tuple(c.size(0) for c in chunks)
        recv = self._wire.exchange(rows, 32, out_counts, tuple(int(g) for g in got), layer, "aux")
        return [r.reshape(-1, *ref.shape[1:]) for r in torch.split(recv, [int(g) for g in got])]

    def all_agree(self, flags: list[bool], layer: str) -> list[bool]:
        """Each flag AND-ed over all ranks (one tiny all-reduce), so every rank takes the same branch."""
        device = self.plan().send_index.device
        t = torch.tensor([int(f) for f in flags], dtype=torch.int32, device=device)
        return [bool(v) for v in self._wire.all_agree(t, layer).tolist()]

    def global_max(self, value: Tensor, layer: str) -> Tensor:
        """The maximum of a 0-d tensor over all ranks."""
        neg = -value.detach().reshape(1).clone()
        return -self._wire.all_agree(neg, layer).reshape(())

    def prepare_loss(self, loss: Tensor) -> Tensor:
        """Tie every halo fetched in this step into ``loss`` (with weight zero).

        Backward then reaches every exchange on every rank, even when a rank's loss does not
        depend on some layer (e.g. no train node), so no peer waits for a missing collective.
        """
        anchors = [a for a in self._anchors if a.requires_grad]
        self._anchors.clear()
        for a in anchors:
            loss = loss + a.reshape(-1)[:0].sum()  # exactly 0 (even if a held inf), but connected
        return loss

    def flush(self) -> None:
        """Wait for every asynchronous exchange in flight and fold it into the slots."""
        self._slots.flush()

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """This rank's exchange state (stale rows, pending gradients, generator), on CPU.

        In-flight exchanges are waited for first, so the state is that of the end of the epoch.
        """
        self.flush()
        plan = self._plans.get("in")
        return {
            "generator": self._gen.get_state(),
            "slots": self._slots.state_dict(),
            "meter_total": dict(self.meter.total),
            "meter_total_fp32": dict(self.meter.total_fp32),
            "rank": None if plan is None else plan.rank,
            "n_halo": None if plan is None else plan.n_halo,
            "num_send": None if plan is None else plan.num_send,
            "plans": {k: (p.n_halo, p.num_send) for k, p in self._plans.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; slots are moved to the device at the next :meth:`bind`."""
        self._restored = state
        if not self._seeded:
            base = self.seed * 1_000_003 + int(state.get("rank") or 0)
            self._eval_gen.manual_seed(_seed(base + 7919))
        self._gen.set_state(state["generator"])
        self._seeded = True
        self.meter.restore_totals(state.get("meter_total", {}), state.get("meter_total_fp32", {}))
        self._part = None  # force a re-bind, which applies the slots
        if self._plans:
            self._apply_restored()

    def _apply_restored(self) -> None:
        state, self._restored = self._restored, None
        if state is None:
            return
        plan = self.plan()
        if state.get("n_halo") is not None and (state["n_halo"], state["num_send"]) != (plan.n_halo, plan.num_send):
            raise self._foreign_checkpoint((state["n_halo"], state["num_send"]), plan)
        self._restored_plans = {k: tuple(v) for k, v in state.get("plans", {}).items() if k != "in"}  # type: ignore[misc]
        self._slots.load_state_dict(state["slots"], plan.send_index.device)

    @staticmethod
    def _foreign_checkpoint(want: tuple[int, int], plan: ExchangePlan) -> HaloExchangeError:
        return HaloExchangeError(
            f"rank {plan.rank}: the checkpoint's halo state belongs to a different partition "
            f"({want[0]} halo rows, {want[1]} sent rows; this partition has {plan.n_halo} and "
            f"{plan.num_send}). Resume with the same graph, partitioner settings and number of processes."
        )

    # ------------------------------------------------------------------ autograd bodies
    def _forward_rows(self, x_inner: Tensor, call: _Call) -> Tensor:
        plan = self.plan(call.plan)
        send = x_inner[plan.send_index]
        if call.slot is None:
            bits = 32 if call.exact and call.training else self.eval_bits
            direction = "fwd" if call.training else "eval"
            return self._wire.exchange(send, bits, *plan.counts(True), call.layer, direction, self._eval_gen)
        slot = self._slots.slot(call.slot, call.layer, call.plan, x_inner)
        halo = self._slots.forward(slot, send, call.mode, self.bits, plan.counts(True), self._epoch, self._gen)
        for fn in self._observers:
            fn("fwd", self._epoch, call.slot, send.clone(), halo.clone())
        return halo

    def _backward_rows(self, grad_halo: Tensor, call: _Call) -> Tensor:
        plan = self.plan(call.plan)
        slot = self._slots.slots[call.slot] if call.slot is not None else None
        bits = 32 if call.slot is None else self.grad_bits
        recv = self._slots.backward(
            slot, call.layer, grad_halo, call.mode, bits, plan.counts(False), self._epoch, self._gen
        )
        grad = grad_halo.new_zeros((plan.n_inner, *grad_halo.shape[1:]))
        if recv is not None and recv.numel():
            grad.index_add_(0, plan.send_index, recv.to(grad.dtype))
        if call.slot is not None:
            for fn in self._observers:
                fn("bwd", self._epoch, call.slot, grad_halo.clone(), grad.clone())
        return grad

    # ------------------------------------------------------------------ helpers
    def _stored_halo(self, x: Tensor, layer: str) -> Optional[Tensor]:
        """The partition's ``halo_x`` if ``x`` is its ``x`` exactly as partitioned, else None.

        The decision must be the same on every rank (a rank that exchanges while its peer does
        not would hang), so the ranks agree on it with one tiny all-reduce.
        """
        part = self._part
        if part is None:
            return None
        halo_x, digest = part.get("halo_x"), part.get("x_digest")
        ok = (
            x is part.get("x")
            and isinstance(halo_x, Tensor)
            and halo_x.size(0) == self.plan().n_halo
            and halo_x.shape[1:] == x.shape[1:]
            and halo_x.dtype == x.dtype
            and digest == tensor_digest(x)
        )
        return halo_x.to(x.device) if self.all_agree([bool(ok)], layer)[0] else None

    def _is_partition_tensor(self, x: Tensor) -> bool:
        part = self._part
        if part is None:
            return False
        return any(v is x for v in part.values() if isinstance(v, Tensor))
