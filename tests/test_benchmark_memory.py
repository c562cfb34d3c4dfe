"""Smoke test of the memory benchmark: a small graph generated on disk, partitioned, trained, reported."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.support.launch import run_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.multiprocess
def test_generate_partition_train_report(tmp_path: Path) -> None:
    env = dict(os.environ, LIGHTNING_HALO_BENCH_RESULTS=str(tmp_path / "results"), PYTHONPATH=str(ROOT))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_NTASKS"):
        env.pop(key, None)

    def bench(*args: str) -> str:
        done = run_module("benchmarks.memory", list(args), env, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    graph = tmp_path / "g"
    info = json.loads(bench("generate", "--out", str(graph), "--nodes", "3000", "--degree", "4", "--features", "8",
                            "--blocks", "10").strip().splitlines()[-1])  # fmt: skip
    assert info["edges"] == 2 * 3000 * 4
    ei = np.load(graph / "edge_index.npy")
    assert ei.shape == (2, 24000) and ei.max() < 3000
    assert np.array_equal(np.sort(ei[0] * 3000 + ei[1]), np.sort(ei[1] * 3000 + ei[0])), "both directions stored"
    bench("partition", "--graph", str(graph), "--parts", "2", "--label", "tiny", "--partitioners", "metis", "kaminpar")
    bench("train", "--label", "tiny", "--ranks", "2", "--partitioners", "kaminpar")
    bench("replay", "--label", "tiny", "--ranks", "2", "--partitioners", "metis")
    page = tmp_path / "page.md"
    page.write_text("# B\n<!-- BEGIN GENERATED: memory -->\n<!-- END GENERATED: memory -->\n")
    bench("report", "--labels", "tiny", "--page", str(page), "--img", str(tmp_path / "m.png"))
    summary = json.loads((tmp_path / "results" / "memory" / "summary.json").read_text())[0]
    for kind, partitioner in (("directory", "kaminpar"), ("replay", "metis")):
        ranks = summary[kind][partitioner]["2"]["ranks"]
        assert len(ranks) == 2 and all(r["peak_mb"] > r["idle_mb"] > 50 and r["part_mb"] > 0 for r in ranks)
        # the bound holds at least the part pages the step read and what autograd saved
        assert all(0 < r["bound_mb"] and r["peak_over_bound"] > 0 for r in ranks)
    for partitioner in ("metis", "kaminpar"):
        part = summary["partition"][partitioner]["2"]
        assert part["peak_mb"] >= part["partition_phase_peak_mb"] > part["idle_mb"] and part["csr_mb"] > 0
        assert part["partitioner_s"] > 0 and part["edge_cut"] > 0 and 1.0 <= part["balance"] < 1.1
    text = page.read_text()
    assert "#### tiny" in text and "| kaminpar | 2 | " in text and "| metis | 2 | " in text and (tmp_path / "m.png").is_file()


def test_the_sampler_says_in_which_phase_the_peak_was() -> None:
    import time

    from benchmarks.memory import Sampler

    sampler = Sampler(interval=0.002)
    sampler.enter("small")
    time.sleep(0.05)
    sampler.enter("large")
    block = np.ones(200 * 2**20 // 8)  # 200 MiB, every page written
    time.sleep(0.05)
    del block
    sampler.enter("freed")
    time.sleep(0.05)
    sampler.stop()
    assert sampler.peak_phase == "large", sampler.by_phase
    assert sampler.by_phase["large"] > sampler.by_phase["small"] + 150 * 2**20
    assert sampler.by_phase["freed"] < sampler.by_phase["large"] - 150 * 2**20
