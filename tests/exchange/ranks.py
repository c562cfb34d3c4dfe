"""Run one function per rank in threads over a :class:`ThreadGroup` (the in-process transport)."""

from __future__ import annotations

import threading
from typing import Any, Callable

from lightning_halo.exchange import ThreadGroup, TrafficMeter
from lightning_halo.exchange.wire import Wire


def run_ranks(world_size: int, fn: Callable[[int, Wire], Any], timeout: float = 10.0) -> list[Any]:
    """``fn(rank, wire)`` on every rank at once; the results by rank, or the first rank's error raised."""
    group = ThreadGroup(world_size, timeout=timeout)
    results: list[Any] = [None] * world_size
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = fn(rank, Wire(group.transport(rank), TrafficMeter()))
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            errors.append(err)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    if errors:
        raise errors[0]
    return results
