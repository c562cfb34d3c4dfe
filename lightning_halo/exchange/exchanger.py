r"""The differentiable halo fetch of one rank: one autograd function over the wire, with its slots.

:class:`HaloExchanger` binds a partition (its plans), fetches halo rows for the layer calls
(:meth:`~HaloExchanger.fetch`, differentiable: in backward the halo gradients go back to their
owners, through an autograd function of its own, the fetch's transpose, so that it differentiates
again; a call made during backward replays the step's rows, :mod:`~lightning_halo.exchange.replay`)
and keeps the training slots that make ``"pipelined"`` and ``"periodic"`` epochs work.
It is given its epoch and mode before every step (:meth:`~HaloExchanger.begin_step`, by the
strategy). Beside it, built on the same wire: :attr:`~HaloExchanger.collectives` (the exact
collectives the layer calls are given) and :attr:`~HaloExchanger.state` (what checkpoints).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypeVar

import torch
from torch import Tensor

from lightning_halo.exchange.collectives import Collectives
from lightning_halo.exchange.cover import CoverPlan, CoverRoute, build_cover_plan, build_route
from lightning_halo.exchange.inputs import InputHalos
from lightning_halo.exchange.meter import TrafficMeter
from lightning_halo.exchange.plan import Direction, ExchangePlan, type_plan_key
from lightning_halo.exchange.policy import Mode
from lightning_halo.exchange.replay import Replays, may_recompute, recomputing
from lightning_halo.exchange.slots import Bits, SlotTable
from lightning_halo.exchange.state import ExchangeState
from lightning_halo.exchange.wire import SoloTransport, Transport, Wire
from lightning_halo.partition.cover import halo_cover
from lightning_halo.partition.halo_partition import HaloPartition
from lightning_halo.partition.hetero import HeteroHaloPartition
from lightning_halo.quant import check_bits
from lightning_halo.quant.allocate import (
    BIT_BUDGET,
    BIT_CHOICES,
    BIT_PATIENCE,
    BIT_TARGET,
    MonitorMode,
    check_bit_budget,
    check_bit_choices,
    check_bit_monitor,
    check_bit_target,
    check_width,
    halo_reach,
    is_adaptive,
)

#: Observer of training exchanges (tests): ``fn(traffic, epoch, slot, sent, received)``.
Observer = Callable[[str, int, Optional[int], Tensor, Tensor], None]
T = TypeVar("T")


@dataclass(frozen=True)
class Fetch:
    """One differentiable fetch: which layer, which training slot (``None``: outside the slots), how."""

    layer: str
    slot: Optional[int]
    mode: Mode
    training: bool
    direction: Direction
    exact: bool = False
    route: Optional[CoverRoute] = None  # partial sums instead of some rows (``None``: the plan's rows)
    replay: Optional[Tensor] = field(default=None, compare=False)  # a recomputation's rows, kept from the first call


class _HaloRows(torch.autograd.Function):
    """Forward: halo rows from their owners. Backward: halo gradients back to their owners."""

    @staticmethod
    def forward(ctx: Any, x_inner: Tensor, exchanger: HaloExchanger, fetch: Fetch) -> Tensor:  # type: ignore[override]
        ctx.exchanger, ctx.fetch = exchanger, fetch
        if fetch.replay is not None:
            return fetch.replay.detach()  # a new tensor on the kept storage: autograd gives it its own grad_fn
        return exchanger.rows_forward(x_inner.detach(), fetch)

    @staticmethod
    def backward(ctx: Any, grad_halo: Tensor) -> tuple[Optional[Tensor], None, None]:  # type: ignore[override]
        return _HaloGrads.apply(grad_halo.contiguous(), ctx.exchanger, ctx.fetch), None, None


class _HaloGrads(torch.autograd.Function):
    """A fetch's backward as a function of the halo gradients: the fetch's transpose, linear, so that it differentiates
    again (``create_graph=True``: gradient penalties, Hessian-vector products). Its own derivative is the fetch itself,
    made exact (32 bits, outside the training slots): the derivative of the synchronous exchange, whatever the width or
    mode of the first one."""

    @staticmethod
    def forward(ctx: Any, grad_halo: Tensor, exchanger: HaloExchanger, fetch: Fetch) -> Tensor:  # type: ignore[override]
        ctx.exchanger, ctx.fetch = exchanger, fetch
        return exchanger.rows_backward(grad_halo, fetch)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], None, None]:  # type: ignore[override]
        f = ctx.fetch
        exact = Fetch(f.layer, None, "sync", f.training, f.direction, exact=True, route=f.route)
        return _HaloRows.apply(grad.contiguous(), ctx.exchanger, exact), None, None


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
        bits (int or str): forward bits for training, or ``"adaptive"``: per layer call, the width
            of ``bit_choices`` agreed every epoch (:mod:`lightning_halo.quant.allocate`). (default: ``1``)
        grad_bits (int or str): backward bits, or ``"adaptive"``. (default: ``bits``)
        eval_bits (int): bits for validation/test/predict. (default: ``32``)
        bit_choices (tuple of int): the widths adaptive directions choose from. (default: ``(1, 2, 4, 8)``)
        bit_budget (float): the bytes adaptive directions may move, as a multiple of their bytes at the
            narrowest choice. (default: ``2.0``)
        bit_target (float): the noise adaptive directions may add to a layer's outputs, relative to their
            energy, before a width is raised (``0``: widen while ``bit_budget`` allows). (default: ``0``)
        bit_monitor (str, optional): a validation metric (its values reach :meth:`observe_progress`): adaptive
            directions stay at the narrowest choice until it plateaus, then ``bit_budget`` opens on trial
            (:func:`~lightning_halo.quant.allocate.plateau_step`). (default: ``None``:
            the budget is open from the first decision)
        bit_mode (str): ``"max"`` or ``"min"``: which way ``bit_monitor`` improves. (default: ``"max"``)
        bit_patience (int): checks without improvement before the budget opens on trial, and on trial before it
            closes again. (default: ``3``)
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
        bits: Bits = 1,
        grad_bits: Optional[Bits] = None,
        eval_bits: int = 32,
        seed: int = 0,
        check_finite: bool = True,
        bit_choices: tuple[int, ...] = BIT_CHOICES,
        bit_budget: float = BIT_BUDGET,
        bit_target: float = BIT_TARGET,
        bit_monitor: Optional[str] = None,
        bit_mode: MonitorMode = "max",
        bit_patience: int = BIT_PATIENCE,
    ) -> None:
        self.bits: Bits = check_width(bits)
        self.grad_bits: Bits = self.bits if grad_bits is None else check_width(grad_bits, "grad_bits")
        self.eval_bits = check_bits(eval_bits, "eval_bits")
        self.bit_choices = check_bit_choices(bit_choices)
        self.bit_budget = check_bit_budget(bit_budget)
        self.bit_target = check_bit_target(bit_target)
        self.bit_monitor, self.bit_mode, self.bit_patience = check_bit_monitor(bit_monitor, bit_mode, bit_patience)
        if not is_adaptive(self.bits) and not is_adaptive(self.grad_bits):
            options = (("bit_choices", self.bit_choices, BIT_CHOICES), ("bit_budget", self.bit_budget, BIT_BUDGET),
                       ("bit_target", self.bit_target, BIT_TARGET), ("bit_monitor", self.bit_monitor, None),
                       ("bit_mode", self.bit_mode, "max"), ("bit_patience", self.bit_patience, BIT_PATIENCE))  # fmt: skip
            given = [f"{name}={value!r}" for name, value, default in options if value != default]
            if given:
                verb = "apply" if len(given) > 1 else "applies"
                raise ValueError(f"{' and '.join(given)} {verb} to bits='adaptive' (or grad_bits='adaptive') only; "
                                 f"this run sends at bits={self.bits}, grad_bits={self.grad_bits}")  # fmt: skip
        self.meter = TrafficMeter()
        self._wire = Wire(transport or SoloTransport(), self.meter, check_finite)
        self._slots = SlotTable(self._wire)
        adaptive = tuple(d for d, b in (("fwd", self.bits), ("bwd", self.grad_bits)) if is_adaptive(b))
        if adaptive:
            self._slots.set_widths(self.bit_choices, self.bit_budget, adaptive, self.bit_target)
            if self.bit_monitor is not None:
                self._slots.set_plateau(self.bit_mode, self.bit_patience)
        #: The exact collectives the layer calls are given (degrees, edge lists, agreement).
        self.collectives = Collectives(self._wire)
        #: What checkpoints (generators, slots, traffic totals), for :class:`~lightning_halo.HaloStateCallback`.
        self.state = ExchangeState(seed, self._slots, self.meter)
        self._inputs = InputHalos(self.collectives)
        self._plans: dict[Direction, ExchangePlan] = {}
        self._cover: Optional[CoverPlan] = None
        self._part: Optional[HaloPartition | HeteroHaloPartition] = None
        self._of_partition: dict[str, Any] = {}  # values of the bound partition (partition_value)
        self._mode: Mode = "sync"
        self._training = False
        self._epoch = 0
        self._slot_index = 0
        self._steps = 0
        self._anchors: list[Tensor] = []
        self._replays = Replays()  # the step's fetches that a recomputation in backward repeats
        self._recomputed = 0  # depth of forwards of blocks recomputed in backward (begin_recomputed)
        self._observers: list[Observer] = []

    # ------------------------------------------------------------------ wiring and binding
    def connect(self, transport: Optional[Transport]) -> None:
        """Use ``transport`` for all traffic (``None``: world size 1)."""
        self._wire.connect(transport or SoloTransport())

    @property
    def world_size(self) -> int:
        return self._wire.world_size

    @property
    def bound(self) -> bool:
        """Whether a partition is bound (a step is running or ran)."""
        return "in" in self._plans

    @property
    def active(self) -> bool:
        """Whether halos travel at all (a partition is bound and there are peers)."""
        return self.bound and self._plans["in"].world_size > 1

    @property
    def part(self) -> Optional[HaloPartition | HeteroHaloPartition]:
        return self._part

    def bind(self, part: HaloPartition | HeteroHaloPartition) -> bool:
        """Use ``part``'s plan. Returns True if it is another partition than the bound one.

        Another batch object of the bound partition (a stage's view,
        :meth:`~lightning_halo.HaloPartition.with_attrs`: the same edge and plan tensors) only
        replaces the object: plans, partial-sum layout and :meth:`partition_value` stay. Any other
        partition starts afresh; what was built for the last one is dropped, not kept by identity.
        """
        if part is self._part:
            return False
        if type(part) is type(self._part) and part.shares_structure(self._part):  # type: ignore[arg-type]
            self._part = part
            self._inputs.bind(part, same_partition=True)
            return False
        self._part = part
        if isinstance(part, HeteroHaloPartition):
            # one plan per node type ("in:<type>", what the layer calls fetch along) and their sum as "in"
            typed = {type_plan_key(t): ExchangePlan.from_node_store(part, t) for t in part.node_types}
            self._plans = {"in": ExchangePlan.summed(list(typed.values())), **typed}  # type: ignore[dict-item]
        else:
            self._plans = {"in": ExchangePlan.from_partition(part)}
        self._cover = None
        self._of_partition.clear()
        self._inputs.bind(part)
        self.state.bound(self._plans)
        return True

    def release(self) -> None:
        """Let go of the bound partition and everything built from it (at the strategy's teardown).

        The checkpointed :attr:`state` stays (a checkpoint may still be written after a run); the
        next :meth:`bind` starts afresh.
        """
        self._part = None
        self._plans = {}
        self._cover = None
        self._of_partition.clear()
        self._inputs.bind(None)
        self._anchors.clear()

    def partition_value(self, key: str, build: Callable[[], T]) -> T:
        """A value of the bound partition, built by ``build()`` at the first call after :meth:`bind`.

        Dropped when another partition is bound or at :meth:`release`, so nothing outlives its
        partition or is shared between ranks (each rank has its exchanger). If ``build`` is a
        collective, every rank reaches the first call together, as for any collective.
        E.g. :func:`~lightning_halo.gather_rows`' row directory.
        """
        if not self.bound:
            raise RuntimeError(f"partition_value({key!r}) needs a bound partition; bind one first.")
        if key not in self._of_partition:
            self._of_partition[key] = build()
        return self._of_partition[key]

    def plan(self, direction: Direction = "in") -> ExchangePlan:
        """The plan of ``direction`` (``"in"``: the partition's; ``"out"`` once :meth:`add_plan` added it; on a
        heterogeneous partition ``"in:<type>"``, see :func:`~lightning_halo.exchange.plan.type_plan_key`)."""
        if not self._plans:
            raise RuntimeError(
                "a message-passing layer ran outside a training/validation/test/predict step, so lightning-halo does "
                "not know which partition it belongs to; run the model inside a step on a HaloPartition batch."
            )
        return self._plans[direction]

    def plan_keys(self) -> list[str]:
        """The keys of the bound partition's plans (``"in"``, and per node type on a heterogeneous one)."""
        return list(self._plans)

    @property
    def hetero(self) -> bool:
        """Whether the bound partition is heterogeneous (its halos travel per node type)."""
        return isinstance(self._part, HeteroHaloPartition)

    def add_plan(self, direction: Direction, plan: ExchangePlan, edge_index: Optional[Tensor] = None) -> None:
        """Register a further plan of the bound partition (its reversed out-edges' halo), with the edges that read
        its halo (local ids: inner nodes, then the plan's halo) where adaptive widths should weigh them."""
        self.state.added(direction, plan)
        self._plans[direction] = plan
        if edge_index is not None:
            self._of_partition[f"reach:{direction}"] = (halo_reach(edge_index, plan.n_inner), float(plan.n_inner))

    def reach(self, direction: Direction) -> tuple[float, float]:
        """This rank's ``(W, N)`` of the edges that read ``direction``'s halo
        (:func:`~lightning_halo.quant.allocate.halo_reach`; ``N = 0`` where they are not known)."""
        return self.partition_value(f"reach:{direction}", lambda: self._build_reach(direction))

    def _build_reach(self, direction: Direction) -> tuple[float, float]:
        part = self._part
        if isinstance(part, HeteroHaloPartition) and direction.startswith("in:"):
            # a relation aggregates over its own edges (to_hetero, HeteroConv): one reach per edge type read
            src_type, w, outputs = direction[3:], 0.0, {}
            for e in part.edge_types:
                if e[0] == src_type and "edge_index" in part[e]:
                    n_dst = int(part[e[-1]].n_inner)
                    w += halo_reach(part[e].edge_index, n_dst, int(part[src_type].n_inner))
                    outputs[e[-1]] = n_dst
            return w, float(sum(outputs.values()))
        if isinstance(part, HaloPartition) and direction == "in":
            return halo_reach(part.edge_index, int(part.n_inner)), float(part.n_inner)
        return 0.0, 0.0

    def cover_plan(self) -> CoverPlan:
        """The bound partition's partial-sum layout (:mod:`~lightning_halo.exchange.cover`), built at first use.

        The cover comes from the partition's in-edges (:func:`~lightning_halo.partition.cover.halo_cover`);
        building it exchanges its structure with every peer once, so all ranks call this together.
        """
        if self._cover is None:
            plan, part = self.plan("in"), self._part
            assert part is not None
            cover = halo_cover(part.edge_index, plan.n_inner, plan.n_halo, plan.recv_counts)
            self._cover = build_cover_plan(plan, part.edge_index, cover, part.global_id, self._rows_exchange("cover"))
        return self._cover

    def holds_input(self, x: Any) -> bool:
        """Whether ``x`` (or a pair's source features) is one of the bound partition's own tensors, whose halo is
        stored or exchanged once (:class:`~lightning_halo.exchange.inputs.InputHalos`), not per call."""
        src = x[0] if isinstance(x, (tuple, list)) and x else x
        return isinstance(src, Tensor) and self._inputs.holds(src)

    @property
    def built_cover_plan(self) -> Optional[CoverPlan]:
        """The partial-sum layout if a layer call has built it for the bound partition, else ``None``."""
        return self._cover

    def cover_route(self, coefficients: Tensor, device: torch.device) -> CoverRoute:
        """The route of one call's partial sums: ``coefficients`` ``[n_folded]`` are its values on the
        folded edges (:attr:`CoverPlan.folded_col`), sent once to their owners (all ranks call this together)."""
        plan = self.cover_plan()
        exchange = self._rows_exchange("cover") if self.world_size > 1 else None
        return build_route(plan, coefficients, exchange, device)

    def _rows_exchange(self, layer: str) -> Callable[[list[Tensor]], list[Tensor]]:
        return lambda chunks: self.collectives.all_to_all_rows(chunks, layer)

    # ------------------------------------------------------------------ steps
    def begin_step(
        self, training: bool, epoch: int = 0, mode: Mode = "sync", smoothing: float = 0.0, keep_history: bool = True,
        drift_bound: Optional[float] = None, wait_bound: Optional[float] = None,
    ) -> None:  # fmt: skip
        """Called by the strategy before each training/validation/test/predict step.

        ``mode`` and ``smoothing`` come from the schedule's
        :class:`~lightning_halo.exchange.policy.HaloPolicy` (checked there). A new training epoch
        starts the meter's epoch counts; evaluation steps are always ``"sync"``. ``keep_history``:
        whether synchronous steps keep their rows for later stale ones (not needed by a run that
        is synchronous throughout, see :meth:`~lightning_halo.exchange.slots.SlotTable.set_history`).
        ``drift_bound``: the ``"adaptive"`` policy's threshold (``None`` otherwise); the first step
        of an ``"adaptive"`` epoch agrees with the peers which layers run stale
        (:meth:`~lightning_halo.exchange.slots.SlotTable.decide`, one tiny all-reduce). ``wait_bound``: its
        wait floor (``None`` or ``0``: the drift alone decides); the training step is then timed from here to
        :meth:`end_step`.
        """
        if training and epoch != self._epoch:
            self.meter.reset_epoch()
        if training:
            self._epoch = epoch
        self._training, self._mode = training, mode if training else "sync"
        self._slots.set_smoothing(smoothing)
        if training:
            self._slots.set_history(keep_history)
            self._slots.set_drift_bound(drift_bound)
            self._slots.set_wait_bound(wait_bound)
            self._slots.start_step()
            if mode == "adaptive":
                self._slots.decide(epoch)
            self._slots.decide_widths(epoch)  # adaptive bit widths (nothing where every width is fixed)
        self._slot_index = 0
        self._steps += 1
        self._anchors.clear()
        self._replays.clear()

    @property
    def steps(self) -> int:
        """Steps begun (:meth:`begin_step` calls): what a value kept for one step is keyed by."""
        return self._steps

    @property
    def mode(self) -> Mode:
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

    def decisions(self) -> list[tuple[Mode, float]]:
        """Per training slot, in an ``"adaptive"`` run: this epoch's choice and the agreed drift behind it."""
        return self._slots.decisions()

    def wait_shares(self) -> list[float]:
        """Per training slot, in an ``"adaptive"`` run with a wait bound: the agreed share of the step its last
        synchronous exchanges waited (the least over the ranks), which decided this epoch with the drift."""
        return self._slots.waits()

    def end_step(self) -> None:
        """The training step's backward is done (called by the strategy): times what its exchanges waited."""
        self._slots.end_step()
        self._replays.clear()

    def begin_recomputed(self) -> None:
        """A block that recomputes its layers in backward starts its forward (``GroupAddRev``,
        ``DeepGCNLayer(ckpt_grad=True)``, called with gradients in a training step): it runs them without autograd,
        so their fetches are training exchanges at the run's widths (their backward runs through the replayed rows),
        not exact side computations."""
        self._recomputed += 1

    def end_recomputed(self) -> None:
        """That block's forward is done."""
        self._recomputed = max(0, self._recomputed - 1)

    @property
    def adaptive_bits(self) -> bool:
        """Whether some direction's width is chosen every epoch (``bits`` or ``grad_bits`` is ``"adaptive"``)."""
        return bool(self._slots.adaptive_directions)

    def observe_progress(self, value: float) -> None:
        """The latest value of ``bit_monitor`` on this rank (after a validation): the next epoch's decision agrees
        its mean over the ranks and opens the byte budget once it has stopped improving (nothing without a
        ``bit_monitor``)."""
        if self.bit_monitor is not None:
            self._slots.observe(value)

    def widths(self) -> list[dict[str, int]]:
        """Per training slot, the width each adaptive direction (``"fwd"``, ``"bwd"``) sends at in this epoch."""
        return self._slots.widths()

    def width_noise(self) -> list[dict[str, float]]:
        """Per training slot, the output noise its adaptive directions' widths leave (as of the last decision)."""
        return self._slots.noise()

    def fixed_width(self, direction: str) -> int:
        """The width of an exchange outside the training slots (pairs of link prediction): ``bits`` or ``grad_bits``,
        the widest of ``bit_choices`` where it is ``"adaptive"``."""
        return self._slots.width(None, direction, self.bits if direction == "fwd" else self.grad_bits)

    def slot_layers(self) -> list[str]:
        """The layer (or propagation step) of each training slot, in call order."""
        return self._slots.layers()

    def observe(self, fn: Observer) -> None:
        """Call ``fn(traffic, epoch, slot, sent, received)`` for every training exchange (tests, tracing)."""
        self._observers.append(fn)

    # ------------------------------------------------------------------ the fetch
    def fetch(
        self, x_inner: Tensor, layer: str, *, direction: Direction = "in", exact: bool = False,
        route: Optional[CoverRoute] = None,
    ) -> Tensor:  # fmt: skip
        """Halo rows ``[n_halo, ...]`` of ``x_inner`` (``[n_inner, ...]``), differentiable.

        Input features (a node-level tensor of the bound partition that needs no gradient)
        come from the partition's ``halo_x`` while ``x`` is unchanged, else they are
        exchanged once at full precision; either way they are kept
        (:class:`~lightning_halo.exchange.inputs.InputHalos`). ``exact`` forces a synchronous
        32-bit exchange outside the training slots (for layers that cache results).

        With a ``route`` (partial sums, only for ``direction="in"``), the result is the route's
        block ``[route.block, ...]`` instead: fetched halo rows and partial sums, owner after owner.
        """
        if direction == "in" and self.hetero:
            raise RuntimeError(
                "internal error in lightning-halo: a homogeneous fetch on a heterogeneous partition (its halos travel per "
                "node type, plan 'in:<type>'); please report it"
            )
        p = self.plan(direction)
        if x_inner.dim() != 2:
            flat = self.fetch(x_inner.reshape(x_inner.size(0), -1), layer, direction=direction, exact=exact, route=route)
            return flat.reshape(p.n_halo if route is None else route.block, *x_inner.shape[1:])
        if p.world_size == 1:
            return x_inner[:0]
        if self._inputs.holds(x_inner):
            halo = self._inputs.halo(x_inner, p, direction, layer)
            return halo if route is None else route.from_halo(halo)
        key, again = (layer, direction, route is not None), recomputing()
        if self._training and again:
            # activation checkpointing or a reversible layer runs this call again in backward: the rows the
            # first call got, without traffic (another exchange would round them anew; see exchange.replay)
            kept = self._replays.find(key, x_inner)
            if kept is not None:
                return _HaloRows.apply(x_inner, self, dataclasses.replace(kept.fetch, replay=kept.rows))
            exact = True  # nothing kept (a first call with gradients and no saved-tensor hooks): exact, no slot
        if self._training and (torch.is_grad_enabled() or self._recomputed) and not exact:
            fetch = Fetch(layer, self._slot_index, self._mode, True, direction, route=route)
            self._slot_index += 1
        else:
            fetch = Fetch(layer, None, "sync", self._training, direction, exact=True, route=route)
        out = _HaloRows.apply(x_inner, self, fetch)
        if self._training and not again and may_recompute():
            self._replays.keep(key, x_inner, out, fetch)
        if out.requires_grad and not again:
            self._anchors.append(out)
        return out

    def rows_forward(self, x_inner: Tensor, fetch: Fetch) -> Tensor:
        """The halo rows of one fetch (the autograd function's forward; no graph)."""
        plan, route = self.plan(fetch.direction), fetch.route
        send = x_inner[plan.send_index] if route is None else route.send_buffer(x_inner)
        counts = plan.counts(True) if route is None else route.counts(True)
        if fetch.slot is None:
            bits = 32 if fetch.exact and fetch.training else self.eval_bits
            traffic = "fwd" if fetch.training else "eval"
            return self._wire.exchange(send, bits, *counts, fetch.layer, traffic, self.state.eval_generator)
        reach = self.reach(fetch.direction) if self._slots.adaptive_directions else None
        slot = self._slots.slot(fetch.slot, fetch.layer, fetch.direction, x_inner, route is not None, reach)
        gen = self.state.train_generator
        halo = self._slots.forward(slot, send, fetch.mode, self.bits, counts, self._epoch, gen)
        for fn in self._observers:
            fn("fwd", self._epoch, fetch.slot, send.clone(), halo.clone())
        return halo

    def rows_backward(self, grad_halo: Tensor, fetch: Fetch) -> Tensor:
        """The gradient of a fetch's inner rows from its halo rows' gradients (the autograd function's backward)."""
        plan, route = self.plan(fetch.direction), fetch.route
        slot = self._slots.slots[fetch.slot] if fetch.slot is not None else None
        bits = 32 if fetch.slot is None else self.grad_bits
        gen = self.state.train_generator
        counts = plan.counts(False) if route is None else route.counts(False)
        recv = self._slots.backward(slot, fetch.layer, grad_halo, fetch.mode, bits, counts, self._epoch, gen)
        grad = grad_halo.new_zeros((plan.n_inner, *grad_halo.shape[1:]))
        if recv is not None and recv.numel() and route is not None:
            grad = route.scatter(recv.to(grad.dtype))
        elif recv is not None and recv.numel():
            grad.index_add_(0, plan.send_index, recv.to(grad.dtype))
        if fetch.slot is not None:
            for fn in self._observers:
                fn("bwd", self._epoch, fetch.slot, grad_halo.clone(), grad.clone())
        return grad

    def prepare_loss(self, loss: Tensor) -> Tensor:
        """Tie every halo fetched in this step into ``loss`` (with weight zero).

        Backward then reaches every exchange on every rank, even when a rank's loss does not
        depend on some layer (e.g. no train node), so no peer waits for a missing collective.
        In an adaptive run it also posts the next epoch's agreement
        (:meth:`~lightning_halo.exchange.slots.SlotTable.post_agreement`), which travels during backward.
        """
        if self._training:  # adaptive staleness: the next decision's all-reduce travels while backward runs
            self._slots.post_agreement()
        return self.tie_halos(loss)

    def tie_halos(self, loss: Tensor) -> Tensor:
        """``loss`` tied (with weight zero) to every halo fetched since the last tie; the strategy ties the
        training step's output inside DDP's forward already, so that DDP sees what backward reaches."""
        anchors = [a for a in self._anchors if a.requires_grad]
        self._anchors.clear()
        for a in anchors:
            loss = loss + a.reshape(-1)[:0].sum()  # exactly 0 (even if a held inf), but connected
        return loss

    def flush(self) -> None:
        """Wait for every asynchronous exchange in flight and fold it into the slots."""
        self._slots.flush()
