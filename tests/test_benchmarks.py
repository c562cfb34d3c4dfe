"""Smoke test of the benchmark harness: one tiny cell end to end (local processes), then the report."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support.launch import run_module

ROOT = Path(__file__).resolve().parents[1]


def _harness(tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    """Environment writing results and caches under tmp_path, and the harness module."""
    env = dict(os.environ, LIGHTNING_HALO_BENCH_RESULTS=str(tmp_path / "results"), LIGHTNING_HALO_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=str(ROOT))  # fmt: skip
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_NTASKS"):
        env.pop(key, None)
    return env, ["benchmarks.harness"]  # run by tests.support.launch.run_module


@pytest.mark.multiprocess
def test_one_cell_and_report(tmp_path: Path) -> None:
    env, harness = _harness(tmp_path)
    cell = run_module(harness[0], ["cell", "--graph", "cora", "--model", "sage", "--bits", "2", "--mode", "pipelined5", "--epochs", "5",
         "--nodes", "2", "--local", "--sparse", "--label", "cora-sparse"], env, timeout=600)  # fmt: skip
    assert cell.returncode == 0, cell.stdout[-3000:] + cell.stderr[-3000:]
    rec = json.loads((tmp_path / "results" / "cora-sparse" / "2n-local" / "sage-b2-pipelined5.json").read_text())
    assert rec["graph"] == "cora" and all(r["config"]["sparse"] for r in rec["ranks"])
    s = rec["summary"]
    assert len(rec["ranks"]) == 2 and len(s["curve"]) == 5
    assert s["bytes_per_epoch"] > 0 and s["epoch_s"] > 0 and 0 < s["final"]["test_acc"] <= 1
    assert set(s["breakdown"]) == {"compute_s", "codec_s", "wait_s", "allreduce_s"}
    assert [e["mode"] for e in rec["ranks"][0]["epochs"]] == ["sync", "pipelined", "pipelined", "pipelined", "pipelined"]
    # a cell that fails (here: an invalid bit width) is recorded, reported, and does not stop the harness
    bad = run_module(harness[0], ["cell", "--graph", "cora", "--model", "gcn", "--bits", "3", "--epochs", "2", "--nodes", "2", "--local"], env, timeout=600)  # fmt: skip
    assert bad.returncode == 0 and "FAILED" in bad.stdout, bad.stdout[-3000:] + bad.stderr[-3000:]
    failed = json.loads((tmp_path / "results" / "cora" / "2n-local" / "gcn-b3-sync.json").read_text())
    assert "bits" in failed["failed"] and "summary" not in failed
    page = tmp_path / "benchmarks.md"
    page.write_text("# B\n<!-- BEGIN GENERATED: results -->\n<!-- END GENERATED: results -->\n")
    pytest.importorskip("matplotlib")
    report = run_module(harness[0], ["report", "--page", str(page)], env, timeout=300)
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
    scale = run_module(harness[0], ["scale", "--graph", "sbm:4000", "--ranks", "2", "--scale-bits", "1", "--models", "sage",
                            "--epochs", "2", "--local"], env, timeout=600)  # fmt: skip
    assert scale.returncode == 0, scale.stdout[-3000:] + scale.stderr[-3000:]
    part = json.loads((tmp_path / "results" / "sbm-4000" / "partition.json").read_text())
    assert part["nodes"] == 4000 and part["edges"] == 4000 * 12 * 2
    assert part["2"]["cached"] is False and part["2"]["partition_s"] > 0 and part["2"]["partitioner"] == "metis" and 1.0 <= part["2"]["balance"] < 1.1
    rec = json.loads((tmp_path / "results" / "sbm-4000" / "2n-local" / "sage-b1-sync.json").read_text())
    assert len(rec["ranks"]) == 2 and rec["summary"]["bytes_per_epoch"] > 0

    soak = run_module(harness[0], ["soak", "--graph", "cora", "--models", "gcn", "--epochs", "24", "--nodes", "2", "--local"], env, timeout=600)  # fmt: skip
    assert soak.returncode == 0, soak.stdout[-3000:] + soak.stderr[-3000:]
    report = json.loads((tmp_path / "results" / "cora" / "2n-local" / "gcn-soak24-summary.json").read_text())
    assert report["epochs"] == 24 and len(report["ranks"]) == 2
    for r in report["ranks"]:
        # pipelined 1-bit sends the same rows every epoch after the first
        assert r["bytes_per_epoch_min"] == r["bytes_per_epoch_max"] > 0
        assert r["rss_at_20_mb"] > 0 and abs(r["growth_after_20"]) < 0.5


def _cell(model: str, bits: int, mode: str, nodes: int, rate: str, epoch_s: float, evals: list[int], hidden: int = 64) -> dict:
    curve = [{"epoch": e, "train_wall_s": 10.0 * (e + 1), "val_acc": 0.5 + 0.01 * e} for e in evals]
    return {"model": model, "bits": bits, "mode": mode, "nodes": nodes, "rate": rate, "hidden": hidden, "sparse": False,
            "cell": f"{model}-b{bits}-{mode}", "summary": {"epoch_s": epoch_s, "curve": curve, "breakdown": {
                "compute_s": epoch_s / 2, "codec_s": 0.01, "wait_s": epoch_s / 4, "allreduce_s": 0.1}}}  # fmt: skip


def test_report_plots_like_with_like_and_never_a_lone_dot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks.report import plot_graph, scaling_series

    modes = [_cell("sage", b, m, 2, "100mbit", 9.0, [4]) for b, m in ((32, "sync"), (1, "sync"), (1, "pipelined"))]
    scale = [_cell("sage", b, "sync", n, "1gbit", t, [3]) for b in (32, 1) for n, t in ((2, 8.0), (4, 6.0), (8, 5.0))]
    cells = modes + scale
    # the 100 Mbit/s 2-node cell is a different experiment: not a point of the 1 Gbit/s scaling line
    assert scaling_series(cells) == {("1gbit", 64, False): {32: [(2, 8.0), (4, 6.0), (8, 5.0)], 1: [(2, 8.0), (4, 6.0), (8, 5.0)]}}
    lines = plot_graph("g", cells, tmp_path)
    assert "![g-scaling.png](img/g-scaling.png)" in lines
    # one evaluation per run: a sentence with the values instead of a one-dot plot
    assert not (tmp_path / "g-2n-100mbit-acc-epoch.png").exists()
    assert any("validated once" in line and "SAGE 1 bit sync 0.5400 (epoch 4)" in line for line in lines)
    # two evaluations: a plot, and a note that the sparse points are the data, not the plot
    two = [_cell("gcn", b, m, 2, "100mbit", 5.0, [2, 5]) for b, m in ((32, "sync"), (1, "sync"), (1, "pipelined"))]
    lines = plot_graph("h", two, tmp_path)
    assert (tmp_path / "h-2n-100mbit-acc-epoch.png").is_file()
    assert any("validated at epochs 2, 5 only" in line for line in lines)


def test_report_figures_stay_readable_on_the_docs_page() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.report import MIN_TEXT_PX, _save, smallest_text_px

    fig, ax = plt.subplots(figsize=(15, 4))
    ax.plot([0, 1], [0, 1], label="a legend at 7 pt in a 15-inch figure")
    ax.legend(fontsize=7)
    assert smallest_text_px(fig) < MIN_TEXT_PX
    with pytest.raises(ValueError, match="smallest text"):
        _save(fig, Path("/nonexistent"), "unreadable.png")
    plt.close(fig)


def test_reduction_benchmark_counts_rows_and_renders(tmp_path, monkeypatch) -> None:
    """benchmarks.reduction: the rows table of a real graph (partial sums never add rows) and the page section."""
    from benchmarks import reduction

    monkeypatch.setattr(reduction, "OUT", tmp_path)
    rows = reduction.cover_rows(["cora"], [2, 3])
    assert [r["parts"] for r in rows] == [2, 3]
    assert all(0 < r["cover_rows"] < r["halo_rows"] for r in rows)
    text = reduction.render()
    assert "| cora | 2 |" in text and "with partial sums" in text


@pytest.mark.multiprocess
def test_pipeline_cost_pairs_split_the_step_into_phases(tmp_path: Path) -> None:
    """benchmarks.pipeline_cost: one A/B pair of local cells, the step's phases, the ratio and the page section."""
    env, _ = _harness(tmp_path)
    run = run_module("benchmarks.pipeline_cost", ["run", "--graph", "cora", "--models", "gcn", "--layers", "3",
         "--epochs", "5", "--repeats", "1", "--local"], env, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads((tmp_path / "results" / "pipeline-cost" / "summary.json").read_text())
    assert len(rows) == 1 and rows[0]["order"] == ["sync", "pipelined"] and set(rows[0]["ratios"]) == {"pipelined"}
    cell = json.loads((tmp_path / "results" / "pipeline-cost" / "cora" / "2n-local" / "gcn-b1-pipelined-l3-r0.json").read_text())
    for epoch in cell["ranks"][0]["epochs"]:
        parts = epoch["forward_s"] + epoch["backward_s"] + epoch["optimizer_s"]
        assert parts == pytest.approx(epoch["step_s"], rel=1e-9), "the phases partition the step"
        assert 0 <= epoch["forward_wait_s"] <= epoch["forward_s"] and 0 <= epoch["backward_wait_s"] <= epoch["backward_s"]
    pair = rows[0]
    assert pair["ratio"] == pytest.approx(pair["pipelined"]["epoch_s"] / pair["sync"]["epoch_s"])
    page = tmp_path / "benchmarks.md"
    page.write_text("# B\n<!-- BEGIN GENERATED: pipeline-cost -->\n<!-- END GENERATED: pipeline-cost -->\n")
    report = run_module("benchmarks.pipeline_cost", ["report", "--page", str(page)], env, timeout=120)
    assert report.returncode == 0, report.stderr[-3000:]
    assert "| cora | gcn | 1 | 3 | 2 nodes, local | 1 | pipelined |" in page.read_text()
