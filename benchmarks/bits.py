"""Adaptive bit widths against every fixed width, trained to convergence on the testbed (issue 40).

    # the matrix: graphs x models x methods x seeds (cells that have a JSON are skipped)
    python -m benchmarks.bits run --graphs tolokers cornell5 amherst41 --models gcn sage --seeds 0 1 2
    # the tables and the generated "bits" section of docs/quantization.md
    python -m benchmarks.bits report
    # the output noise of 1-bit halos (what bit_target bounds) next to what more bits gain: "bits-noise" section
    python -m benchmarks.bits noise --graphs tolokers cornell5 amherst41 citeseer actor

Each cell is the time-to-accuracy harness's (:mod:`benchmarks.converge`): one ``benchmarks.bench_cell``
run, early stopping on the validation score, a wall-clock budget per graph, 2 testbed nodes at
100 Mbit/s, with the converge matrix's budgets and patience. Every method runs here
(``benchmarks/results/bits/<graph>/2n-100mbit/<model>-<method>-s<seed>.json``), so that the times
compared were measured side by side, with the same code. (The stored 32-bit cells of Tolokers,
amherst41 and cornell5's seed 0 are copies of the converge matrix's, 2026-12-02: 32-bit gives the
score and the target, not a time compared against.)

What the report computes (pure functions below, tested), per graph and model:

* the **test score at the epoch of best validation**, mean and spread over seeds, and its
  difference from 32-bit sync's mean (target: adaptive within 0.1 pp);
* **bytes per epoch** (forward + backward halo bytes of all ranks, the mean over the run's
  epochs) as a multiple of 1-bit sync's (target: at most 2x);
* **time to 32-bit's best validation** (the mean over its seeds of its best validation score):
  the median over seeds of the training seconds until a run first reaches it, ``inf`` if it never
  does (target: adaptive at most the best fixed width's, on at least 2 of 3 graphs per model);
* for adaptive runs, the widths it chose (share of (exchange, direction, epoch) at each width).

``noise`` runs each graph and model once at ``bits="adaptive", bit_budget=1`` (every exchange stays at
1 bit, and ``halo/noise`` reports its output noise) on 2 local processes, and tabulates that noise at
the first, middle and last epoch next to what 8 bits gain over 1 bit in the converged cells above
(``benchmarks/results/bits/noise/<graph>-<model>-<reduction>.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from benchmarks.converge import BUDGET, PATIENCE, _args, _budgets, median_time, run_curve, spread
from benchmarks.converge import time_to_target as _time_to_target
from benchmarks.harness import RESULTS, ROOT, cell_path, cluster_for, run_cell
from benchmarks.pages import write_section

#: method key -> (label, bits); every method runs in sync mode.
METHODS: dict[str, tuple[str, str]] = {
    "b32-sync": ("32-bit", "32"),
    "b1-sync": ("1-bit", "1"),
    "badaptive-sync": ("adaptive (1/2/4/8, budget 2x)", "adaptive"),
    "badaptive-plateau-sync": ("adaptive, budget on trial after a plateau (patience 5)", "adaptive"),
    "b2-sync": ("2-bit", "2"),
    "b4-sync": ("4-bit", "4"),
    "b8-sync": ("8-bit", "8"),
}
FIXED = ("b32-sync", "b8-sync", "b4-sync", "b2-sync", "b1-sync")
ADAPTIVE = "badaptive-sync"
#: the adaptive methods judged against the targets, and what each adds to bench_cell's arguments
ADAPTIVES = {ADAPTIVE: [], "badaptive-plateau-sync": ["--bit-patience", "5"]}
GRAPHS = ("tolokers", "cornell5", "amherst41")
#: the issue's targets
SCORE_PP = 0.1
BYTES_X = 2.0


# ----------------------------------------------------------------------------------------- pure math
def bytes_per_epoch(rec: dict[str, Any]) -> float:
    """Forward + backward halo bytes of all ranks per epoch, the mean over the run's epochs."""
    ranks = rec["ranks"]
    n = min(len(r["epochs"]) for r in ranks)
    if not n:
        return float("nan")
    return statistics.fmean(sum(r["epochs"][i]["fwd_bytes"] + r["epochs"][i]["bwd_bytes"] for r in ranks) for i in range(n))


def width_shares(rec: dict[str, Any]) -> dict[int, float]:
    """Of an adaptive run's (exchange, direction, epoch) choices (rank 0's: all ranks agree), the share at each width."""
    counts: Counter[int] = Counter()
    for e in rec["ranks"][0]["epochs"]:
        for per in e.get("widths", {}).values():
            counts.update(int(b) for b in per.values())
    total = sum(counts.values())
    return {b: counts[b] / total for b in sorted(counts)} if total else {}


def summarise_method(recs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """One method's seeds: test score at best validation, bytes per epoch, time to ``target``."""
    curves = [run_curve(r) for r in recs]
    test, test_sd = spread([c["test_at_best"] for c in curves])
    times = [_time_to_target(c["points"], target) for c in curves]
    return {
        "seeds": len(recs), "metric": curves[0]["metric"] if curves else "",
        "test": test, "test_sd": test_sd,
        "best_val": spread([c["best_val"] for c in curves])[0],
        "bytes_per_epoch": spread([bytes_per_epoch(r) for r in recs])[0],
        "time_to_target_s": median_time(times), "reached": sum(math.isfinite(t) for t in times),
        "epochs": spread([float(c["epochs"]) for c in curves])[0],
    }  # fmt: skip


def judge(rows: dict[str, dict[str, Any]], method: str = ADAPTIVE) -> dict[str, Any]:
    """The issue's three targets for one graph, model and adaptive ``method`` (``None`` where a needed method is
    missing)."""
    a, b32, b1 = rows.get(method), rows.get("b32-sync"), rows.get("b1-sync")
    fixed = [rows[m]["time_to_target_s"] for m in FIXED if m in rows]
    out: dict[str, Any] = {"score_gap_pp": None, "score_ok": None, "bytes_x": None, "bytes_ok": None,
                           "time_ok": None, "best_fixed_time_s": min(fixed) if fixed else None}  # fmt: skip
    if a and b32:
        out["score_gap_pp"] = 100 * (a["test"] - b32["test"])
        out["score_ok"] = out["score_gap_pp"] >= -SCORE_PP
    if a and b1 and b1["bytes_per_epoch"] > 0:
        out["bytes_x"] = a["bytes_per_epoch"] / b1["bytes_per_epoch"]
        out["bytes_ok"] = out["bytes_x"] <= BYTES_X + 1e-9
    if a and fixed:
        out["time_ok"] = a["time_to_target_s"] <= min(fixed)
    return out


# --------------------------------------------------------------------------------------------- running
def cell_file(graph: str, model: str, method: str, seed: int, a: argparse.Namespace) -> Path:
    rate = "local" if a.local else a.rate
    return RESULTS / "bits" / graph / f"{a.nodes}n-{rate}" / f"{model}-{method}-s{seed}.json"


def cmd_run(a: argparse.Namespace) -> None:
    deadline = (os.times().elapsed + 60 * a.max_minutes) if a.max_minutes else math.inf
    with cluster_for(a) as cluster:
        for seed in a.seeds:
            for graph in a.graphs:
                budget = a.budget.get(graph, BUDGET.get(graph, 30.0))
                for model in a.models:
                    for method in a.methods:
                        if cell_file(graph, model, method, seed, a).is_file() and not a.force:
                            continue
                        if os.times().elapsed + budget + 45 > deadline:
                            print(f"chunk time used up; stopped before {graph} {model} {method} s{seed}", flush=True)
                            return
                        bits = METHODS[method][1]
                        run_cell(graph, model, bits, "sync", a.nodes, a.rate, 100_000, cluster, a.force,  # type: ignore[arg-type]
                                 extra=_args(a, graph, seed, budget, ADAPTIVES.get(method, [])), name=f"{model}-{method}-s{seed}",
                                 timeout=budget + 600, label=f"bits/{graph}")  # fmt: skip


def load(graph: str, model: str, method: str, seeds: list[int], a: argparse.Namespace) -> list[dict[str, Any]]:
    recs = []
    for s in seeds:
        p = cell_file(graph, model, method, s, a)
        if p.is_file():
            rec = json.loads(p.read_text())
            if "ranks" in rec:  # a failed cell holds only its error
                recs.append(rec)
    return recs


def report(a: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for graph in a.graphs:
        for model in a.models:
            recs = {m: load(graph, model, m, a.seeds, a) for m in METHODS}
            recs = {m: r for m, r in recs.items() if r}
            if "b32-sync" not in recs:
                continue
            target = statistics.fmean(run_curve(r)["best_val"] for r in recs["b32-sync"])
            rows = {m: summarise_method(r, target) for m, r in recs.items()}
            judged, widths = {}, {}
            for method in ADAPTIVES:
                if method not in recs:
                    continue
                shares: Counter[int] = Counter()
                for r in recs[method]:
                    for b, f in width_shares(r).items():
                        shares[b] += f / len(recs[method])
                judged[method], widths[method] = judge(rows, method), dict(sorted(shares.items()))
            results[f"{graph}/{model}"] = {"target": target, "rows": rows, "judge": judged, "adaptive_widths": widths}
    return results


def _fmt_t(t: float) -> str:
    return "never" if not math.isfinite(t) else f"{t:.1f} s"


def render(results: dict[str, Any]) -> str:
    lines = ["| graph / model | method | seeds | test (mean ± sd) | vs 32-bit | bytes / epoch | vs 1-bit | "
             "time to 32-bit's best val (median; reached) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    verdicts = []
    for key, res in results.items():
        rows = res["rows"]
        b32, b1 = rows.get("b32-sync"), rows.get("b1-sync")
        for m, row in rows.items():
            gap = f"{100 * (row['test'] - b32['test']):+.2f} pp" if b32 else "—"
            bx = f"{row['bytes_per_epoch'] / b1['bytes_per_epoch']:.2f}x" if b1 and b1["bytes_per_epoch"] > 0 else "—"
            lines.append(f"| {key} | {METHODS[m][0]} | {row['seeds']} | {100 * row['test']:.2f} ± {100 * row['test_sd']:.2f} "
                         f"({row['metric'].replace('val_', '')}) | {gap} | {row['bytes_per_epoch'] / 1e6:.3f} MB | {bx} | "
                         f"{_fmt_t(row['time_to_target_s'])}; {row['reached']}/{row['seeds']} |")  # fmt: skip
        for method, j in res["judge"].items():
            widths = ", ".join(f"{b}-bit {100 * f:.0f} %" for b, f in res["adaptive_widths"][method].items()) or "—"
            verdicts.append(f"| {key} | {METHODS[method][0]} | {_ok(j['score_ok'], j['score_gap_pp'], '{:+.2f} pp')} | "
                            f"{_ok(j['bytes_ok'], j['bytes_x'], '{:.2f}x')} | {_ok(j['time_ok'], None, '')} | {widths} |")  # fmt: skip
    head = ["", "| graph / model | method | test within 0.1 pp of 32-bit | bytes ≤ 2x 1-bit | time ≤ best fixed width | "
            "its widths (share of choices) |", "|---|---|---|---|---|---|"]  # fmt: skip
    return "\n".join(lines + head + verdicts) + "\n"


# ------------------------------------------------------------------------------------ 1-bit output noise
def noise_points(rec: dict[str, Any]) -> dict[str, list[float]]:
    """Of a run at ``bit_budget=1``, per direction: the largest output noise over its exchanges at the first measured,
    the middle and the last epoch (rank 0's: all ranks agree)."""
    epochs = [e for e in rec["ranks"][0]["epochs"] if any(e.get("noise", {}).values())]  # the first decides nothing
    if not epochs:
        return {}
    picks = [epochs[0], epochs[len(epochs) // 2], epochs[-1]]
    return {d: [max(per.get(d, 0.0) for per in e["noise"].values()) for e in picks] for d in ("fwd", "bwd")}


def width_gain_pp(results: dict[str, Any], key: str) -> Optional[float]:
    """8-bit's mean test score minus 1-bit's, in points, from :func:`report`'s results (``None``: not run)."""
    rows = results.get(key, {}).get("rows", {})
    if "b8-sync" not in rows or "b1-sync" not in rows:
        return None
    return 100 * (rows["b8-sync"]["test"] - rows["b1-sync"]["test"])


def render_noise(noise: dict[str, dict[str, list[float]]], results: dict[str, Any]) -> str:
    lines = ["| graph / model | halos | forward noise at 1 bit (first / mid / last epoch) | backward | 8-bit minus 1-bit test |",
             "|---|---|---|---|---|"]  # fmt: skip
    for key, points in noise.items():
        graph, model, reduction = key.split("/")
        gain = width_gain_pp(results, f"{graph}/{model}")
        what = "partial sums" if reduction == "cover" else "every row"
        lines.append(f"| {graph}/{model} | {what} | {' / '.join(f'{v:.3g}' for v in points['fwd'])} | "
                     f"{' / '.join(f'{v:.3g}' for v in points['bwd'])} | "
                     f"{'not run' if gain is None else f'{gain:+.2f} pp'} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def noise_file(graph: str, model: str, reduction: str) -> Path:
    return RESULTS / "bits" / "noise" / f"{graph}-{model}-{reduction}.json"


def cmd_noise(a: argparse.Namespace) -> None:
    noise = {}
    for graph in a.graphs:
        for model in a.models:
            for reduction in a.reductions:
                path = noise_file(graph, model, reduction)
                if not path.is_file() or a.force:
                    extra = ["--bit-budget", "1.0", "--seed", "0", "--halo-reduction", reduction, "--hidden", str(a.hidden)]
                    run_cell(graph, model, "adaptive", "sync", 2, "local", a.epochs, None, True, extra=extra,  # type: ignore[arg-type]
                             name=f"{model}-{reduction}", label="bits/noise-cells")
                    cell = cell_path("bits/noise-cells", 2, "local", f"{model}-{reduction}")
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(cell.read_text())
                    cell.unlink()
                noise[f"{graph}/{model}/{reduction}"] = noise_points(json.loads(path.read_text()))
    a.graphs = [g for g in a.graphs if g in GRAPHS]
    body = render_noise(noise, report(a) if a.graphs else {})
    print(body)
    write_section(Path(a.page), "bits-noise", body)


def _ok(ok: Optional[bool], value: Optional[float], fmt: str) -> str:
    if ok is None:
        return "not run"
    return ("yes" if ok else "**no**") + (f" ({fmt.format(value)})" if value is not None and fmt else "")


def cmd_report(a: argparse.Namespace) -> None:
    results = report(a)
    (RESULTS / "bits.json").write_text(json.dumps(results, indent=1, default=str))
    body = render(results)
    print(body)
    write_section(Path(a.page), "bits", body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("run", "report", "noise"):
        p = sub.add_parser(name)
        p.add_argument("--graphs", nargs="+", default=list(GRAPHS))
        p.add_argument("--models", nargs="+", default=["gcn", "sage"])
        p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
        p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
        p.add_argument("--rate", default="100mbit")
        p.add_argument("--nodes", type=int, default=2)
        p.add_argument("--hidden", type=int, default=256)
        p.add_argument("--patience", type=int, default=PATIENCE)
        p.add_argument("--budget", nargs="*", default=[], help=f"GRAPH=SECONDS of fit() per run (defaults: {BUDGET})")
        p.add_argument("--max-minutes", type=float, default=0, help="start no cell that would end after this many minutes")
        p.add_argument("--local", action="store_true", help="local processes instead of the SLURM testbed")
        p.add_argument("--force", action="store_true")
        p.add_argument("--page", default=str(ROOT / "docs" / "quantization.md"))
        if name == "noise":
            p.add_argument("--reductions", nargs="+", default=["cover"], choices=["cover", "none"])
            p.add_argument("--epochs", type=int, default=80)
    a = parser.parse_args()
    a.budget = _budgets(a.budget)
    if a.local:
        a.rate = "local"
    os.environ.setdefault("LIGHTNING_HALO_CACHE", str(RESULTS / "tmp" / "cache"))
    {"run": cmd_run, "report": cmd_report, "noise": cmd_noise}[a.cmd](a)


if __name__ == "__main__":
    main()
