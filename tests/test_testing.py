"""The in-process transport: ranks as threads, collectives matched in order, a missing peer is a timeout."""

from __future__ import annotations

import pytest
import torch

from lightning_halo.testing import ThreadGroup
from tests.support.threaded import on_threads


def test_all_to_all_moves_each_chunk_to_its_rank_synchronously_or_not() -> None:
    group = ThreadGroup(3)

    def rank(r: int):
        t = group.transport(r)
        send = torch.tensor([[10.0 * r + q] for q in range(3)])
        got_sync = torch.empty(3, 1)
        t.all_to_all(got_sync, send, [1, 1, 1], [1, 1, 1], async_op=False)
        got_async = torch.empty(3, 1)
        work = t.all_to_all(got_async, send + 1, [1, 1, 1], [1, 1, 1], async_op=True)
        work.wait()
        return got_sync.view(-1).tolist(), got_async.view(-1).tolist()

    for r, (sync, later) in enumerate(on_threads(3, rank)):
        assert sync == [10.0 * q + r for q in range(3)] and later == [10.0 * q + r + 1 for q in range(3)]


def test_a_rank_waiting_for_an_absent_peer_times_out() -> None:
    group = ThreadGroup(2, timeout=0.2)
    with pytest.raises(RuntimeError, match="rank 0 timed out waiting for collective #0"):
        group.transport(0).all_reduce_min_(torch.zeros(1))
