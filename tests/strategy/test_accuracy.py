"""Quantized halos keep accuracy: 1-bit on Cora ends within 1.5 pp of exact (mean of 3 seeds)."""

from __future__ import annotations

import json

import pytest

from tests.support.launch import check, run_workers

SEEDS = (0, 1, 2)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_one_bit_accuracy_close_to_exact(tmp_path) -> None:
    runs = [f"{bits}:{seed}" for bits in (32, 1) for seed in SEEDS]
    check(run_workers(["tests/workers/accuracy_worker.py", "--out", str(tmp_path), "--runs", *runs], 2, timeout=900))
    acc = json.loads((tmp_path / "accuracy.json").read_text())
    exact = sum(acc[f"32:{s}"] for s in SEEDS) / len(SEEDS)
    one_bit = sum(acc[f"1:{s}"] for s in SEEDS) / len(SEEDS)
    print(f"Cora test accuracy, mean of {len(SEEDS)} seeds: bits=32 {exact:.4f}, bits=1 {one_bit:.4f}")
    assert exact > 0.75, acc  # the exact run itself must have learned something
    assert abs(one_bit - exact) <= 0.015, acc


@pytest.mark.multiprocess
@pytest.mark.slow
def test_pipelined_one_bit_close_to_sync_one_bit(tmp_path) -> None:
    runs = [f"1:{seed}{sched}" for sched in ("", ":pipelined:5") for seed in SEEDS]
    check(run_workers(["tests/workers/accuracy_worker.py", "--out", str(tmp_path), "--runs", *runs], 2, timeout=900))
    acc = json.loads((tmp_path / "accuracy.json").read_text())
    sync = sum(acc[f"1:{s}"] for s in SEEDS) / len(SEEDS)
    piped = sum(acc[f"1:{s}:pipelined:5"] for s in SEEDS) / len(SEEDS)
    print(f"Cora test accuracy, 1-bit, mean of {len(SEEDS)} seeds: sync {sync:.4f}, pipelined+sync_every=5 {piped:.4f}")
    assert sync > 0.75, acc
    assert abs(piped - sync) <= 0.02, acc


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("model", ["appnp", "gcnii"])
def test_multi_step_layers_keep_accuracy_when_quantized_and_pipelined(model: str, tmp_path) -> None:
    """APPNP (10 propagations in one layer) and GCNII (8 GCN2Conv layers, initial residual): 1-bit sync and
    pipelined runs end within 1 pp of their exact sync accuracy (mean of 3 seeds)."""
    runs = [f"{bits}:{seed}{sched}" for bits, sched in ((32, ""), (1, ""), (1, ":pipelined:5")) for seed in SEEDS]
    check(run_workers(["tests/workers/accuracy_worker.py", "--out", str(tmp_path), "--model", model, "--runs", *runs],
                      2, timeout=1800))  # fmt: skip
    acc = json.loads((tmp_path / "accuracy.json").read_text())

    def mean(tag: str) -> float:
        return sum(acc[f"{tag.split('|')[0]}:{s}{tag.split('|')[1]}"] for s in SEEDS) / len(SEEDS)

    exact, one_bit, piped = mean("32|"), mean("1|"), mean("1|:pipelined:5")
    print(f"{model} Cora test accuracy, mean of {len(SEEDS)} seeds: exact {exact:.4f}, 1-bit {one_bit:.4f}, "
          f"1-bit pipelined {piped:.4f}")  # fmt: skip
    assert exact > 0.75, acc
    assert abs(one_bit - exact) <= 0.01 and abs(piped - exact) <= 0.01, acc
