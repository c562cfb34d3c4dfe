"""What pipelining costs or saves per epoch where the synchronous wait is already small: A/B pairs.

    # repeated pairs on the testbed, side by side: sync then pipelined, `--repeats` times
    python -m benchmarks.pipeline_cost run --graph tolokers --models gcn sage --layers 3 --bits 1 --nodes 2 --rate 100mbit
    # where 1-bit sync still waits: adaptive and pipelined against sync on a slower link
    python -m benchmarks.pipeline_cost run --graph tolokers --models gcn --modes sync pipelined adaptive --rate 10mbit
    # the generated section of docs/benchmarks.md
    python -m benchmarks.pipeline_cost report

Each cell records, per epoch and rank, the step split into forward (to the loss), backward
(with DDP's gradient all-reduce) and the rest (optimizer), each with the halo wait inside it
(:class:`benchmarks.bench_cell.Probe`). A pair's ratio is pipelined over sync of the slowest
rank's median epoch; pairs alternate the order of their two cells, so a drift of the machine's
load over the run shows as spread, not as a cost of one mode.

Results: ``benchmarks/results/pipeline-cost/<graph>/<n>n-<rate>/<model>-b<bits>-<mode>-l<layers>-r<k>.json``
and the summary ``benchmarks/results/pipeline-cost/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, ROOT, cluster_for, run_cell
from benchmarks.pages import write_section
from benchmarks.summary import WARMUP

OUT = RESULTS / "pipeline-cost"
PHASES = ("forward_s", "backward_s", "optimizer_s", "forward_wait_s", "backward_wait_s", "codec_s", "allreduce_s", "cpu_s")


def phase_medians(record: dict[str, Any]) -> dict[str, float]:
    """Median per phase over the measured epochs (after warm-up), of the slowest rank in each epoch."""
    ranks = record["ranks"]
    n = min(len(r["epochs"]) for r in ranks)
    slowest = [max(ranks, key=lambda r: r["epochs"][e]["step_s"])["epochs"][e] for e in range(min(WARMUP, n - 1), n)]
    out = {"epoch_s": statistics.median(e["step_s"] for e in slowest)}
    decided = [(e["stale_layers"], e["layers"]) for e in slowest if "stale_layers" in e]
    if decided:  # adaptive: the share of stale layer decisions in the measured epochs
        out["stale_share"] = sum(s for s, _ in decided) / max(sum(n for _, n in decided), 1)
    for key in PHASES:
        values = [e[key] for e in slowest if key in e]
        if values:
            out[key] = statistics.median(values)
    return out


def pair_summary(cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One repeat: every cell's phase medians, and each mode's epoch over sync's (``ratio``: pipelined's)."""
    phases = {mode: phase_medians(rec) for mode, rec in cells.items()}
    sync = phases["sync"]
    ratios = {mode: p["epoch_s"] / sync["epoch_s"] for mode, p in phases.items() if mode != "sync"}
    return {**phases, "ratios": ratios, "ratio": ratios.get("pipelined", float("nan")),
            "sync_wait_share": _wait(sync) / sync["epoch_s"]}  # fmt: skip


def _wait(p: dict[str, float]) -> float:
    return p.get("forward_wait_s", 0.0) + p.get("backward_wait_s", 0.0)


def run_pairs(a: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with cluster_for(a) as cluster:
        for model in a.models:
            for bits in a.bits:
                for k in range(a.repeats):
                    order = tuple(a.modes) if k % 2 == 0 else tuple(reversed(a.modes))
                    cells = {}
                    for mode in order:
                        cells[mode] = run_cell(
                            a.graph, model, bits, mode, a.nodes, a.rate, a.epochs, cluster, force=True,
                            extra=["--layers", str(a.layers), "--eval-every", str(a.epochs), "--hidden", str(a.hidden)],
                            name=f"{model}-b{bits}-{mode}-l{a.layers}-r{k}", label=f"pipeline-cost/{a.graph}",
                        )  # fmt: skip
                    if any("failed" in c for c in cells.values()):
                        continue
                    row = {"graph": a.graph, "model": model, "bits": bits, "layers": a.layers, "repeat": k,
                           "nodes": a.nodes, "rate": a.rate if cluster else "local", "order": list(order),
                           **pair_summary(cells)}  # fmt: skip
                    rows.append(row)
                    ratios = ", ".join(f"{m}/sync {v:.3f}" for m, v in row["ratios"].items())
                    print(f"{model} b{bits} repeat {k}: {ratios} (sync waits {100 * row['sync_wait_share']:.1f} %)", flush=True)
    _save(rows)
    return rows


def _save(rows: list[dict[str, Any]]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "summary.json"
    old = json.loads(path.read_text()) if path.is_file() else []
    keys = {(r["graph"], r["model"], r["bits"], r["layers"], r["rate"], r["repeat"]) for r in rows}
    kept = [r for r in old if (r["graph"], r["model"], r["bits"], r["layers"], r["rate"], r["repeat"]) not in keys]
    path.write_text(json.dumps(kept + rows, indent=1))


def render() -> str:
    path = OUT / "summary.json"
    rows = json.loads(path.read_text()) if path.is_file() else []
    if not rows:
        return "_No pairs measured yet: run `python -m benchmarks.pipeline_cost run`._\n"
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["graph"], r["model"], r["bits"], r["layers"], r["nodes"], r["rate"]), []).append(r)
    lines = [
        "Generated by `python -m benchmarks.pipeline_cost` from `benchmarks/results/pipeline-cost/summary.json`. Per",
        "repeat, the cells run back to back (order reversed every other repeat); each cell's figure is the slowest",
        "rank's median epoch after warm-up, and the phases (forward / backward with DDP's all-reduce / optimizer, each",
        "a median, so they need not add up exactly) and the halo wait inside them. Ratio = the mode's epoch over",
        "sync's in the same repeat: the median of the repeats, and their range. CPU = the process's CPU time in the",
        "epoch (all its threads, gloo's included): work done, which a loaded machine changes far less than wall time.",
        "",
        "| graph | model | bits | layers | link | repeats | mode | epoch (s) | CPU (s) | fwd / bwd / opt (s) | halo wait (s) | ratio to sync (range) |",
        "|---|---|---:|---:|---|---:|---|---:|---:|---|---:|---|",
    ]
    for (graph, model, bits, layers, nodes, rate), rs in sorted(groups.items()):
        modes = [m for m in ("sync", "pipelined", "adaptive", "pipelined5", "periodic") if all(m in r for r in rs)]
        for mode in modes:
            med = {k: statistics.median(r[mode].get(k, float("nan")) for r in rs) for k in ("epoch_s", *PHASES)}
            wait = statistics.median(_wait(r[mode]) for r in rs)
            ratio, label = "–", mode
            if "stale_share" in rs[0][mode]:  # adaptive: the share of its layer decisions that were stale
                label = f"{mode} ({100 * statistics.median(r[mode]['stale_share'] for r in rs):.0f} % stale)"
            if mode != "sync":
                values = [r["ratios"][mode] if "ratios" in r else r["ratio"] for r in rs]
                ratio = f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"
            lines.append(
                f"| {graph} | {model} | {bits} | {layers} | {nodes} nodes, {rate} | {len(rs)} | {label} | {med['epoch_s']:.3f} | {med['cpu_s']:.3f} | "
                f"{med['forward_s']:.3f} / {med['backward_s']:.3f} / {med['optimizer_s']:.3f} | {wait:.3f} | {ratio} |"
            )
    return "\n".join(lines) + "\n"


def write_report(page: Path) -> None:
    write_section(page, "pipeline-cost", render() + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="A/B pairs of sync and pipelined cells")
    run.add_argument("--graph", default="tolokers")
    run.add_argument("--models", nargs="+", default=["gcn", "sage"])
    run.add_argument("--bits", nargs="+", type=int, default=[1])
    run.add_argument("--modes", nargs="+", default=["sync", "pipelined"], help="bench_cell modes; sync first (the reference)")
    run.add_argument("--layers", type=int, default=3)
    run.add_argument("--hidden", type=int, default=256)
    run.add_argument("--epochs", type=int, default=20)
    run.add_argument("--repeats", type=int, default=4)
    run.add_argument("--nodes", type=int, default=2)
    run.add_argument("--rate", default="100mbit")
    run.add_argument("--local", action="store_true", help="local processes instead of the SLURM testbed")
    rep = sub.add_parser("report", help="the generated section of docs/benchmarks.md")
    rep.add_argument("--page", default=str(ROOT / "docs" / "benchmarks.md"))
    a = parser.parse_args()
    if a.cmd == "run":
        run_pairs(a)
    else:
        write_report(Path(a.page))


if __name__ == "__main__":
    main()
