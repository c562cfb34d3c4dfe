"""Byte accounting: what the collectives were handed equals what the plan predicts, exactly."""

from __future__ import annotations

import pytest

from lightning_halo.quant import row_nbytes
from tests.support.parity import load_records, run_parity

STEPS = 3
HIDDEN = 256


@pytest.mark.multiprocess
@pytest.mark.parametrize("bits", [1, 2, 4, 8, 16, 32])
def test_counted_bytes_equal_the_plan(bits: int, tmp_path) -> None:
    config = "sage:2:cora32"
    run_parity([config], 2, tmp_path, extra=["--bits", str(bits), "--hidden", str(HIDDEN), "--steps", str(STEPS)])
    recs = load_records(config, 2, tmp_path)
    record = row_nbytes(HIDDEN, bits)
    fwd_epoch_all = 0
    for rec in recs:
        plan, meter = rec["plan"], rec["meter_total"]
        # layer 0 reads the input features: exchanged once, raw float32
        assert meter[("net.convs.0", "input")] == plan["num_send"] * 1433 * 4
        assert ("net.convs.0", "fwd") not in meter and ("net.convs.0", "bwd") not in meter
        # layer 1: every epoch, my boundary rows forward and my halo rows' gradients backward
        assert meter[("net.convs.1", "fwd")] == STEPS * plan["num_send"] * record
        assert meter[("net.convs.1", "bwd")] == STEPS * plan["n_halo"] * record
        assert rec["meter_total_fp32"][("net.convs.1", "fwd")] == STEPS * plan["num_send"] * HIDDEN * 4
        fwd_epoch_all += plan["num_send"] * record
    # the logged per-epoch figure is the sum over ranks
    assert recs[0]["logged"]["halo/fwd_bytes"] == fwd_epoch_all
    assert recs[0]["logged"]["halo/fwd_fp32_bytes"] == sum(r["plan"]["num_send"] for r in recs) * HIDDEN * 4


def test_one_bit_wire_size_at_d256() -> None:
    payload = 256 // 8
    assert row_nbytes(256, 1) <= 1.05 * (payload + 4)
    assert row_nbytes(256, 32) / row_nbytes(256, 1) >= 25
