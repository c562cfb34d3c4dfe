"""The convergence benchmark (``python -m benchmarks.converge``): its math on made-up runs, and one local run end to end."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tests.support.launch import run_module
from benchmarks.converge import common_target, run_curve, summarise_group, time_to_target, verdict

ROOT = Path(__file__).resolve().parents[2]


def _rec(vals: list[float], step_s: list[float], tests: list[float] | None = None, steps_per_epoch: int = 1) -> dict:
    """A two-rank cell record: rank 1 is slower by 0.5 s per epoch; rank 0 carries the metrics."""
    tests = tests or [v - 0.1 for v in vals]
    ranks = []
    for r, extra in ((0, 0.0), (1, 0.5)):
        wall, epochs = 0.0, []
        for i, (v, s, t) in enumerate(zip(vals, step_s, tests)):
            wall += s + extra
            epochs.append(
                {"epoch": i, "train_wall_s": wall, "steps": (i + 1) * steps_per_epoch, "val_auroc": v, "test_auroc": t}
            )
        ranks.append({"rank": r, "epochs": epochs, "stopped_by": "patience"})
    return {"ranks": ranks}


def test_run_curve_uses_the_slowest_rank_and_the_test_score_of_the_first_best_epoch() -> None:
    c = run_curve(_rec([0.5, 0.7, 0.9, 0.9, 0.8], [1.0] * 5, tests=[0.1, 0.2, 0.3, 0.4, 0.5], steps_per_epoch=7))
    assert c["metric"] == "val_auroc"
    assert [t for t, _ in c["points"]] == [1.5, 3.0, 4.5, 6.0, 7.5]  # rank 1's cumulative time, not rank 0's
    assert c["best_val"] == 0.9 and c["best_epoch"] == 2 and c["test_at_best"] == 0.3  # the first epoch at the maximum
    assert c["epochs"] == 5 and c["steps"] == 35 and c["train_s"] == 7.5 and c["stopped_by"] == "patience"


def test_time_to_target_is_the_first_time_at_or_above_it() -> None:
    pts = [(1.0, 0.5), (2.0, 0.8), (3.0, 0.7), (4.0, 0.9)]
    assert time_to_target(pts, 0.8) == 2.0
    assert time_to_target(pts, 0.85) == 4.0
    assert time_to_target(pts, 0.95) == math.inf


def test_common_target_is_the_lowest_mean_best_over_methods() -> None:
    assert common_target({"a": [0.9, 0.8], "b": [0.86, 0.86], "c": [0.95]}) == pytest.approx(0.85)


def test_summary_and_verdict_compare_against_neighbor_loaders_mean_best() -> None:
    fast = [run_curve(_rec([0.6, 0.8, 0.85], [0.2] * 3)) for _ in range(3)]  # 1-bit: reaches 0.8 at 1.4 s
    slow = [run_curve(_rec([0.7, 0.8, 0.8], [2.0] * 3)) for _ in range(3)]  # NeighborLoader: best 0.8 at 5.0 s
    never = [run_curve(_rec([0.5, 0.6, 0.7], [0.1] * 3)) for _ in range(3)]
    for cs in (fast, slow, never):
        for seed, c in enumerate(cs):
            c["seed"] = seed
    s = summarise_group({"b1-sync": fast, "neighbor": slow, "b32-sync": never})
    assert s["target"] == pytest.approx(0.7) and s["neighbor_best"] == pytest.approx(0.8)
    m = s["methods"]
    assert m["b1-sync"]["median_time_to_neighbor_best"] == pytest.approx(1.4)
    assert m["neighbor"]["median_time_to_neighbor_best"] == pytest.approx(5.0)
    assert m["b32-sync"]["reached_neighbor_best"] == 0 and m["b32-sync"]["median_time_to_neighbor_best"] == math.inf
    # the common target (0.7, the lowest method's mean best) is reached by every seed of every method
    assert m["b32-sync"]["reached"] == 3 and m["b32-sync"]["time_to_target"] == (pytest.approx(1.8), 0.0)
    assert m["b1-sync"]["time_to_target"][0] == pytest.approx(1.4)  # 0.6 at 0.7 s is below it
    # NeighborLoader's time is that of its own best epoch (5.0 s), averaged over its seeds
    assert m["neighbor"]["time_to_best"] == (pytest.approx(5.0), 0.0)
    assert verdict(s) == ("b1-sync", True, pytest.approx(1.4), pytest.approx(5.0))
    # the other way round: a NeighborLoader that gets there first
    s2 = summarise_group({"b1-sync": never, "neighbor": fast})
    assert verdict(s2)[1] is False


@pytest.mark.multiprocess
def test_local_run_stops_every_rank_at_the_same_epoch_and_reports(tmp_path: Path) -> None:
    env = dict(os.environ, LIGHTNING_HALO_BENCH_RESULTS=str(tmp_path / "results"), LIGHTNING_HALO_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=str(ROOT))  # fmt: skip
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_NTASKS"):
        env.pop(key, None)
    run = run_module("benchmarks.converge", ["run", "--local", "--graphs", "cora", "--models", "gcn", "--methods",
                     "b1-pipelined", "neighbor", "single", "--seeds", "0", "--patience", "3", "--budget", "cora=60"],
                     env, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = tmp_path / "results" / "converge" / "cora"
    for path in (out / "2n-local" / "gcn-b1-pipelined-s0.json", out / "2n-local" / "gcn-neighbor-s0.json"):
        rec = json.loads(path.read_text())
        assert "failed" not in rec, rec.get("failed")
        ranks = rec["ranks"]
        # EarlyStopping's decision is reduced over the ranks: both stop after the same epoch, by patience
        assert [r["stopped_by"] for r in ranks] == ["patience", "patience"]
        assert len(ranks[0]["epochs"]) == len(ranks[1]["epochs"]) < 60
        c = run_curve(rec)
        assert c["epochs"] >= 4 and c["steps"] >= c["epochs"] and c["best_epoch"] <= c["epochs"] - 4
        assert all(b[0] > a[0] for a, b in zip(c["points"], c["points"][1:])), "cumulative training time grows"
    assert (out / "1n-local" / "gcn-single-s0.json").is_file()
    pytest.importorskip("matplotlib")
    page = tmp_path / "docs" / "benchmarks.md"
    page.parent.mkdir()
    page.write_text("# B\n<!-- BEGIN GENERATED: converge -->\n<!-- END GENERATED: converge -->\n")
    rep = run_module("benchmarks.converge", ["report", "--graphs", "cora", "--rates", "local", "--models", "gcn", "--page",
                     str(page)], env, timeout=300)  # fmt: skip
    assert rep.returncode == 0, rep.stderr[-3000:]
    text = page.read_text()
    assert "### cora, 2 nodes at local" in text and "common target" in text
    for label in ("1-bit pipelined", "DDP + NeighborLoader", "single process (1 core)"):
        assert f"| {label} | 1 |" in text
    assert "not run: 32-bit sync, 1-bit sync" in text
    assert (tmp_path / "docs" / "img" / "converge-cora-local.png").is_file()
