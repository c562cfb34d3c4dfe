"""The wire in process: exact raw rows, quantized records of the predicted size, errors named, never a hang."""

from __future__ import annotations

import pytest
import torch

from lightning_halo.exchange import HaloExchangeError
from lightning_halo.quant import NonFiniteError, row_nbytes
from tests.support.threaded import on_wires

D = 5


def _one_row_per_peer(rank: int, world_size: int) -> tuple[torch.Tensor, list[int]]:
    """Rank ``r`` sends peer ``q`` one row filled with ``100 r + q`` (nothing to itself)."""
    counts = [0 if q == rank else 1 for q in range(world_size)]
    rows = torch.stack([torch.full((D,), 100.0 * rank + q) for q in range(world_size) if q != rank])
    return rows, counts


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_raw_rows_arrive_exactly_from_every_peer_in_rank_order(world_size: int) -> None:
    def rank_fn(rank, wire):
        rows, counts = _one_row_per_peer(rank, world_size)
        got = wire.exchange(rows, 32, counts, counts, "conv1", "fwd")
        return got, dict(wire.meter.total), dict(wire.meter.total_fp32)

    for rank, (got, total, fp32) in enumerate(on_wires(world_size, rank_fn)):
        expect = torch.stack([torch.full((D,), 100.0 * q + rank) for q in range(world_size) if q != rank])
        assert torch.equal(got, expect)
        assert total == fp32 == {("conv1", "fwd"): (world_size - 1) * D * 4}


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_quantized_rows_cost_their_record_size_and_stay_within_one_step(bits: int) -> None:
    n = 64

    def rank_fn(rank, wire):
        g = torch.Generator().manual_seed(rank)
        rows = torch.randn(n, D, generator=g)
        got = wire.exchange(rows, bits, [0, n] if rank == 0 else [n, 0], [0, n] if rank == 0 else [n, 0], "c", "fwd", g)
        return rows, got, wire.meter.total[("c", "fwd")], wire.meter.total_fp32[("c", "fwd")]

    (rows0, got0, sent0, fp0), (rows1, got1, sent1, fp1) = on_wires(2, rank_fn)
    assert sent0 == sent1 == n * row_nbytes(D, bits) and fp0 == fp1 == n * D * 4
    for sent, got in ((rows1, got0), (rows0, got1)):
        step = (sent.amax(1, keepdim=True) - sent.amin(1, keepdim=True)) / (2**bits - 1)
        # stochastic rounding moves a value by less than one step (fp16 scale: a little slack)
        assert bool(((got - sent).abs() <= step * 1.01 + 1e-3).all())


def test_asynchronous_post_lands_the_same_rows_as_a_blocking_exchange() -> None:
    def rank_fn(rank, wire):
        rows, counts = _one_row_per_peer(rank, 2)
        pending = wire.post(rows, 32, counts, counts, "c", "fwd", async_op=True, epoch=7)
        assert pending.work is not None and pending.epoch == 7
        return wire.finish(pending), wire.exchange(rows, 32, counts, counts, "c", "fwd")

    for landed, blocking in on_wires(2, rank_fn):
        assert torch.equal(landed, blocking)


def test_all_agree_is_the_minimum_over_ranks() -> None:
    flags = [[1, 0, 1], [1, 1, 0], [1, 1, 1]]
    got = on_wires(3, lambda rank, wire: wire.all_agree(torch.tensor(flags[rank]), "c").tolist())
    assert got == [[1, 0, 0]] * 3


def test_non_finite_raw_rows_are_named_and_a_waiting_peer_gets_an_error_not_a_hang() -> None:
    def rank_fn(rank, wire):
        rows, counts = _one_row_per_peer(rank, 2)
        if rank == 1:
            rows[0, 2] = float("nan")
        try:
            wire.exchange(rows, 32, counts, counts, "conv2", "bwd")
        except Exception as err:  # noqa: BLE001 - each rank reports what it saw
            return err
        return None

    peer, bad = on_wires(2, rank_fn, timeout=0.5)
    assert isinstance(bad, NonFiniteError) and "conv2" in str(bad) and "rank 1" in str(bad)
    assert isinstance(peer, HaloExchangeError)
    assert "rank 0" in str(peer) and "bwd of layer 'conv2'" in str(peer) and "halo_timeout" in str(peer)
