"""lightning_halo.planner.timing: the α-β arithmetic, compute from rates, overlap per mode."""

from __future__ import annotations

import pytest

from lightning_halo.exchange.plan import predict_traffic
from lightning_halo.planner.timing import (
    allreduce_seconds,
    codec_seconds,
    compute_seconds,
    epoch_seconds,
    exchange_seconds,
    halo_seconds,
)


def test_an_exchange_lasts_as_long_as_the_busiest_link() -> None:
    # rank 0 sends 3 MB and receives 4 MB; at 10 MB/s half-duplex that is 0.7 s, full-duplex 0.4 s
    assert exchange_seconds([3e6, 4e6], [4e6, 3e6], 1e7, 0.0, "half") == pytest.approx(0.7)
    assert exchange_seconds([3e6, 4e6], [4e6, 3e6], 1e7, 0.0, "full") == pytest.approx(0.4)
    assert exchange_seconds([1e6] * 4, [1e6] * 4, 1e7, 1e-3, "full") == pytest.approx(0.1 + 3e-3)  # α per peer
    assert exchange_seconds([0, 0], [0, 0], 1e7, 1e-3) == 0.0 and exchange_seconds([5e6], [5e6], 1e7, 1.0) == 0.0
    with pytest.raises(ValueError, match="duplex"):
        exchange_seconds([1.0, 1.0], [1.0, 1.0], 1.0, 0.0, "simplex")


def test_halo_seconds_moves_predict_traffic_bytes_both_ways() -> None:
    rows_in, rows_out, hidden, layers = [3176, 4314], [4314, 3176], 256, 3
    for bits in (32, 1):
        per_layer = [predict_traffic(r, 0, hidden, 2, bits)["fwd_per_epoch"] for r in rows_in]
        expected = (layers - 1) * 2 * (sum(per_layer) / 12.5e6)  # two ranks, half duplex: one's in is the other's out
        assert halo_seconds(rows_in, rows_out, hidden, layers, bits, 12.5e6, 0.0) == pytest.approx(expected)
    assert halo_seconds(rows_in, rows_out, hidden, 1, 32, 12.5e6, 0.0) == 0.0  # one layer: nothing crosses


def test_ring_allreduce_matches_the_testbed_measurement() -> None:
    # NOTES: an 8 MB all-reduce took 0.63 s at 100 Mbit/s between two nodes
    assert allreduce_seconds(8_000_000, 2, 12.5e6, 0.0) == pytest.approx(0.64)
    assert allreduce_seconds(8_000_000, 1, 12.5e6, 1.0) == 0.0
    assert allreduce_seconds(8_000_000, 8, 12.5e6, 0.0) == pytest.approx(2 * 7 / 8 * 0.64)


def test_modes_overlap_as_documented() -> None:
    assert epoch_seconds(0.3, 0.7, 0.01, 0.02, "sync") == pytest.approx(1.03)
    assert epoch_seconds(0.3, 0.7, 0.01, 0.02, "pipelined") == pytest.approx(0.71)
    assert epoch_seconds(0.9, 0.7, 0.01, 0.02, "pipelined") == pytest.approx(0.93)
    assert epoch_seconds(0.3, 0.7, 0.01, 0.0, "periodic", refresh_every=7) == pytest.approx(0.41)
    with pytest.raises(ValueError, match="unknown mode"):
        epoch_seconds(0.3, 0.7, 0.01, 0.0, "lazy")


def test_compute_counts_each_kernel(rates) -> None:
    r = {**rates, "step_s": 0.0, "elementwise_s": 0.0, "dense": float("inf")}
    # SAGE, 2 layers: layer 1 aggregates F columns forward only, layer 2 h columns forward and backward
    t = compute_seconds("sage", [16, 32, 4], n=1000, m=1500, nnz=10_000, rates=r)
    assert t["spmm"] == pytest.approx((10_000 * 16 + 2 * 10_000 * 32) / r["spmm"]) and t["dense"] == 0.0
    # GCN aggregates after its transform: d_out columns, over the square adjacency (+ halo self-loops)
    t = compute_seconds("gcn", [16, 32, 4], n=1000, m=1500, nnz=10_000, rates=r)
    assert t["spmm"] == pytest.approx(2 * 10_500 * (32 + 4) / r["spmm"])
    assert t["total"] == pytest.approx(t["spmm"])
    assert codec_seconds(1000, 256, 2, 32, rates) == 0.0
    assert codec_seconds(1000, 256, 3, 1, rates) == pytest.approx(4 * 1000 * 256 * 4 / rates["codec"])


def test_the_overhead_is_per_step_and_per_layer_at_one_rank_and_at_several(rates) -> None:
    from lightning_halo.planner.timing import overhead_seconds

    assert overhead_seconds(1, 3, rates) == pytest.approx(rates["step_s"] + 3 * rates["layer_s"])
    assert overhead_seconds(2, 3, rates) == pytest.approx(rates["dist_step_s"] + 3 * rates["dist_layer_s"])
    assert overhead_seconds(8, 2, rates) == overhead_seconds(2, 2, rates), "measured once for several ranks"
    with pytest.raises(ValueError, match="ranks and layers must be positive"):
        overhead_seconds(0, 2, rates)


def test_ranks_sharing_a_host_slow_down_as_calibrated_and_as_oversubscribed(rates) -> None:
    from lightning_halo.planner.timing import sharing_factor

    # the calibration: 2 ranks of 1 thread on 2 cores ran the kernels 1.25x slower
    assert sharing_factor(1, rates) == (1.0, 1.0)
    assert sharing_factor(2, rates) == (pytest.approx(1.25), 1.0)
    assert sharing_factor(4, rates) == (pytest.approx(2.5), 2.0), "4 ranks on 2 cores: twice the oversubscription"
    on_8_cores = {**rates, "cores": 8}
    assert sharing_factor(4, on_8_cores) == (pytest.approx(1.25), 1.0)
    with pytest.raises(ValueError, match="ranks_per_host must be at least 1"):
        sharing_factor(0, rates)
