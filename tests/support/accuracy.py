"""The accuracy tests' runs and thresholds, defined once: used by tests/strategy/test_accuracy.py and by
``python -m benchmarks.accuracy_epochs``, which stores how each epoch count decides them."""

from __future__ import annotations

SEEDS = (0, 1, 2)
MODELS = ("gcn", "appnp", "gcnii")
#: One launch per model trains every run the tests compare, three seeds each.
RUNS = {"exact": "32:{seed}", "one_bit": "1:{seed}", "pipelined": "1:{seed}:pipelined:5"}


def means(acc: dict[str, float]) -> dict[str, float]:
    """Mean test accuracy over the seeds of each kind of run, from the worker's ``{run: accuracy}``."""
    return {kind: sum(acc[run.format(seed=s)] for s in SEEDS) / len(SEEDS) for kind, run in RUNS.items()}


def checks(model: str, mean: dict[str, float]) -> dict[str, tuple[bool, float]]:
    """Every assertion of the accuracy tests: ``name -> (holds, margin)``; a margin below 0 fails.

    1-bit sync is within 1.5 pp of exact for GCN and 1 pp for APPNP and GCNII (multi-step layers);
    pipelined 1-bit (sync every 5 epochs) is within 2 pp of 1-bit sync for GCN, within 1 pp of
    exact for the multi-step layers; the exact and 1-bit runs themselves learn (above 75 %).
    """
    tol = 0.015 if model == "gcn" else 0.01
    margins = {
        "exact_learns": mean["exact"] - 0.75,
        "one_bit_learns": mean["one_bit"] - 0.75,
        "one_bit_close_to_exact": tol - abs(mean["one_bit"] - mean["exact"]),
        "pipelined_close": (0.02 - abs(mean["pipelined"] - mean["one_bit"])) if model == "gcn"
        else (0.01 - abs(mean["pipelined"] - mean["exact"])),
    }  # fmt: skip
    return {name: (m >= 0, m) for name, m in margins.items()}
