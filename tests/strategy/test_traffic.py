"""Byte accounting: what the collectives were handed equals what the plan predicts, exactly."""

from __future__ import annotations

import pytest
import torch

from lightning_halo.quant import row_nbytes
from tests.support.graphs import graph_by_name
from tests.support.models import build_any, reference_run
from tests.support.parity import assemble, load_records, run_parity

STEPS = 3
HIDDEN = 256


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("bits", "halo_reduction"), [(1, "cover"), (2, "none"), (4, "cover"), (8, "none"), (16, "cover"), (32, "none"), (32, "cover")]
)
def test_counted_bytes_equal_the_plan(bits: int, halo_reduction: str, tmp_path) -> None:
    config = "sage:2:cora32"
    extra = ["--bits", str(bits), "--hidden", str(HIDDEN), "--steps", str(STEPS), "--halo-reduction", halo_reduction]
    run_parity([config], 2, tmp_path, extra=extra)
    recs = load_records(config, 2, tmp_path)
    record = row_nbytes(HIDDEN, bits)
    fwd_epoch_all = 0
    for rec in recs:
        plan, meter = rec["plan" if halo_reduction == "none" else "cover"], rec["meter_total"]
        if halo_reduction == "cover":  # partial sums: fewer rows than the plan's on Cora
            assert plan["n_halo"] < rec["plan"]["n_halo"]
        # layer 0 reads the input features: their halo is stored in the partition, nothing travels
        assert not any(layer == "net.convs.0" for layer, _ in meter), meter
        # layer 1: every epoch, my boundary rows forward and my halo rows' gradients backward
        assert meter[("net.convs.1", "fwd")] == STEPS * plan["num_send"] * record
        assert meter[("net.convs.1", "bwd")] == STEPS * plan["n_halo"] * record
        assert rec["meter_total_fp32"][("net.convs.1", "fwd")] == STEPS * plan["num_send"] * HIDDEN * 4
        fwd_epoch_all += plan["num_send"] * record
    # the logged per-epoch figure is the sum over ranks
    assert recs[0]["logged"]["halo/fwd_bytes"] == fwd_epoch_all
    key = "plan" if halo_reduction == "none" else "cover"
    assert recs[0]["logged"]["halo/fwd_fp32_bytes"] == sum(r[key]["num_send"] for r in recs) * HIDDEN * 4


def test_one_bit_wire_size_at_d256() -> None:
    payload = 256 // 8
    assert row_nbytes(256, 1) <= 1.05 * (payload + 4)
    assert row_nbytes(256, 32) / row_nbytes(256, 1) >= 25


@pytest.mark.multiprocess
def test_input_features_changed_on_one_rank_are_exchanged_exactly(tmp_path) -> None:
    """Rank 0 changes batch.x after partitioning: every rank then exchanges the input features
    (one rank skipping would leave the other waiting), and the result equals single-process PyG
    on the changed features."""
    config = "sage:2:cora32"
    run_parity([config], 2, tmp_path, extra=["--scale-x-rank0", "2", "--steps", "2"])
    recs = load_records(config, 2, tmp_path)
    data = graph_by_name("cora32", 2)
    data.x[recs[0]["inner_global_id"]] *= 2
    ref = reference_run(build_any("sage:2", data), data, steps=2)
    logits, _ = assemble(recs, data.num_nodes)
    torch.testing.assert_close(logits, ref["out0"], atol=1e-5, rtol=1e-5)
    for rec in recs:
        assert rec["meter_total"][("net.convs.0", "input")] == rec["plan"]["num_send"] * 1433 * 4
