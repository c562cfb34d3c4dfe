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


@pytest.mark.multiprocess
def test_one_cell_and_report(tmp_path: Path) -> None:
    env = dict(os.environ, LIGHTNING_HALO_BENCH_RESULTS=str(tmp_path / "results"), LIGHTNING_HALO_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=str(ROOT))  # fmt: skip
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_NTASKS"):
        env.pop(key, None)
    harness = [sys.executable, str(ROOT / "benchmarks" / "harness.py")]
    cell = subprocess.run(
        [*harness, "cell", "--graph", "cora", "--model", "sage", "--bits", "2", "--mode", "pipelined5", "--epochs", "5",
         "--nodes", "2", "--local"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert cell.returncode == 0, cell.stdout[-3000:] + cell.stderr[-3000:]
    rec = json.loads((tmp_path / "results" / "cora" / "2n-local" / "sage-b2-pipelined5.json").read_text())
    s = rec["summary"]
    assert len(rec["ranks"]) == 2 and len(s["curve"]) == 5
    assert s["bytes_per_epoch"] > 0 and s["epoch_s"] > 0 and 0 < s["final"]["test_acc"] <= 1
    assert set(s["breakdown"]) == {"compute_s", "codec_s", "wait_s", "allreduce_s"}
    assert [e["mode"] for e in rec["ranks"][0]["epochs"]] == ["sync", "stale", "stale", "stale", "stale"]
    page = tmp_path / "benchmarks.md"
    page.write_text("# B\n<!-- BEGIN GENERATED: results -->\n<!-- END GENERATED: results -->\n")
    pytest.importorskip("matplotlib")
    report = subprocess.run([*harness, "report", "--page", str(page)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    text = page.read_text()
    assert "sage" in text and "pipelined + sync_every=5" in text
    assert list((tmp_path / "img").glob("*.png")), "plots written next to the page"
    shutil.rmtree(tmp_path / "img", ignore_errors=True)
