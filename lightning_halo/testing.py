"""In-process ranks for unit tests: ``P`` threads play ``P`` ranks over :class:`ThreadGroup`.

The exchange talks to its peers through a :class:`~lightning_halo.exchange.wire.Transport`.
:class:`ThreadGroup` is one that lives in a single process, so the schedule, the slots, the
exact normalisations and whole layer calls are unit-tested without starting processes (the
project's own tests run every PyG layer this way; yours can too). Not for training.

Example:
    >>> import threading
    >>> group = ThreadGroup(2)
    >>> got = {}
    >>> def rank(r):
    ...     t = torch.tensor([10 + r])
    ...     group.transport(r).all_reduce_min_(t)
    ...     got[r] = int(t)
    >>> threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    >>> for t in threads: t.start()
    >>> for t in threads: t.join()
    >>> sorted(got.items())
    [(0, 10), (1, 10)]
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor


class ThreadGroup:
    """``P`` in-process ranks: each thread gets ``group.transport(rank)``.

    Every rank must issue the same collectives in the same order (as with real processes);
    a rank that waits more than ``timeout`` seconds for a peer raises ``RuntimeError``.

    Args:
        world_size (int): the number of ranks.
        timeout (float, optional): seconds a rank waits for its peers. (default: ``30``)

    Example:
        >>> ThreadGroup(2).transport(1).rank
        1
    """

    def __init__(self, world_size: int, timeout: float = 30.0) -> None:
        self.world_size, self.timeout = world_size, timeout
        self._cv = threading.Condition()
        self._box: dict[tuple[int, int, int], Any] = {}  # (sequence, sender, receiver) -> payload

    def transport(self, rank: int) -> ThreadTransport:
        """The transport of ``rank``."""
        return ThreadTransport(self, rank)

    def post(self, seq: int, src: int, items: dict[int, Any]) -> None:
        """Leave collective ``seq``'s payloads of rank ``src`` for their receivers."""
        with self._cv:
            for dst, payload in items.items():
                self._box[(seq, src, dst)] = payload
            self._cv.notify_all()

    def collect(self, seq: int, dst: int) -> list[Any]:
        """Rank ``dst``'s payloads of collective ``seq``, by sender, once every sender has posted."""
        keys = [(seq, src, dst) for src in range(self.world_size)]
        with self._cv:
            if not self._cv.wait_for(lambda: all(k in self._box for k in keys), timeout=self.timeout):
                raise RuntimeError(f"ThreadGroup: rank {dst} timed out waiting for collective #{seq}")
            return [self._box.pop(k) for k in keys]


class _Deferred:
    """An asynchronous collective's handle: lands when waited for."""

    def __init__(self, land: Callable[[], None]) -> None:
        self.land = land

    def wait(self) -> None:
        self.land()


class ThreadTransport:
    """One rank of a :class:`ThreadGroup` (a :class:`~lightning_halo.exchange.wire.Transport`)."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank, self.world_size = group, rank, group.world_size
        self._seq = 0

    def _next(self) -> int:
        seq, self._seq = self._seq, self._seq + 1
        return seq

    def all_to_all(
        self, recv: Tensor, send: Tensor, recv_splits: Sequence[int], send_splits: Sequence[int], async_op: bool
    ) -> Optional[_Deferred]:
        seq = self._next()
        chunks = torch.split(send.detach().clone(), list(send_splits))
        self.group.post(seq, self.rank, dict(enumerate(chunks)))

        def land() -> None:
            parts = self.group.collect(seq, self.rank)
            if recv.numel():
                recv.copy_(torch.cat(parts))

        if async_op:
            return _Deferred(land)
        land()
        return None

    def all_reduce_min_(self, t: Tensor, async_op: bool = False) -> Optional[_Deferred]:
        seq = self._next()
        self.group.post(seq, self.rank, {q: t.clone() for q in range(self.world_size)})

        def land() -> None:
            t.copy_(torch.stack(self.group.collect(seq, self.rank)).min(0).values)

        if async_op:
            return _Deferred(land)
        land()
        return None

    def all_reduce_sum_(self, t: Tensor) -> None:
        seq = self._next()
        self.group.post(seq, self.rank, {q: t.clone() for q in range(self.world_size)})
        t.copy_(torch.stack(self.group.collect(seq, self.rank)).sum(0))
