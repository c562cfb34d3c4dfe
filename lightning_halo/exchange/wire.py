r"""The wire: encode rows, hand them to a transport, wait, decode; timed and counted.

This is the only module of :mod:`lightning_halo.exchange` that calls ``torch.distributed``
(:class:`DistTransport`). Every collective of :class:`DistTransport` runs on the halo process
group, which :class:`~lightning_halo.HaloQuantStrategy` creates with a timeout: a dead peer
raises :class:`HaloExchangeError` instead of hanging. In-process ranks for tests:
:class:`lightning_halo.testing.ThreadGroup`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_halo.exchange.meter import Traffic, TrafficMeter


class HaloExchangeError(RuntimeError):
    """A halo collective failed or timed out; the message names the layer, traffic and rank."""


class Work(Protocol):
    def wait(self) -> Any: ...


class Transport(Protocol):
    """Point-to-point traffic of one rank with its peers, as one ``all_to_all`` per call."""

    rank: int
    world_size: int

    def all_to_all(
        self, recv: Tensor, send: Tensor, recv_splits: Sequence[int], send_splits: Sequence[int], async_op: bool
    ) -> Optional[Work]: ...

    def all_reduce_min_(self, t: Tensor, async_op: bool = False) -> Optional[Work]: ...

    def all_reduce_sum_(self, t: Tensor) -> None: ...


class DistTransport:
    """``torch.distributed`` collectives on the halo process group (gloo or NCCL)."""

    def __init__(self, group: Any, rank: int, world_size: int) -> None:
        self.group, self.rank, self.world_size = group, rank, world_size

    def all_to_all(
        self, recv: Tensor, send: Tensor, recv_splits: Sequence[int], send_splits: Sequence[int], async_op: bool
    ) -> Optional[Work]:
        return dist.all_to_all_single(
            recv, send, list(recv_splits), list(send_splits), group=self.group, async_op=async_op
        )

    def all_reduce_min_(self, t: Tensor, async_op: bool = False) -> Optional[Work]:
        return dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group, async_op=async_op)

    def all_reduce_sum_(self, t: Tensor) -> None:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)


class SoloTransport:
    """World size 1: there is nobody to talk to; an exchange moves nothing."""

    rank, world_size = 0, 1

    def all_to_all(
        self, recv: Tensor, send: Tensor, recv_splits: Sequence[int], send_splits: Sequence[int], async_op: bool
    ) -> Optional[Work]:
        if recv.numel():
            recv.copy_(send)
        return None

    def all_reduce_min_(self, t: Tensor, async_op: bool = False) -> Optional[Work]:
        return None

    def all_reduce_sum_(self, t: Tensor) -> None:
        return None


@dataclass
class Pending:
    """A collective in flight and the buffers it reads and writes."""

    work: Optional[Work]
    recv: Tensor
    send: Tensor  # kept alive until the collective completes (NCCL reads it asynchronously)
    rows: int
    d: int
    bits: int
    dtype: torch.dtype
    layer: str
    traffic: Traffic
    epoch: int = 0  # training epoch whose rows/gradients this carries


@dataclass
class PendingMax:
    """An element-wise maximum over the ranks in flight (:meth:`Wire.post_max`): ``values`` hold it once finished."""

    work: Optional[Work]
    values: Tensor
    negated: bool
    layer: str


class Wire:
    r"""Rows over a :class:`Transport`: ``bits=32`` raw rows in their own dtype (exact), else the
    :mod:`lightning_halo.quant` row records (uint8). Counts bytes and times into a meter.

    Args:
        transport: the rank's transport.
        meter (TrafficMeter): where bytes and times go.
        check_finite (bool): raise on NaN/Inf in raw (``bits=32``) rows (the codec checks the rest).
    """

    def __init__(self, transport: Transport, meter: TrafficMeter, check_finite: bool = True) -> None:
        self.transport, self.meter, self.check_finite = transport, meter, check_finite

    def connect(self, transport: Transport) -> None:
        """Send over ``transport`` from now on (a strategy connects once its process group exists)."""
        self.transport = transport

    @property
    def rank(self) -> int:
        return self.transport.rank

    @property
    def world_size(self) -> int:
        return self.transport.world_size

    def _encode(self, rows: Tensor, bits: int, where: str, generator: Optional[torch.Generator]) -> Tensor:
        if bits == 32:
            if self.check_finite and rows.numel() and not bool(torch.isfinite(rows).all()):
                from lightning_halo.quant import NonFiniteError

                bad = int(torch.nonzero(~torch.isfinite(rows))[0, 0])
                raise NonFiniteError(f"non-finite value in {where} (row {bad}); training diverged or the input holds NaN/Inf")
            return rows.contiguous()
        from lightning_halo.quant import quantize

        return quantize(rows, bits, generator, where=where).data.reshape(-1)

    def _receive_buffer(self, rows: Tensor, bits: int, n_in: int) -> tuple[Tensor, int]:
        """An empty buffer for ``n_in`` incoming rows, and the elements one row takes in it."""
        d = int(rows.size(1))
        if bits == 32:
            return rows.new_empty((n_in, d)), 1
        from lightning_halo.quant import row_nbytes

        r = row_nbytes(d, bits, rows.dtype)
        return torch.empty(n_in * r, dtype=torch.uint8, device=rows.device), r

    def post(
        self,
        rows: Tensor,
        bits: int,
        out_counts: Sequence[int],
        in_counts: Sequence[int],
        layer: str,
        traffic: Traffic,
        *,
        generator: Optional[torch.Generator] = None,
        async_op: bool = False,
        epoch: int = 0,
    ) -> Pending:
        """Start sending ``rows`` (``[sum(out_counts), d]``) and receiving ``sum(in_counts)`` rows."""
        d, dtype = int(rows.size(1)), rows.dtype
        t0 = time.perf_counter()
        send = self._encode(rows, bits, f"halo {traffic} rows of layer '{layer}' on rank {self.rank}", generator)
        t1 = time.perf_counter()
        self.meter.add_codec(t1 - t0)
        n_in = sum(in_counts)
        recv, per_row = self._receive_buffer(rows, bits, n_in)
        self.meter.add(layer, traffic, send.numel() * send.element_size(), rows.size(0) * d * 4)
        try:
            work = self.transport.all_to_all(
                recv, send, [c * per_row for c in in_counts], [c * per_row for c in out_counts], async_op
            )
        except RuntimeError as err:
            raise self.error(err, layer, traffic) from err
        if not async_op:  # the call itself blocked until the peers' rows arrived
            self.meter.add_wait(time.perf_counter() - t1)
        return Pending(work, recv, send, n_in, d, bits, dtype, layer, traffic, epoch)

    def finish(self, pending: Pending) -> Tensor:
        """Wait for ``pending`` (if asynchronous) and return the received rows, decoded."""
        if pending.work is not None:
            self._wait(pending.work, pending.layer, pending.traffic)
            pending.work = None
        if pending.bits == 32:
            return pending.recv
        from lightning_halo.quant import QuantizedRows, dequantize

        t0 = time.perf_counter()
        q = QuantizedRows.from_buffer(pending.recv, pending.rows, pending.d, pending.bits, pending.dtype)
        rows = dequantize(q, pending.dtype)
        self.meter.add_codec(time.perf_counter() - t0)
        return rows

    def exchange(
        self,
        rows: Tensor,
        bits: int,
        out_counts: Sequence[int],
        in_counts: Sequence[int],
        layer: str,
        traffic: Traffic,
        generator: Optional[torch.Generator] = None,
    ) -> Tensor:
        """Blocking :meth:`post` + :meth:`finish`."""
        pending = self.post(rows, bits, out_counts, in_counts, layer, traffic, generator=generator)
        return self.finish(pending)

    def all_agree(self, flags: Tensor, layer: str) -> Tensor:
        """Element-wise minimum of an int tensor over all ranks (one tiny all-reduce)."""
        if self.transport.world_size == 1:
            return flags
        try:
            self.transport.all_reduce_min_(flags)
        except RuntimeError as err:
            raise self.error(err, layer, "agreement") from err
        return flags

    def all_max(self, values: Tensor, layer: str) -> Tensor:
        """Element-wise maximum of a float tensor over all ranks, in place (exact: the same on every rank)."""
        return self.finish_max(self.post_max(values, layer, async_op=False))

    def post_max(self, values: Tensor, layer: str, async_op: bool = True) -> PendingMax:
        """Start :meth:`all_max` of ``values`` (in place); :meth:`finish_max` returns the maximum."""
        pending = PendingMax(None, values, False, layer)
        if self.transport.world_size == 1:
            return pending
        self.meter.add(layer, "aux", values.numel() * values.element_size(), values.numel() * 4)
        pending.negated = True  # the maximum is the minimum of the negated values: every transport has a minimum
        values.neg_()
        try:
            pending.work = self.transport.all_reduce_min_(values, async_op=async_op)
        except RuntimeError as err:
            raise self.error(err, layer, "agreement") from err
        return pending

    def finish_max(self, pending: PendingMax) -> Tensor:
        """Wait for :meth:`post_max` and return the element-wise maximum over the ranks."""
        if pending.work is not None:
            self._wait(pending.work, pending.layer, "agreement")
            pending.work = None
        if pending.negated:
            pending.values.neg_()
            pending.negated = False
        return pending.values

    def all_sum(self, values: Tensor, layer: str) -> Tensor:
        """Element-wise sum of ``values`` over all ranks, in place (one all-reduce; counted as ``aux`` bytes)."""
        if self.transport.world_size == 1:
            return values
        self.meter.add(layer, "aux", values.numel() * values.element_size(), values.numel() * 4)
        try:
            self.transport.all_reduce_sum_(values)
        except RuntimeError as err:
            raise self.error(err, layer, "sum") from err
        return values

    def _wait(self, work: Work, layer: str, what: str) -> None:
        """Wait for an asynchronous collective, counting the time as waited; a failure names the layer."""
        t0 = time.perf_counter()
        try:
            work.wait()
        except RuntimeError as err:
            raise self.error(err, layer, what) from err
        self.meter.add_wait(time.perf_counter() - t0)

    def error(self, err: Exception, layer: str, what: str) -> HaloExchangeError:
        return HaloExchangeError(
            f"halo exchange failed on rank {self.rank} ({what} of layer '{layer}'): {err}. A peer process may have "
            "died, run out of memory or called different layers; the timeout is HaloQuantStrategy(halo_timeout=...)."
        )
