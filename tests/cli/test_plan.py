"""``lightning-halo plan``: the planner's verb (tables, --json, its errors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.planner.conftest import RATES


@pytest.fixture
def plan_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lightning_halo_cli):
    """``lightning-halo plan *args --calibration FILE`` in this process: (exit status, stdout, stderr)."""
    monkeypatch.setenv("LIGHTNING_HALO_CALIBRATION", str(tmp_path / "never-measured.json"))
    rates = tmp_path / "rates.json"
    rates.write_text(json.dumps(RATES))
    return lambda *args: lightning_halo_cli("plan", *args, "--calibration", str(rates))


def test_plan_a_graph_as_json_and_as_tables(plan_cli) -> None:
    code, out, err = plan_cli("cora", "--ranks", "2", "4", "--bits", "32", "1", "--mode", "sync", "pipelined", "--json")
    assert code == 0, err
    result = json.loads(out)  # stdout holds the JSON only (partitioning and calibrating report on stderr)
    assert [(p["ranks"], p["bits"], p["mode"]) for p in result["plans"]][:2] == [(2, 32, "sync"), (2, 32, "pipelined")]
    assert len(result["plans"]) == 8
    code, out, err = plan_cli("cora", "--ranks", "2", "--model", "sage", "--hidden", "64", "--bandwidth", "1gbit")
    assert code == 0, err
    for line in ("counts: 2 parts as partitioned (metis)", "model: sage, 2 layers, hidden 64", "link: 1 Gbit/s per rank",
                 "memory of the largest rank, term by term", "the partition step", "recommendation: 2 ranks at"):  # fmt: skip
        assert line in out, line


def test_plan_a_partition_directory_and_counts(plan_cli, tmp_path: Path) -> None:
    from lightning_halo.data.offline import partition_to_dir

    partition_to_dir("cora", tmp_path / "parts", 2)
    code, out, err = plan_cli(str(tmp_path / "parts"), "--json")
    assert code == 0, err and {p["ranks"] for p in json.loads(out)["plans"]} == {2}
    code, _, err = plan_cli(str(tmp_path / "parts"), "--ranks", "4")
    assert code == 2 and "it plans 2 ranks only" in err
    counts = ("--nodes", "111059956", "--edges", "3231371744", "--features", "128", "--classes", "172")
    code, out, err = plan_cli(*counts, "--cut-ratio", "0.3", "--ranks", "64", "128", "--memory", "80e9")
    assert code == 0, err and "estimated from counts: balanced parts, 30 % of edges cut (assumed)" in out
    code, _, err = plan_cli(*counts[:-2], "--cut-ratio", "0.3")
    assert code == 2 and "needs all of --nodes, --edges, --features, --classes" in err
    code, _, err = plan_cli(*counts, "--ranks", "64")
    assert code == 2 and "--cut-ratio" in err
    code, _, err = plan_cli(*counts, "--cut-ratio", "0.3", "--bits", "32", "adaptive")
    assert code == 2 and "bits 'adaptive' chooses each layer's width" in err, err


def test_plan_is_a_verb(lightning_halo_cli) -> None:
    code, out, _ = lightning_halo_cli("plan", "--help")
    assert code == 0 and "usage: lightning-halo plan" in out
