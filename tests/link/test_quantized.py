"""1-bit pair exchange: test ROC-AUC within 1 pp of 32-bit after the same epochs, and its bytes in the traffic summary."""

from __future__ import annotations

import pytest

from tests.support.link import run_link_workers

EPOCHS = 100


@pytest.mark.slow
@pytest.mark.multiprocess
def test_one_bit_auc_within_one_point_of_exact(tmp_path) -> None:
    runs = {}
    for bits in (32, 1):
        runs[bits] = run_link_workers(["cora32:gcn:dot"], 2, tmp_path / str(bits), ["--epochs", str(EPOCHS), "--bits", str(bits)])[0][0]
    exact, one = runs[32], runs[1]
    assert exact["test_auroc"] > 0.85, "the exact run must have learnt something for the comparison to mean anything"
    print(f"test ROC-AUC: 32-bit {exact['test_auroc']:.4f}, 1-bit {one['test_auroc']:.4f}; pair rows {pairs32_fwd(exact)} vs {pairs32_fwd(one)} bytes")
    assert abs(exact["test_auroc"] - one["test_auroc"]) <= 0.01, (exact["test_auroc"], one["test_auroc"])
    pairs32, pairs1 = exact["summary"]["bytes"]["gather_rows/fwd"], one["summary"]["bytes"]["gather_rows/fwd"]
    assert pairs1[1] == pairs32[1] > 0, "the same rows travel (the same float32 baseline)"
    assert pairs1[0] < pairs32[0] / 5, "1-bit rows on the wire (16 values + a per-row header)"
    assert "gather_rows/bwd" in one["summary"]["bytes"] and "gather_rows/aux" in one["summary"]["bytes"]
    per_epoch = (pairs1[0] + one["summary"]["bytes"]["gather_rows/bwd"][0]) / EPOCHS
    assert one["summary"]["pair_bytes_per_epoch"] == pytest.approx(per_epoch), "the summary's per-epoch pair bytes"


def pairs32_fwd(rec: dict) -> int:
    return int(rec["summary"]["bytes"]["gather_rows/fwd"][0])
