"""Smoke test of the benchmark harness: one tiny cell end to end (local processes), then the report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _harness(tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    """Environment writing results and caches under tmp_path, and the harness command."""
    env = dict(os.environ, LIGHTNING_HALO_BENCH_RESULTS=str(tmp_path / "results"), LIGHTNING_HALO_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=str(ROOT))  # fmt: skip
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_NTASKS"):
        env.pop(key, None)
    return env, [sys.executable, str(ROOT / "benchmarks" / "harness.py")]


@pytest.mark.multiprocess
def test_one_cell_and_report(tmp_path: Path) -> None:
    env, harness = _harness(tmp_path)
    cell = subprocess.run(
        [*harness, "cell", "--graph", "cora", "--model", "sage", "--bits", "2", "--mode", "pipelined5", "--epochs", "5",
         "--nodes", "2", "--local", "--sparse", "--label", "cora-sparse"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert cell.returncode == 0, cell.stdout[-3000:] + cell.stderr[-3000:]
    rec = json.loads((tmp_path / "results" / "cora-sparse" / "2n-local" / "sage-b2-pipelined5.json").read_text())
    assert rec["graph"] == "cora" and all(r["config"]["sparse"] for r in rec["ranks"])
    s = rec["summary"]
    assert len(rec["ranks"]) == 2 and len(s["curve"]) == 5
    assert s["bytes_per_epoch"] > 0 and s["epoch_s"] > 0 and 0 < s["final"]["test_acc"] <= 1
    assert set(s["breakdown"]) == {"compute_s", "codec_s", "wait_s", "allreduce_s"}
    assert [e["mode"] for e in rec["ranks"][0]["epochs"]] == ["sync", "stale", "stale", "stale", "stale"]
    # a cell that fails (here: an invalid bit width) is recorded, reported, and does not stop the harness
    bad = subprocess.run([*harness, "cell", "--graph", "cora", "--model", "gcn", "--bits", "3", "--epochs", "2", "--nodes", "2", "--local"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert bad.returncode == 0 and "FAILED" in bad.stdout, bad.stdout[-3000:] + bad.stderr[-3000:]
    failed = json.loads((tmp_path / "results" / "cora" / "2n-local" / "gcn-b3-sync.json").read_text())
    assert "bits" in failed["failed"] and "summary" not in failed
    page = tmp_path / "benchmarks.md"
    page.write_text("# B\n<!-- BEGIN GENERATED: results -->\n<!-- END GENERATED: results -->\n")
    pytest.importorskip("matplotlib")
    report = subprocess.run([*harness, "report", "--page", str(page)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    text = page.read_text()
    assert "sage" in text and "pipelined + sync_every=5" in text
    assert "Cells that did not finish" in text and "gcn sync 3-bit" in text
    assert list((tmp_path / "img").glob("*.png")), "plots written next to the page"
    shutil.rmtree(tmp_path / "img", ignore_errors=True)


@pytest.mark.multiprocess
def test_scale_and_soak_commands(tmp_path: Path) -> None:
    """``scale`` partitions a generated graph through the DataModule's cache, then trains on it; ``soak`` summarises RSS."""
    env, harness = _harness(tmp_path)
    scale = subprocess.run([*harness, "scale", "--graph", "sbm:4000", "--ranks", "2", "--scale-bits", "1", "--models", "sage",
                            "--epochs", "2", "--local"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert scale.returncode == 0, scale.stdout[-3000:] + scale.stderr[-3000:]
    part = json.loads((tmp_path / "results" / "sbm-4000" / "partition.json").read_text())
    assert part["nodes"] == 4000 and part["edges"] == 4000 * 12 * 2
    assert part["2"]["cached"] is False and part["2"]["metis_s"] > 0 and 1.0 <= part["2"]["balance"] < 1.1
    rec = json.loads((tmp_path / "results" / "sbm-4000" / "2n-local" / "sage-b1-sync.json").read_text())
    assert len(rec["ranks"]) == 2 and rec["summary"]["bytes_per_epoch"] > 0

    soak = subprocess.run([*harness, "soak", "--graph", "cora", "--models", "gcn", "--epochs", "24", "--nodes", "2", "--local"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert soak.returncode == 0, soak.stdout[-3000:] + soak.stderr[-3000:]
    report = json.loads((tmp_path / "results" / "cora" / "2n-local" / "gcn-soak24-summary.json").read_text())
    assert report["epochs"] == 24 and len(report["ranks"]) == 2
    for r in report["ranks"]:
        # pipelined 1-bit sends the same rows every epoch after the first
        assert r["bytes_per_epoch_min"] == r["bytes_per_epoch_max"] > 0
        assert r["rss_at_20_mb"] > 0 and abs(r["growth_after_20"]) < 0.5
