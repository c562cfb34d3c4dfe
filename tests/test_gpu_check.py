"""tools/gpu_check.sh keeps working: its dry run (tiny sizes, CPU) writes a complete, consistent JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_halo.quant import row_nbytes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("LIGHTNING_HALO_DEVICE", None)
    # The tests section runs pytest on tests/quant, which this suite runs itself: here the two
    # other sections run through the script; test_run_pytest_reports_every_case checks the runner.
    res = subprocess.run(["bash", "tools/gpu_check.sh", "--dry-run", "--sections", "codec", "epoch", "--out", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    report = json.loads((out / "gpu_check_dry_run.json").read_text())
    assert not (out / "gpu_check.json").exists(), "a dry run must never write the real result's file"
    return report


def test_dry_run_says_what_it_skipped(dry_run) -> None:
    assert dry_run["schema"] == "lightning-halo/gpu-check/1" and dry_run["mode"] == "dry-run"
    assert dry_run["status"] == "ok" and set(dry_run["sections"]) == {"codec", "epoch"}
    why = {s["what"]: s["why"] for s in dry_run["skipped"]}
    assert any("codec on the GPU" in w and "CUDA" in y for w, y in why.items()), why
    assert any("epoch compute on the GPU" in w for w in why), why
    assert any("tolokers" in w and "--tolokers" in y for w, y in why.items()), why
    assert dry_run["machine"]["torch"] and dry_run["wall_s"] > 0


def test_dry_run_tests_section_says_what_it_skipped(tmp_path, monkeypatch) -> None:
    """Without CUDA the tests section runs the codec tests on the CPU and says why the strategy tests are skipped."""
    from benchmarks import gpu_check

    rep = gpu_check.Report(tmp_path / "r.json", "dry-run", 60.0, [])
    calls = []

    def fake(name, args, device, timeout, workdir):  # the runner itself: test_run_pytest_reports_every_case
        calls.append((name, args, device))
        return {"returncode": 0, "passed": 1}

    monkeypatch.setattr(gpu_check, "run_pytest", fake)
    result = gpu_check.section_tests(rep, cuda=False, workdir=tmp_path)
    assert calls == [("codec", ["tests/quant", "-m", "device"], "cpu")] and result["status"] == "ok"
    why = {s["what"]: s["why"] for s in rep.data["skipped"]}
    assert any("strategy" in w and "layers" in w and "CUDA" in y for w, y in why.items()), why


def test_the_listed_tests_exist() -> None:
    """Every test id the CUDA run names still collects (a renamed parameter would fail the GPU check, not CI)."""
    from benchmarks.gpu_check import LAYER_TESTS, STRATEGY_TESTS

    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n0",
                          *STRATEGY_TESTS, *LAYER_TESTS], cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ids = [line for line in res.stdout.splitlines() if "::" in line]
    for wanted in STRATEGY_TESTS:
        assert wanted in ids, (wanted, ids[:5])
    assert sum("test_every_supported_layer_matches_the_whole_graph[" in i for i in ids) >= 4 * 30, len(ids)


def test_run_pytest_reports_every_case(tmp_path) -> None:
    """The runner the GPU check uses: every case of a small generated test file, its outcome and duration."""
    from benchmarks.gpu_check import run_pytest

    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_tiny.py").write_text(
        "import time\nimport pytest\n\n"
        "def test_ok():\n    time.sleep(0.05)\n\n"
        "def test_bad():\n    assert 1 == 2, 'one is not two'\n\n"
        "@pytest.mark.skip(reason='not here')\ndef test_skipped():\n    pass\n"
    )
    run = run_pytest("tiny", [str(tests), "-p", "no:doctest", "-o", "addopts="], "cpu", 120.0, tmp_path)
    assert run["device"] == "cpu" and run["returncode"] == 1
    assert (run["passed"], run["failed"], run["skipped"], run["error"]) == (1, 1, 1, 0), run["output_tail"]
    by_name = {t["id"].rsplit("::", 1)[1]: t for t in run["tests"]}
    assert set(by_name) == {"test_ok", "test_bad", "test_skipped"}
    assert "one is not two" in by_name["test_bad"]["message"] and by_name["test_bad"]["outcome"] == "failed"
    assert by_name["test_ok"]["duration_s"] >= 0.05, by_name["test_ok"]  # it slept 50 ms
    # durations read from the junit file: together no longer than the run that held them
    assert sum(t["duration_s"] for t in run["tests"]) <= run["wall_s"], run


def test_dry_run_codec_figures_are_consistent(dry_run) -> None:
    codec = dry_run["sections"]["codec"]
    rows = codec["results"]
    n = dry_run["sizes"]["rows"]
    assert {(r["bits"], r["d"]) for r in rows} == {(b, d) for b in (1, 2, 4, 8) for d in (64, 256)}
    for r in rows:
        assert r["device"] == "cpu" and r["n"] == n
        assert r["wire_bytes"] == n * row_nbytes(r["d"], r["bits"]) and r["fp32_bytes"] == n * r["d"] * 4
        assert min(r["copy_s"], r["encode_s"], r["decode_s"], r["first_encode_s"], r["first_decode_s"]) > 0
        assert r["copy_over_encode_decode"] == pytest.approx(r["copy_s"] / (r["encode_s"] + r["decode_s"]))
        # stochastic rounding: errors reach most of a step, never a whole one
        assert r["within_one_step"] and 0.5 < r["max_error_in_steps"] < 1.01


def test_dry_run_epoch_covers_every_part(dry_run) -> None:
    rows = dry_run["sections"]["epoch"]["results"]
    assert {(r["graph"], r["part"], r["model"]) for r in rows} == {("sbm", p, m) for p in (0, 1) for m in ("gcn", "sage")}
    for model in ("gcn", "sage"):
        parts = [r for r in rows if r["model"] == model]
        # the parts' inner nodes and in-edges are the whole graph, each node and edge once
        assert sum(r["n_inner"] for r in parts) == parts[0]["graph_nodes"]
        assert sum(r["edges"] for r in parts) == parts[0]["graph_edges"]
    for r in rows:
        assert r["hidden"] == 256 and r["epochs"] == dry_run["sizes"]["epochs"] == len(r["per_epoch"])
        assert 0 < r["compute_s"] <= r["step_s"] and r["n_halo"] > 0
        assert r["aggregation_input"] != "unknown"


def test_simulated_epoch_adds_the_testbed_wait(dry_run) -> None:
    from benchmarks.gpu_check import simulate

    rows = simulate(dry_run, ROOT / "benchmarks" / "results")
    sage = [r for r in rows if (r["graph"], r["model"]) == ("sbm", "sage")]
    assert {r["bits"] for r in sage} >= {1, 32}, "the testbed has sbm-h256 sync cells at 1 and 32 bits"
    gpu = max(r["compute_s"] for r in dry_run["sections"]["epoch"]["results"] if r["model"] == "sage")
    for r in sage:
        cell = json.loads(Path(r["source"]).read_text())["summary"]
        assert r["gpu_compute_s"] == gpu and r["testbed_wait_s"] == cell["breakdown"]["wait_s"]
        assert r["simulated_epoch_s"] == pytest.approx(gpu + r["testbed_wait_s"])
    assert sage[0]["bits"] == 32 and sage[0]["bytes_per_epoch"] > sage[-1]["bytes_per_epoch"]
