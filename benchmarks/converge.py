"""Time to accuracy: every method trained until early stopping or a shared wall-clock budget (issue 27).

    # NeighborLoader's fan-outs and batch size, chosen on one seed by best validation within the budget
    python -m benchmarks.converge tune --graphs tolokers cornell5 amherst41 johnshopkins55 --rate 100mbit
    # the matrix: graphs x models x methods x seeds x rates (cells that have a JSON are skipped)
    python -m benchmarks.converge run --graphs tolokers --models gcn sage --rates 100mbit --seeds 0 1 2
    # tables, plots (docs/img/) and the generated "converge" section of docs/benchmarks.md
    python -m benchmarks.converge report

Cells run on ``../shared/testbed/cluster.sh`` through the harness's launcher (``--local``: local
processes, no shaping). Each cell is one ``benchmarks.bench_cell`` run with ``--patience`` (Lightning's
``EarlyStopping`` on the validation score: ROC-AUC for binary graphs, accuracy otherwise, counted in
validations, one per epoch) and ``--time-budget`` (``Trainer(max_time=...)``: the whole of ``fit``,
evaluation included). The single-process baseline runs once per graph/model/seed (it has no
network) and appears in every rate's table. Results:
``benchmarks/results/converge/<graph>/<nodes>n-<rate>/<model>-<method>-s<seed>.json`` (the harness's
cell record: config, every rank's per-epoch records, summary).

What the report computes (pure functions below, tested): per run, the curve of validation score
against cumulative *training* wall time of the slowest rank (evaluation excluded), the best
validation score, the test score at the epoch of best validation, epochs and optimizer steps; per
graph/model/rate, the **common target** = the lowest, over methods, of the method's best validation
score averaged over its seeds, and each run's time to first reach it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, ROOT, Cluster, cluster_for, run_cell
from benchmarks.pages import write_section

OUT = RESULTS / "converge"
TUNING = OUT / "neighbor_tuning.json"
#: method key -> (label on the page, bits, mode, extra bench_cell arguments)
METHODS: dict[str, tuple[str, int, str, list[str]]] = {
    "b32-sync": ("32-bit sync", 32, "sync", []),
    "b1-sync": ("1-bit sync", 1, "sync", []),
    "b1-pipelined": ("1-bit pipelined", 1, "pipelined", []),
    "b1-pipelined5": ("1-bit pipelined + sync_every=5", 1, "pipelined5", []),
    "b1-adaptive": ("1-bit adaptive", 1, "adaptive", []),
    "neighbor": ("DDP + NeighborLoader", 32, "sync", ["--baseline", "neighbor"]),
    "single": ("single process (1 core)", 32, "sync", ["--baseline", "single"]),  # + --sparse, see run_one
}
ONE_BIT = ("b1-sync", "b1-pipelined", "b1-pipelined5", "b1-adaptive")
GRAPHS = ("tolokers", "cornell5", "amherst41", "johnshopkins55")
#: seconds of fit() per run, per graph: enough for 32-bit sync at 100 Mbit/s to train for tens of epochs
BUDGET = {"tolokers": 20.0, "cornell5": 40.0, "amherst41": 12.0, "johnshopkins55": 15.0}
PATIENCE = 20
#: NeighborLoader settings `tune` tries: (batch size, fan-out per hop)
GRID = [(256, [10, 10]), (1024, [10, 10]), (1024, [25, 10])]
DEFAULT_NEIGHBOR = {"batch_size": 1024, "fanout": [10, 10]}


# ----------------------------------------------------------------------------------------- pure math
def val_key(curve: list[dict[str, Any]]) -> str:
    return "val_auroc" if any("val_auroc" in p for p in curve) else "val_acc"


def run_curve(rec: dict[str, Any]) -> dict[str, Any]:
    """One run's convergence figures from its ranks' per-epoch records.

    ``points``: (cumulative training seconds of the slowest rank, validation score) per validated
    epoch; best validation, the test score at that epoch, epochs run and optimizer steps.
    """
    ranks = rec["ranks"]
    n = min(len(r["epochs"]) for r in ranks)
    e0 = ranks[0]["epochs"][:n]
    key = val_key(e0)
    test_key = key.replace("val", "test")
    points, best = [], None
    for i, e in enumerate(e0):
        if key not in e:
            continue
        t = max(r["epochs"][i]["train_wall_s"] for r in ranks)
        points.append((t, e[key]))
        if best is None or e[key] > best[1]:  # the first epoch reaching the maximum
            best = (e["epoch"], e[key], e.get(test_key, float("nan")), t)
    return {
        "metric": key, "points": points,
        "best_val": best[1] if best else float("nan"), "test_at_best": best[2] if best else float("nan"),
        "best_epoch": best[0] if best else -1, "time_to_best_s": best[3] if best else float("nan"),
        "epochs": n, "steps": max(r["epochs"][n - 1].get("steps", n) for r in ranks) if n else 0,
        "train_s": points[-1][0] if points else 0.0,
        "stopped_by": ranks[0].get("stopped_by", "?"),
    }  # fmt: skip


def time_to_target(points: list[tuple[float, float]], target: float) -> float:
    """Training seconds until the validation score first reaches ``target`` (``inf`` if it never does)."""
    return next((t for t, v in points if v >= target - 1e-12), math.inf)


def common_target(best_by_method: dict[str, list[float]]) -> float:
    """The lowest, over methods, of the mean best validation score over the method's seeds.

    Every method reaches it on average; a seed below its method's mean may not (reported as such).
    """
    return min(statistics.fmean(v) for v in best_by_method.values() if v)


def spread(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) of the finite values; ``nan`` if none."""
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return float("nan"), float("nan")
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def median_time(times: list[float]) -> float:
    """Median time to a target over seeds; a seed that never reached it counts as infinitely late."""
    return statistics.median(times) if times else math.inf


# --------------------------------------------------------------------------------------------- running
def cell_dir(graph: str) -> str:
    return f"converge/{graph}"


def neighbor_setting(graph: str, model: str) -> dict[str, Any]:
    """The tuned NeighborLoader setting of the graph (this model's, else the one tuned on another model), else the default."""
    tuned = json.loads(TUNING.read_text()) if TUNING.is_file() else {}
    by = tuned.get(graph, {})
    t = by.get(model) or next(iter(by.values()), {})
    return t.get("chosen", DEFAULT_NEIGHBOR)


def _args(a: argparse.Namespace, graph: str, seed: int, budget: float, extra: list[str]) -> list[str]:
    return ["--seed", str(seed), "--patience", str(a.patience), "--time-budget", str(budget), "--eval-every", "1",
            "--hidden", str(a.hidden), *extra]  # fmt: skip


def run_one(a: argparse.Namespace, graph: str, model: str, method: str, seed: int, rate: str, cluster: Cluster | None,
            extra: list[str] | None = None, name: str | None = None) -> dict[str, Any]:  # fmt: skip
    _, bits, mode, more = METHODS[method]
    budget = a.budget.get(graph, BUDGET.get(graph, 30.0))
    if method == "neighbor" and extra is None:
        s = neighbor_setting(graph, model)
        more = [*more, "--batch-size", str(s["batch_size"]), "--fanout", *map(str, s["fanout"])]
    single = method == "single"
    # the plain model on a sparse adjacency: PyG's fast single-process path (GAT has none)
    if single and model != "gat":
        more = [*more, "--sparse"]
    return run_cell(graph, model, bits, mode, 1 if single else a.nodes, rate, 100_000, None if single else cluster,
                    a.force, extra=_args(a, graph, seed, budget, [*more, *(extra or [])]),
                    name=name or f"{model}-{method}-s{seed}", timeout=budget + 600, label=cell_dir(graph))  # fmt: skip


def _deadline(a: argparse.Namespace) -> float:
    return time.monotonic() + 60 * a.max_minutes if a.max_minutes else math.inf


def _fits(a: argparse.Namespace, graph: str, deadline: float) -> bool:
    """Whether one more cell (its budget plus start-up) fits before the chunk's deadline."""
    return time.monotonic() + a.budget.get(graph, BUDGET.get(graph, 30.0)) + 45 < deadline


def _done(graph: str, model: str, method: str, seed: int, rate: str, a: argparse.Namespace) -> bool:
    nodes, r = (1, "local") if method == "single" else (a.nodes, "local" if a.local else rate)
    return (OUT / graph / f"{nodes}n-{r}" / f"{model}-{method}-s{seed}.json").is_file() and not a.force


def cmd_run(a: argparse.Namespace) -> None:
    deadline = _deadline(a)
    with cluster_for(a) as cluster:
        for rate in a.rates:
            for seed in a.seeds:
                for graph in a.graphs:
                    for model in a.models:
                        for method in a.methods:
                            if _done(graph, model, method, seed, rate, a):
                                continue
                            if not _fits(a, graph, deadline):
                                print(
                                    f"chunk time used up; stopped before {graph} {rate} {model} {method} s{seed}",
                                    flush=True,
                                )
                                return
                            if method == "single" and cluster:
                                cluster.down()  # nothing else runs while a single process is timed
                            run_one(a, graph, model, method, seed, rate, cluster)


def cmd_tune(a: argparse.Namespace) -> None:
    """NeighborLoader: each (batch size, fan-outs) of the grid on one seed; the best validation within the budget wins."""
    tuned = json.loads(TUNING.read_text()) if TUNING.is_file() else {}
    deadline = _deadline(a)
    with cluster_for(a) as cluster:
        for graph in a.graphs:
            for model in a.models:
                cands = []
                for bs, fan in GRID:
                    name = f"{model}-neighbor-tune-b{bs}-f{'x'.join(map(str, fan))}-s{a.seeds[0]}"
                    path = OUT / graph / f"{a.nodes}n-{'local' if a.local else a.rates[0]}" / f"{name}.json"
                    if not path.is_file() and not _fits(a, graph, deadline):
                        print(f"chunk time used up; stopped before tuning {graph} {model} {bs} {fan}", flush=True)
                        return _write_tuning(tuned)
                    rec = run_one(a, graph, model, "neighbor", a.seeds[0], a.rates[0], cluster, name=name,
                                  extra=["--batch-size", str(bs), "--fanout", *map(str, fan)])  # fmt: skip
                    if "ranks" in rec:
                        c = run_curve(rec)
                        cands.append({"batch_size": bs, "fanout": fan, "best_val": c["best_val"], "epochs": c["epochs"],
                                      "steps": c["steps"], "cell": str(path.relative_to(RESULTS))})  # fmt: skip
                if cands:
                    best = max(cands, key=lambda c: c["best_val"])
                    tuned.setdefault(graph, {})[model] = {
                        "chosen": {"batch_size": best["batch_size"], "fanout": best["fanout"]}, "candidates": cands,
                        "seed": a.seeds[0], "rate": a.rates[0], "budget_s": a.budget.get(graph, BUDGET.get(graph, 30.0)),
                    }  # fmt: skip
                    _write_tuning(tuned)


def _write_tuning(tuned: dict[str, Any]) -> None:
    TUNING.parent.mkdir(parents=True, exist_ok=True)
    TUNING.write_text(json.dumps(tuned, indent=1))


# --------------------------------------------------------------------------------------------- report
def load_runs(root: Path = OUT) -> dict[tuple[str, str, str], dict[str, list[dict[str, Any]]]]:
    """``{(graph, rate, model): {method: [run_curve per seed]}}``; single-process runs join every rate of their graph."""
    runs: dict[tuple[str, str, str], dict[str, list[dict[str, Any]]]] = {}
    singles: dict[tuple[str, str], list[dict[str, Any]]] = {}
    pat = re.compile(r"^(?P<model>[a-z]+)-(?P<method>[a-z0-9-]+)-s(?P<seed>\d+)$")
    for path in sorted(root.glob("*/*/*.json")):
        m = pat.match(path.stem)
        if not m or m["method"] not in METHODS:  # tuning cells, other files
            continue
        rec = json.loads(path.read_text())
        graph, folder = path.parts[-3], path.parts[-2]
        if "failed" in rec:
            c = {"failed": rec["failed"], "seed": int(m["seed"])}
        else:
            c = {**run_curve(rec), "seed": int(m["seed"])}
        if m["method"] == "single":
            singles.setdefault((graph, m["model"]), []).append(c)
            continue
        rate = folder.split("-", 1)[1]
        runs.setdefault((graph, rate, m["model"]), {}).setdefault(m["method"], []).append(c)
    for (graph, rate, model), by in runs.items():
        if (graph, model) in singles:
            by["single"] = singles[(graph, model)]
    return runs


def summarise_group(by: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per method: mean ± spread of the figures over seeds, and times to the common target and to NeighborLoader's best."""
    ok = {m: [c for c in cs if "failed" not in c] for m, cs in by.items()}
    ok = {m: cs for m, cs in ok.items() if cs}
    if not ok:
        return {"target": float("nan"), "methods": {}}
    target = common_target({m: [c["best_val"] for c in cs] for m, cs in ok.items()})
    nl = spread([c["best_val"] for c in ok.get("neighbor", [])])[0]
    out: dict[str, Any] = {"target": target, "neighbor_best": nl, "methods": {}}
    for m, cs in ok.items():
        t = [time_to_target(c["points"], target) for c in cs]
        tn = [time_to_target(c["points"], nl) for c in cs] if math.isfinite(nl) else []
        out["methods"][m] = {
            "seeds": sorted(c["seed"] for c in cs),
            "failed": sum(1 for c in by[m] if "failed" in c),
            "time_to_target": spread(t), "reached": sum(math.isfinite(x) for x in t), "median_time_to_target": median_time(t),
            "time_to_neighbor_best": spread(tn), "reached_neighbor_best": sum(math.isfinite(x) for x in tn),
            "median_time_to_neighbor_best": median_time(tn),
            "time_to_best": spread([c["time_to_best_s"] for c in cs]),
            "best_val": spread([c["best_val"] for c in cs]), "test_at_best": spread([c["test_at_best"] for c in cs]),
            "epochs": spread([c["epochs"] for c in cs]), "steps": spread([c["steps"] for c in cs]),
            "train_s": spread([c["train_s"] for c in cs]),
            "stopped_by": sorted({c["stopped_by"] for c in cs}),
        }  # fmt: skip
    return out


def best_one_bit(summary: dict[str, Any]) -> str | None:
    """The 1-bit mode with the shortest median time to NeighborLoader's best validation score (ties: best validation)."""
    cands = [m for m in ONE_BIT if m in summary["methods"]]
    if not cands:
        return None
    return min(
        cands,
        key=lambda m: (summary["methods"][m]["median_time_to_neighbor_best"], -summary["methods"][m]["best_val"][0]),
    )


def verdict(summary: dict[str, Any]) -> tuple[str, bool, float, float] | None:
    """(best 1-bit mode, whether it reaches NeighborLoader's best sooner, its time, NeighborLoader's).

    NeighborLoader's best is its best validation score averaged over its seeds, and its time the
    mean over its seeds of the training time at which it reached its own best; the 1-bit mode's
    time is its median over seeds of the time to first reach that score (never: infinite).
    """
    m = best_one_bit(summary)
    if m is None or "neighbor" not in summary["methods"]:
        return None
    t1 = summary["methods"][m]["median_time_to_neighbor_best"]
    tn = summary["methods"]["neighbor"]["time_to_best"][0]
    return m, t1 < tn, t1, tn


def _pm(ms: tuple[float, float], fmt: str = ".4f") -> str:
    mean, sd = ms
    if not math.isfinite(mean):
        return "–"
    return f"{mean:{fmt}} ± {sd:{fmt}}"


def _time(s: dict[str, Any], key: str, reached: str, n: int, target: float = 0.0) -> str:
    if not math.isfinite(target):
        return "–"  # no such target (e.g. NeighborLoader did not run)
    if s[reached] == 0:
        return f"not reached (0/{n})"
    return f"{_pm(s[key], '.1f')} s" + (f" ({s[reached]}/{n})" if s[reached] < n else "")


def group_table(summary: dict[str, Any]) -> list[str]:
    rows = [("| method | seeds | time to common target | time to NeighborLoader's best | best val | test at best val | epochs | "
             "optimizer steps | training s | stopped by |"),
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for m in METHODS:
        s = summary["methods"].get(m)
        if s is None:
            continue
        n = len(s["seeds"])
        failed = f" (+{s['failed']} failed)" if s["failed"] else ""
        rows.append(f"| {METHODS[m][0]} | {n}{failed} | "
                    f"{_time(s, 'time_to_target', 'reached', n)} | {_time(s, 'time_to_neighbor_best', 'reached_neighbor_best', n, summary['neighbor_best'])} | "
                    f"{_pm(s['best_val'])} | {_pm(s['test_at_best'])} | {_pm(s['epochs'], '.0f')} | {_pm(s['steps'], '.0f')} | "
                    f"{_pm(s['train_s'], '.1f')} | {', '.join(s['stopped_by'])} |")  # fmt: skip
    return rows


def plot_group(
    graph: str, rate: str, groups: dict[str, dict[str, list[dict[str, Any]]]], summaries: dict[str, Any], img: Path
) -> str:
    """Validation score against cumulative training time, one panel per model, every seed drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.report import FIG_W, STYLE, _save, _shared_legend

    colors = {"b32-sync": ("k", "--"), "b1-sync": ("C0", "-"), "b1-pipelined": ("C1", "--"), "b1-pipelined5": ("C2", "-."),
              "b1-adaptive": ("C3", "-"), "neighbor": ("C4", ":"), "single": ("C7", "-")}  # fmt: skip
    models = [m for m in ("gcn", "sage", "gat") if m in groups]
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(models), 1, figsize=(FIG_W, 2.8 * len(models) + 0.6), squeeze=False)
        for ax, model in zip(axes[:, 0], models):
            key = "val"
            for method in METHODS:
                for i, c in enumerate(c for c in groups[model].get(method, []) if "failed" not in c):
                    xs, ys = [p[0] for p in c["points"]], [p[1] for p in c["points"]]
                    color, dash = colors[method]
                    ax.plot(
                        xs,
                        ys,
                        color=color,
                        linestyle=dash,
                        linewidth=1.6,
                        alpha=0.85,
                        label=METHODS[method][0] if i == 0 else None,
                    )
                    key = c["metric"]
            t = summaries[model]["target"]
            if math.isfinite(t):
                ax.axhline(t, color="0.5", linewidth=1, linestyle=":", label="common target")
            ax.set(ylabel=key.replace("_", " "), title=model.upper())
            ax.grid(alpha=0.3)
            ys = [p[1] for cs in groups[model].values() for c in cs if "failed" not in c for p in c["points"]]
            if ys and math.isfinite(t):  # the interesting part: from a little below the target to the top
                ax.set_ylim(max(min(ys), t - 0.1), max(ys) + 0.1 * (max(ys) - t) + 0.005)
        axes[-1, 0].set_xlabel("cumulative training time of the slowest rank (s, evaluation excluded)")
        fig.suptitle(f"{graph}, 2 nodes at {rate}: validation vs training time (every seed)")
        fig.tight_layout()
        _shared_legend(fig, axes[:, 0])
        return _save(fig, img, f"converge-{graph}-{rate}.png")


def render(root: Path = OUT, img: Path | None = None, graphs: tuple[str, ...] = GRAPHS, rates: tuple[str, ...] = ("100mbit", "1gbit"),
           models: tuple[str, ...] = ("gcn", "sage", "gat")) -> str:  # fmt: skip
    runs = load_runs(root)
    lines: list[str] = []
    verdicts: dict[str, list[str]] = {}
    not_run: list[str] = []
    for rate in rates:
        for graph in graphs:
            groups = {m: runs[(graph, rate, m)] for m in models if (graph, rate, m) in runs}
            for m in models:
                if m not in groups:
                    not_run.append(f"{graph} {m.upper()} at {rate}")
            if not groups:
                continue
            summaries = {m: summarise_group(by) for m, by in groups.items()}
            lines += [f"### {graph}, 2 nodes at {rate}", ""]
            if img is not None:
                name = plot_group(graph, rate, groups, summaries, img)
                lines += [f"![{name}](img/{name})", ""]
            for model, s in summaries.items():
                missing = [METHODS[k][0] for k in METHODS if k not in s["methods"]]
                lines += [f"**{model.upper()}**: common target {s['target']:.4f} "
                          f"(NeighborLoader's mean best {s.get('neighbor_best', float('nan')):.4f})"
                          + (f"; not run: {', '.join(missing)}" if missing else "") + ".", ""]  # fmt: skip
                lines += group_table(s) + [""]
                v = verdict(s)
                if v and model in ("gcn", "sage"):
                    m1, sooner, t1, tn = v
                    verdicts.setdefault(f"{model.upper()} at {rate}", []).append(
                        f"{graph}: {'yes' if sooner else 'no'} ({METHODS[m1][0]} {_fmt_t(t1)} vs NeighborLoader {_fmt_t(tn)})"
                    )
    head = [("Does the best 1-bit mode reach DDP + NeighborLoader's best validation score (mean over its seeds) sooner "
             "than NeighborLoader reached its best (mean over its seeds of the time of its best epoch)? The 1-bit time is the "
             "median over seeds, a seed that never reaches the score counting as never:"), ""]  # fmt: skip
    for k, vs in verdicts.items():
        yes = sum(v.split(":")[1].strip().startswith("yes") for v in vs)
        head.append(f"- **{k}: {yes} of {len(vs)} graphs** — " + "; ".join(vs) + ".")
    if not verdicts:
        head.append("- no graph has both a 1-bit mode and NeighborLoader yet.")
    if not_run:
        head += ["", "Not run: " + "; ".join(not_run) + "."]
    return "\n".join(head + [""] + lines).rstrip() + "\n"


def _fmt_t(t: float) -> str:
    return f"{t:.1f} s" if math.isfinite(t) else "never"


def write_page(page: Path, body: str) -> None:
    write_section(page, "converge", body)


def cmd_report(a: argparse.Namespace) -> None:
    page = Path(a.page)
    img = page.parent / "img"
    img.mkdir(exist_ok=True)
    body = render(OUT, img, tuple(a.graphs), tuple(a.rates), tuple(a.models))
    tuned = json.loads(TUNING.read_text()) if TUNING.is_file() else {}
    if tuned:
        rows = ["", ("NeighborLoader settings (`converge tune`: each candidate on one seed, the best validation score within the "
                     "budget chosen; evaluation samples with the same fan-outs):"), "",
                "| graph | model | chosen batch size | chosen fan-outs | candidates: batch size, fan-outs → best val |", "|---|---|---:|---|---|"]  # fmt: skip
        for g, by in tuned.items():
            for m, t in by.items():
                cands = "; ".join(f"{c['batch_size']}, {c['fanout']} → {c['best_val']:.4f}" for c in t["candidates"])
                rows.append(f"| {g} | {m} | {t['chosen']['batch_size']} | {t['chosen']['fanout']} | {cands} |")
        body += "\n".join(rows) + "\n"
    write_page(page, body)
    print(body)


def _budgets(items: list[str]) -> dict[str, float]:
    out = dict(BUDGET)
    for item in items:
        g, _, s = item.partition("=")
        out[g] = float(s)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("run", "tune", "report"):
        p = sub.add_parser(name)
        p.add_argument("--graphs", nargs="+", default=list(GRAPHS))
        p.add_argument("--models", nargs="+", default=["gcn", "sage"])
        p.add_argument("--rates", nargs="+", default=["100mbit"])
        p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
        p.add_argument("--methods", nargs="+", default=[m for m in METHODS], choices=list(METHODS))
        p.add_argument("--nodes", type=int, default=2)
        p.add_argument("--hidden", type=int, default=256)
        p.add_argument(
            "--patience", type=int, default=PATIENCE, help="validations (epochs) without improvement before stopping"
        )
        p.add_argument("--budget", nargs="*", default=[], help=f"GRAPH=SECONDS of fit() per run (defaults: {BUDGET})")
        p.add_argument(
            "--max-minutes", type=float, default=0, help="start no cell that would end after this many minutes"
        )
        p.add_argument("--local", action="store_true", help="local processes instead of the SLURM testbed")
        p.add_argument("--force", action="store_true")
        p.add_argument("--page", default=str(ROOT / "docs" / "benchmarks.md"))
    a = parser.parse_args()
    a.budget = _budgets(a.budget)
    if a.local:
        a.rates = ["local"]
    os.environ.setdefault("LIGHTNING_HALO_CACHE", str(RESULTS / "tmp" / "cache"))
    {"run": cmd_run, "tune": cmd_tune, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    main()
