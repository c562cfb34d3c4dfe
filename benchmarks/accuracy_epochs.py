"""How many epochs the accuracy tests need: each model's runs at several epoch counts, and how each count decides them.

    python -m benchmarks.accuracy_epochs --epochs 30 50 100   # about 6 minutes on 2 cores

Runs ``tests/workers/accuracy_worker.py`` (2 local processes, Cora; the runs and seeds of
:mod:`tests.support.accuracy`) once per model and epoch count, and writes
``benchmarks/results/accuracy_epochs.json``: every run's test accuracy, the means over seeds, and
every assertion of ``tests/strategy/test_accuracy.py`` with its margin. The test suite trains at
the fewest epochs whose decisions equal those of the longest run; ``tests/strategy/test_accuracy.py``
checks that this file backs the count it uses.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.launch import check, run_workers
from tests.support.accuracy import MODELS, RUNS, SEEDS, checks, means
from tests.support.launch import PRELOAD

RESULT = Path(__file__).resolve().parent / "results" / "accuracy_epochs.json"


def measure(model: str, epochs: int, out: Path) -> dict[str, Any]:
    """One launch: every run of ``model`` at ``epochs``; its accuracies, means and decisions."""
    runs = [run.format(seed=seed) for run in RUNS.values() for seed in SEEDS]
    args = ["tests/workers/accuracy_worker.py", "--out", str(out), "--model", model, "--epochs", str(epochs)]
    start = time.perf_counter()
    check(run_workers([*args, "--runs", *runs], 2, timeout=3600, preload=PRELOAD))
    seconds = time.perf_counter() - start
    acc = json.loads((out / "accuracy.json").read_text())
    mean = means(acc)
    return {"model": model, "epochs": epochs, "seconds": round(seconds, 1), "runs": acc, "means": mean,
            "checks": {k: {"holds": h, "margin": round(m, 4)} for k, (h, m) in checks(model, mean).items()}}  # fmt: skip


def same_decisions(cells: list[dict[str, Any]], epochs: int) -> bool:
    """Whether every model's assertions hold or fail at ``epochs`` exactly as at the longest count stored."""
    for model in {c["model"] for c in cells}:
        mine = [c for c in cells if c["model"] == model]
        longest = max(mine, key=lambda c: c["epochs"])
        at = [c for c in mine if c["epochs"] == epochs]
        if not at:
            return False
        if {k: v["holds"] for k, v in at[0]["checks"].items()} != {k: v["holds"] for k, v in longest["checks"].items()}:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, nargs="+", default=[30, 50, 100])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--out", type=Path, default=RESULT)
    p.add_argument("--merge", action="store_true",
                   help="keep the stored cells of other epoch counts (the runs are seeded: a count measured again is the same)")
    a = p.parse_args(argv)
    cells = []
    if a.merge and a.out.is_file():
        cells = [c for c in json.loads(a.out.read_text())["cells"] if c["epochs"] not in a.epochs or c["model"] not in a.models]
    with tempfile.TemporaryDirectory(prefix="accuracy-epochs-") as tmp:
        for model in a.models:
            for epochs in sorted(a.epochs):
                cell = measure(model, epochs, Path(tmp) / f"{model}-{epochs}")
                print(json.dumps({k: cell[k] for k in ("model", "epochs", "seconds", "means")}), flush=True)
                cells.append(cell)
    counts = sorted({c["epochs"] for c in cells})
    fewest = min((e for e in counts if same_decisions(cells, e)), default=None)
    cells.sort(key=lambda c: (MODELS.index(c["model"]), c["epochs"]))
    a.out.write_text(json.dumps({"seeds": list(SEEDS), "ranks": 2, "graph": "cora", "cells": cells,
                                 "fewest_epochs_deciding_as_the_longest": fewest}, indent=1) + "\n")  # fmt: skip
    print(f"fewest epochs deciding every assertion as {max(counts)} do: {fewest}; wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
