"""The one halo exchange: an autograd function over ``all_to_all_single`` with a codec and a schedule."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_halo.exchange.plan import ExchangePlan
from lightning_halo.partition.halo_partition import HaloPartition, tensor_digest

#: What a training step does with halos: fresh blocking exchange, last epoch's rows while this
#: epoch's travel (pipelined), or last refresh's rows with no traffic (periodic).
StepMode = Literal["sync", "stale", "reuse"]
Direction = Literal["fwd", "bwd", "eval", "input", "aux"]


class HaloExchangeError(RuntimeError):
    """A halo collective failed or timed out; the message names the layer, direction and rank."""


@dataclass
class TrafficMeter:
    """Bytes handed to the collectives, per ``(layer, direction)``, for the current epoch and in total.

    ``fp32`` counts what the same rows would cost as raw float32, the baseline for the
    reduction factor. ``wait_s`` is the time spent blocked on halo collectives (a blocking
    call, or waiting for an asynchronous one), ``codec_s`` the time spent quantizing and
    dequantizing.
    """

    epoch: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    epoch_fp32: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    total: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    total_fp32: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    epoch_wait_s: float = 0.0
    total_wait_s: float = 0.0
    epoch_codec_s: float = 0.0
    total_codec_s: float = 0.0

    def add(self, layer: str, direction: str, nbytes: int, fp32_bytes: int) -> None:
        key = (layer, direction)
        self.epoch[key] += nbytes
        self.epoch_fp32[key] += fp32_bytes
        self.total[key] += nbytes
        self.total_fp32[key] += fp32_bytes

    def add_wait(self, seconds: float) -> None:
        self.epoch_wait_s += seconds
        self.total_wait_s += seconds

    def add_codec(self, seconds: float) -> None:
        self.epoch_codec_s += seconds
        self.total_codec_s += seconds

    def reset_epoch(self) -> None:
        self.epoch.clear()
        self.epoch_fp32.clear()
        self.epoch_wait_s = 0.0
        self.epoch_codec_s = 0.0

    @staticmethod
    def sum_direction(counts: dict[tuple[str, str], int], direction: str) -> int:
        return sum(v for (_, d), v in counts.items() if d == direction)


@dataclass
class _Pending:
    """An asynchronous collective in flight and the buffer it writes."""

    work: Any
    recv: Tensor
    send: Tensor  # kept alive until the collective completes (NCCL reads it asynchronously)
    rows: int
    d: int
    bits: int
    dtype: torch.dtype
    layer: str
    direction: str
    epoch: int = 0  # training epoch whose rows/gradients this carries


@dataclass
class _Slot:
    """State of the k-th halo exchange of a training step, kept across epochs."""

    layer: str
    d: int
    dtype: torch.dtype
    halo: Optional[Tensor] = None  # rows to use when the step is stale/reuse
    grad: Optional[Tensor] = None  # halo gradients received for my sent rows, [num_send, d]
    fwd_pending: Optional[_Pending] = None
    bwd_pending: Optional[_Pending] = None
    fresh_epoch: int = -1  # epoch whose rows `halo` holds (staleness = now - fresh_epoch)


@dataclass(frozen=True)
class _Call:
    layer: str
    slot: Optional[int]
    mode: StepMode
    training: bool


class _HaloFetch(torch.autograd.Function):
    """Forward: halo rows from their owners. Backward: halo gradients back to their owners."""

    @staticmethod
    def forward(ctx: Any, x_inner: Tensor, exchanger: HaloExchanger, call: _Call) -> Tensor:  # type: ignore[override]
        ctx.exchanger, ctx.call = exchanger, call
        return exchanger._forward_rows(x_inner.detach(), call)

    @staticmethod
    def backward(ctx: Any, grad_halo: Tensor) -> tuple[Optional[Tensor], None, None]:  # type: ignore[override]
        return ctx.exchanger._backward_rows(grad_halo.contiguous(), ctx.call), None, None


class HaloExchanger:
    r"""Moves halo rows between ranks for every wrapped message-passing layer.

    One ``all_to_all_single`` per layer call and direction, on a process group of its own
    (so it never interleaves with DDP's gradient all-reduce on the default group), with a
    timeout so a dead peer raises instead of hanging. Rows that cross the wire are encoded by
    :mod:`lightning_halo.quant` (``bits=32``: raw rows in their own dtype, exact); a rank's
    own rows are never touched.

    Args:
        group: the halo process group (``None`` only for world size 1).
        bits (int): forward bits for training. (default: ``1``)
        grad_bits (int): backward bits. (default: ``bits``)
        eval_bits (int): bits for validation/test/predict. (default: ``32``)
        seed (int): seed of the per-rank stochastic-rounding generator. (default: ``0``)
        check_finite (bool): raise on NaN/Inf in halo rows. (default: ``True``)
    """

    def __init__(
        self,
        group: Any,
        *,
        bits: int = 1,
        grad_bits: Optional[int] = None,
        eval_bits: int = 32,
        seed: int = 0,
        check_finite: bool = True,
    ) -> None:
        self.group = group
        self.bits = bits
        self.grad_bits = bits if grad_bits is None else grad_bits
        self.eval_bits = eval_bits
        self.seed = seed
        self.check_finite = check_finite
        self.plan: Optional[ExchangePlan] = None
        self.part: Optional[HaloPartition] = None
        self.meter = TrafficMeter()
        # Separate streams: how often you validate must not change the training codes.
        self.generator = torch.Generator()
        self.eval_generator = torch.Generator()
        self.mode: StepMode = "sync"
        self.smoothing = 0.0
        self.training = False
        self.epoch = 0
        self.slots: list[_Slot] = []
        self._call_index = 0
        self._anchors: list[Tensor] = []
        self._restored: Optional[dict[str, Any]] = None
        self._seeded = False
        self._input_cache: dict[int, tuple[Tensor, int, Tensor]] = {}
        #: Per-partition memo for layer adapters (e.g. globally normalised GCN edge weights).
        self.aux_cache: dict[Any, Any] = {}

    # ------------------------------------------------------------------ binding and steps
    @property
    def active(self) -> bool:
        return self.plan is not None and self.plan.world_size > 1

    def bind(self, part: HaloPartition) -> bool:
        """Use ``part``'s plan (cheap when it is the same object as last time). Returns True if new."""
        if part is self.part:
            return False
        self.part = part
        self.plan = ExchangePlan.from_partition(part)
        if not self._seeded:  # once per exchanger (or never, when restored from a checkpoint)
            base = self.seed * 1_000_003 + self.plan.rank
            self.generator.manual_seed(base & 0x7FFF_FFFF_FFFF_FFFF)
            self.eval_generator.manual_seed((base + 7919) & 0x7FFF_FFFF_FFFF_FFFF)
            self._seeded = True
        self._apply_restored()
        self._input_cache.clear()
        self.aux_cache.clear()
        return True

    def inner_rows(self) -> int:
        """Rows this rank owns (what every layer input must have)."""
        return self._require_plan().n_inner

    def begin_step(self, training: bool) -> None:
        """Called before each training/validation/test/predict step."""
        self.training = training
        self._call_index = 0
        self._anchors.clear()

    def staleness(self) -> list[int]:
        """Epochs since each training slot last held fresh rows."""
        return [max(0, self.epoch - s.fresh_epoch) if s.fresh_epoch >= 0 else 0 for s in self.slots]

    # ------------------------------------------------------------------ public exchange
    def fetch(self, x_inner: Tensor, layer: str) -> Tensor:
        """Halo rows ``[n_halo, d]`` of ``x_inner`` (``[n_inner, d]``), differentiable.

        Input features (a node-level tensor of the bound partition that needs no gradient)
        come from the partition's ``halo_x`` while ``x`` is unchanged, else they are
        exchanged once at full precision; either way they are cached.
        """
        plan = self._require_plan()
        if x_inner.dim() != 2:
            x2 = x_inner.reshape(x_inner.size(0), -1)
            return self.fetch(x2, layer).reshape(plan.n_halo, *x_inner.shape[1:])
        if not x_inner.requires_grad and self._is_partition_tensor(x_inner):
            hit = self._input_cache.get(id(x_inner))
            if hit is not None and hit[0] is x_inner and hit[1] == x_inner._version:
                return hit[2]
            halo = self._stored_halo(x_inner, layer)
            if halo is None:
                halo = self._exchange_sync(x_inner[plan.send_index], 32, layer, "input", forward=True)
            self._input_cache[id(x_inner)] = (x_inner, x_inner._version, halo)
            return halo
        if self.training and torch.is_grad_enabled():
            slot = self._call_index
            self._call_index += 1
            call = _Call(layer, slot, self.mode, True)
        else:
            call = _Call(layer, None, "sync", False)
        out = _HaloFetch.apply(x_inner, self, call)
        if out.requires_grad:
            self._anchors.append(out)
        return out

    def exchange_constant(self, rows_inner: Tensor, layer: str) -> Tensor:
        """Exact, non-differentiable exchange of per-node values (e.g. GCN degrees): ``[n_halo, ...]``."""
        plan = self._require_plan()
        with torch.no_grad():
            rows = rows_inner[plan.send_index].reshape(plan.num_send, -1)
            halo = self._exchange_sync(rows, 32, layer, "aux", forward=True)
        return halo.reshape(plan.n_halo, *rows_inner.shape[1:])

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
        for slot in self.slots:
            if slot.fwd_pending is not None:
                self._land_fwd(slot)
            if slot.bwd_pending is not None:
                self._land_bwd(slot)

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """This rank's exchange state (stale rows, pending gradients, generator), on CPU.

        In-flight exchanges are waited for first, so the state is that of the end of the epoch.
        """
        self.flush()
        return {
            "generator": self.generator.get_state(),
            "slots": [
                {
                    "layer": s.layer,
                    "d": s.d,
                    "dtype": str(s.dtype).replace("torch.", ""),
                    "halo": None if s.halo is None else s.halo.detach().cpu(),
                    "grad": None if s.grad is None else s.grad.detach().cpu(),
                    "fresh_epoch": s.fresh_epoch,
                }
                for s in self.slots
            ],
            "meter_total": dict(self.meter.total),
            "meter_total_fp32": dict(self.meter.total_fp32),
            "rank": None if self.plan is None else self.plan.rank,
            "n_halo": None if self.plan is None else self.plan.n_halo,
            "num_send": None if self.plan is None else self.plan.num_send,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; slots are moved to the device at the next :meth:`bind`."""
        self._restored = state
        if not self._seeded:
            base = self.seed * 1_000_003 + int(state.get("rank") or 0)
            self.eval_generator.manual_seed((base + 7919) & 0x7FFF_FFFF_FFFF_FFFF)
        self.generator.set_state(state["generator"])
        self._seeded = True
        self.meter.total.update(state.get("meter_total", {}))
        self.meter.total_fp32.update(state.get("meter_total_fp32", {}))
        self.part = None  # force a re-bind, which applies the slots
        if self.plan is not None:
            self._apply_restored()

    def _apply_restored(self) -> None:
        state, self._restored = self._restored, None
        if state is None:
            return
        plan = self._require_plan()
        if state.get("n_halo") is not None and (state["n_halo"], state["num_send"]) != (plan.n_halo, plan.num_send):
            raise HaloExchangeError(
                f"rank {plan.rank}: the checkpoint's halo state belongs to a different partition "
                f"({state['n_halo']} halo rows, {state['num_send']} sent rows; this partition has {plan.n_halo} and "
                f"{plan.num_send}). Resume with the same graph, partitioner settings and number of processes."
            )
        device = plan.send_index.device
        self.slots = [
            _Slot(
                layer=s["layer"],
                d=s["d"],
                dtype=getattr(torch, s["dtype"]),
                halo=None if s["halo"] is None else s["halo"].to(device),
                grad=None if s["grad"] is None else s["grad"].to(device),
                fresh_epoch=s["fresh_epoch"],
            )
            for s in state["slots"]
        ]

    # ------------------------------------------------------------------ autograd bodies
    def _forward_rows(self, x_inner: Tensor, call: _Call) -> Tensor:
        plan = self._require_plan()
        send = x_inner[plan.send_index]
        if not call.training:
            return self._exchange_sync(send, self.eval_bits, call.layer, "eval", forward=True)
        slot = self._slot(call, x_inner)
        if call.mode != "stale" and slot.fwd_pending is not None:
            self._land_fwd(slot)  # a pipelined epoch's rows, superseded by this epoch's
        if call.mode == "reuse" and slot.halo is not None:
            return slot.halo.clone()
        if call.mode == "stale" and (slot.halo is not None or slot.fwd_pending is not None):
            if slot.fwd_pending is not None:
                self._land_fwd(slot)
            assert slot.halo is not None
            stale = slot.halo.clone()
            slot.fwd_pending = self._exchange_async(send, self.bits, call.layer, "fwd", forward=True)
            return stale
        halo = self._exchange_sync(send, self.bits, call.layer, "fwd", forward=True)
        slot.halo, slot.fresh_epoch = halo.detach(), self.epoch
        return halo

    def _backward_rows(self, grad_halo: Tensor, call: _Call) -> Tensor:
        plan = self._require_plan()
        slot = self.slots[call.slot] if call.slot is not None else None
        if slot is not None and call.mode != "stale" and slot.bwd_pending is not None:
            self._land_bwd(slot)
        if call.mode == "reuse":
            recv = None  # between periodic refreshes no gradient crosses partitions
        elif call.mode == "stale" and slot is not None:
            if slot.bwd_pending is not None:
                self._land_bwd(slot)
            recv = slot.grad
            slot.bwd_pending = self._exchange_async(grad_halo, self.grad_bits, call.layer, "bwd", forward=False)
        else:
            recv = self._exchange_sync(grad_halo, self.grad_bits, call.layer, "bwd", forward=False)
            if slot is not None:
                slot.grad = recv
        grad = grad_halo.new_zeros((plan.n_inner, *grad_halo.shape[1:]))
        if recv is not None and recv.numel():
            grad.index_add_(0, plan.send_index, recv.to(grad.dtype))
        return grad

    def _slot(self, call: _Call, x_inner: Tensor) -> _Slot:
        assert call.slot is not None
        d, dtype = int(x_inner.size(1)), x_inner.dtype
        if call.slot == len(self.slots):
            self.slots.append(_Slot(call.layer, d, dtype))
        slot = self.slots[call.slot]
        if (slot.layer, slot.d, slot.dtype) != (call.layer, d, dtype):
            raise HaloExchangeError(
                f"halo exchange #{call.slot} of this training step is layer '{call.layer}' with {d} {dtype} "
                f"columns, but in earlier steps it was '{slot.layer}' with {slot.d} {slot.dtype} columns. "
                "Stale/periodic halo modes need the same layers called in the same order every step."
            )
        return slot

    def _land_fwd(self, slot: _Slot) -> None:
        pending, slot.fwd_pending = slot.fwd_pending, None
        assert pending is not None
        slot.halo, slot.fresh_epoch = self._smooth(slot.halo, self._finish(pending)), pending.epoch

    def _land_bwd(self, slot: _Slot) -> None:
        pending, slot.bwd_pending = slot.bwd_pending, None
        assert pending is not None
        slot.grad = self._smooth(slot.grad, self._finish(pending))

    def _smooth(self, old: Optional[Tensor], new: Tensor) -> Tensor:
        """PipeGCN's moving average of stale rows/gradients (``smoothing=0``: the new ones)."""
        m = self.smoothing
        return old * m + new * (1.0 - m) if m and old is not None else new

    # ------------------------------------------------------------------ wire
    def _splits(self, forward: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
        plan = self._require_plan()
        # forward: send_counts out, recv_counts in; backward: the reverse.
        return (plan.send_counts, plan.recv_counts) if forward else (plan.recv_counts, plan.send_counts)

    def _encode(self, rows: Tensor, bits: int, layer: str, direction: str) -> Tensor:
        """The buffer handed to the collective: raw rows (bits=32) or uint8 row records."""
        where = f"halo {direction} rows of layer '{layer}' on rank {self._require_plan().rank}"
        if bits == 32:
            if self.check_finite and rows.numel() and not bool(torch.isfinite(rows).all()):
                from lightning_halo.quant import NonFiniteError

                bad = int(torch.nonzero(~torch.isfinite(rows))[0, 0])
                raise NonFiniteError(
                    f"non-finite value in {where} (row {bad}); training diverged or the input holds NaN/Inf"
                )
            return rows.contiguous()
        from lightning_halo.quant import quantize

        gen = self.generator if direction in ("fwd", "bwd") else self.eval_generator
        return quantize(rows, bits, gen, where=where).data.reshape(-1)

    def _post(self, rows: Tensor, bits: int, layer: str, direction: str, forward: bool, async_op: bool) -> _Pending:
        out_counts, in_counts = self._splits(forward)
        d, dtype = int(rows.size(1)), rows.dtype
        t0 = time.perf_counter()
        send = self._encode(rows, bits, layer, direction)
        t1 = time.perf_counter()
        self.meter.add_codec(t1 - t0)
        n_in = sum(in_counts)
        if bits == 32:
            recv = rows.new_empty((n_in, d))
            out_split, in_split = list(out_counts), list(in_counts)
        else:
            from lightning_halo.quant import row_nbytes

            r = row_nbytes(d, bits, dtype)
            recv = torch.empty(n_in * r, dtype=torch.uint8, device=rows.device)
            out_split, in_split = [c * r for c in out_counts], [c * r for c in in_counts]
        self.meter.add(layer, direction, send.numel() * send.element_size(), rows.size(0) * d * 4)
        try:
            work = dist.all_to_all_single(recv, send, in_split, out_split, group=self.group, async_op=async_op)
        except RuntimeError as err:
            raise self._wrap(err, layer, direction) from err
        if not async_op:  # the call itself blocked until the peers' rows arrived
            self.meter.add_wait(time.perf_counter() - t1)
        return _Pending(work, recv, send, n_in, d, bits, dtype, layer, direction, self.epoch)

    def _finish(self, pending: _Pending) -> Tensor:
        if pending.work is not None:
            t0 = time.perf_counter()
            try:
                pending.work.wait()
            except RuntimeError as err:
                raise self._wrap(err, pending.layer, pending.direction) from err
            self.meter.add_wait(time.perf_counter() - t0)
        if pending.bits == 32:
            return pending.recv
        from lightning_halo.quant import QuantizedRows, dequantize

        t0 = time.perf_counter()
        q = QuantizedRows.from_buffer(pending.recv, pending.rows, pending.d, pending.bits, pending.dtype)
        rows = dequantize(q, pending.dtype)
        self.meter.add_codec(time.perf_counter() - t0)
        return rows

    def _exchange_sync(self, rows: Tensor, bits: int, layer: str, direction: str, *, forward: bool) -> Tensor:
        pending = self._post(rows, bits, layer, direction, forward, async_op=False)
        pending.work = None
        return self._finish(pending)

    def _exchange_async(self, rows: Tensor, bits: int, layer: str, direction: str, *, forward: bool) -> _Pending:
        return self._post(rows, bits, layer, direction, forward, async_op=True)

    def _wrap(self, err: Exception, layer: str, direction: str) -> HaloExchangeError:
        rank = self.plan.rank if self.plan is not None else "?"
        return HaloExchangeError(
            f"halo exchange failed on rank {rank} ({direction} of layer '{layer}'): {err}. A peer process may have "
            "died, run out of memory or called different layers; the timeout is HaloQuantStrategy(halo_timeout=...)."
        )

    # ------------------------------------------------------------------ helpers
    def _require_plan(self) -> ExchangePlan:
        if self.plan is None:
            raise RuntimeError(
                "a message-passing layer ran outside a training/validation/test/predict step, so lightning-halo does not "
                "know which partition it belongs to; run the model inside a step on a HaloPartition batch."
            )
        return self.plan

    def _stored_halo(self, x: Tensor, layer: str) -> Optional[Tensor]:
        """The partition's ``halo_x`` if ``x`` is its ``x`` exactly as partitioned, else None.

        The decision must be the same on every rank (a rank that exchanges while its peer does
        not would hang), so the ranks agree on it with one tiny all-reduce.
        """
        part = self.part
        if part is None:
            return None
        halo_x, digest = part.get("halo_x"), part.get("x_digest")
        ok = (
            x is part.get("x")
            and isinstance(halo_x, Tensor)
            and halo_x.size(0) == self._require_plan().n_halo
            and halo_x.shape[1:] == x.shape[1:]
            and halo_x.dtype == x.dtype
            and digest == tensor_digest(x)
        )
        return halo_x.to(x.device) if self._all_agree(bool(ok), x.device, layer) else None

    def _all_agree(self, ok: bool, device: torch.device, layer: str) -> bool:
        """True if ``ok`` holds on every rank (one int all-reduce on the halo group)."""
        if self.group is None:
            return ok
        flag = torch.tensor([int(ok)], dtype=torch.int32, device=device)
        try:
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        except RuntimeError as err:
            raise self._wrap(err, layer, "input") from err
        return bool(flag.item())

    def _is_partition_tensor(self, x: Tensor) -> bool:
        part = self.part
        if part is None:
            return False
        return any(v is x for v in part.values() if isinstance(v, Tensor))
