"""Pure summaries of benchmark cells: the figures the harness prints and the report tables show."""

from __future__ import annotations

import statistics
from typing import Any

from lightning_halo.quant.format import SUPPORTED_BITS

WARMUP = 3  # epochs excluded from timing medians (JIT, first-touch, input-feature exchange)
#: The matrix's axes (one definition; the harness runs them, the report orders its tables by them).
BITS = tuple(sorted(SUPPORTED_BITS, reverse=True))
MODES = ("sync", "pipelined", "pipelined5", "periodic")
MODELS = ("gcn", "sage", "gat")


def summarise(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Median per-epoch figures after warm-up (slowest rank per epoch), traffic, accuracy, memory."""
    n_epochs = min(len(r["epochs"]) for r in ranks)
    measured = range(min(WARMUP, max(n_epochs - 1, 0)), n_epochs)

    # Per epoch, the slowest rank sets the pace; its own waits are the communication that really
    # delayed the epoch (a faster rank's waits also contain its idling for the slow one).
    slowest = [max(ranks, key=lambda r: r["epochs"][e]["step_s"])["epochs"][e] for e in measured]
    step = [e["step_s"] for e in slowest]
    wait, codec, allreduce = ([e.get(k, 0.0) for e in slowest] for k in ("wait_s", "codec_s", "allreduce_s"))
    med = statistics.median
    breakdown = {"wait_s": med(wait), "codec_s": med(codec), "allreduce_s": med(allreduce)}
    breakdown["compute_s"] = max(med(step) - sum(breakdown.values()), 0.0)
    e0 = ranks[0]["epochs"]
    curve = [
        {"epoch": e["epoch"], "train_wall_s": max(r["epochs"][i]["train_wall_s"] for r in ranks),
         **{k: e[k] for k in ("val_acc", "test_acc", "val_auroc", "test_auroc") if k in e}}
        for i, e in enumerate(e0[:n_epochs])
    ]  # fmt: skip
    best = max(curve, key=lambda c: c.get("val_auroc", c.get("val_acc", 0.0)))
    # every epoch after the first (the first also carries warm-up effects): a periodic run sends in its
    # refresh epochs only, and a short run's timing window may hold none of them
    traffic = [sum(r["epochs"][e]["fwd_bytes"] + r["epochs"][e]["bwd_bytes"] for r in ranks) for e in range(min(1, n_epochs - 1), n_epochs)]
    bounds = [r["kernel_bound"]["bound_s"] for r in ranks if r.get("kernel_bound")]
    bound = {}
    if bounds:  # the slowest partition's kernels bound the epoch
        bound = {"kernel_bound_s": max(bounds), "compute_over_bound": breakdown["compute_s"] / max(bounds)}
    return {
        "epoch_s": med(step),
        "epoch_s_mean": statistics.fmean(step),
        "breakdown": breakdown,
        **bound,
        "bytes_per_epoch": statistics.fmean(traffic),
        "once_bytes": sum(r["epochs"][0]["once_bytes"] for r in ranks),
        "final": {k: curve[-1][k] for k in curve[-1] if k not in ("epoch", "train_wall_s")},
        "best_val": {k: best[k] for k in best if k != "train_wall_s"},
        "curve": curve,
        "peak_rss_mb": max(r["peak_rss_mb"] for r in ranks),
        "peak_rss_mb_per_rank": [r["peak_rss_mb"] for r in ranks],
        "total_s": max(r["total_s"] for r in ranks),
    }
