"""Plots (PNG) and the tables of docs/benchmarks.md from benchmarks/results/*.

    python -m benchmarks.harness report
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from benchmarks.summary import BITS, MODELS, MODES, summarise

MODE_NAME = {"sync": "sync", "pipelined": "pipelined", "pipelined5": "pipelined + sync_every=5", "periodic": "periodic (refresh 5)"}
PARTS = (("compute_s", "compute"), ("codec_s", "quantize/dequantize"), ("wait_s", "halo exchange wait"), ("allreduce_s", "gradient all-reduce"))


def load(results: Path) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """``(cells, failed)`` per graph: the finished cells (summaries recomputed) and the ones that did not finish."""
    cells: dict[str, list[dict[str, Any]]] = {}
    failed: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(results.glob("*/*/*.json")):
        parts = path.relative_to(results).parts
        # tmp/: scratch; memory/: the memory benchmark's own records (benchmarks.memory reports them)
        if "tmp" in parts or parts[0] == "memory" or path.name.endswith("-summary.json"):
            continue
        rec = json.loads(path.read_text())
        if "failed" in rec:
            failed.setdefault(path.parts[-3], []).append(rec)
            continue
        if rec.get("ranks"):  # recompute: the summary rules may be newer than the run
            rec["summary"] = summarise(rec["ranks"])
            rec["hidden"] = rec["ranks"][0].get("config", {}).get("hidden")
            rec["sparse"] = bool(rec["ranks"][0].get("config", {}).get("sparse"))
        rec.pop("ranks", None)
        rec["path"] = str(path.relative_to(results))
        cells.setdefault(path.parts[-3], []).append(rec)
    return cells, failed


def _val_curve(c: dict[str, Any], x: str) -> tuple[list[float], list[float], str]:
    """The evaluated points of a cell's curve (runs may evaluate every k epochs)."""
    cur = c["summary"]["curve"]
    key = "val_auroc" if any("val_auroc" in p for p in cur) else "val_acc"
    pts = [(p[x], p[key]) for p in cur if key in p]
    return [a for a, _ in pts], [b for _, b in pts], key


def _time_lines(cells: list[dict[str, Any]], sel: list[dict[str, Any]], model: str, nodes: int, rate: str) -> list[tuple[str, Any]]:
    return [("32 bit sync", find(sel, model=model, bits=32, mode="sync")),
            ("1 bit sync", find(sel, model=model, bits=1, mode="sync")),
            ("1 bit pipelined + sync_every=5", find(sel, model=model, bits=1, mode="pipelined5")),
            ("DDP + NeighborLoader", find(cells, cell=f"{model}-neighbor", nodes=nodes, rate=rate)),
            ("single process (1 core), sparse adjacency", find(cells, cell=f"{model}-single-sparse")),
            ("single process (1 core), edge_index", find(cells, cell=f"{model}-single"))]  # fmt: skip


def time_to_reach(cells: list[dict[str, Any]], sel: list[dict[str, Any]], model: str, nodes: int, rate: str) -> str:
    """Training time each run needs to first reach the validation score every one of them reaches."""
    runs = [(label, c) for label, c in _time_lines(cells, sel, model, nodes, rate) if c]
    if len(runs) < 2 or not any("neighbor" in c.get("cell", "") for _, c in runs):
        return ""
    curves = [(label, *_val_curve(c, "train_wall_s")) for label, c in runs]
    target = min(max(ys) for _, _, ys, _ in curves if ys)
    key = curves[0][3]
    parts = []
    for label, xs, ys, _ in curves:
        t = next(x for x, y in zip(xs, ys) if y >= target)
        parts.append(f"{label} {t:.1f} s")
    return (f"in these short runs (not converged), time to first reach {key.replace('_', ' ')} {target:.4f} "
            f"(the best every run reaches): " + ", ".join(parts))


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "?").replace("`", "'")[:200]


def metric(rec: dict[str, Any], which: str = "final") -> tuple[str, float]:
    s = rec["summary"][which]
    if "test_auroc" in s:
        return "test ROC-AUC", s["test_auroc"]
    return "test acc", s.get("test_acc", float("nan"))


#: A cell of the matrix itself (``gcn-b1-sync``); variants measured beside it (``gcn-b1-sync-cover``,
#: ``-rows``, a neighbour-sampling baseline) share its model, bits and mode but are not it.
_MATRIX_CELL = re.compile(rf"^({'|'.join(MODELS)})-b\d+-({'|'.join(MODES)})$")


def matrix_cells(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cells of the bits × modes matrix, without the variants measured beside them.

    Example:
        >>> [c["cell"] for c in matrix_cells([{"cell": "gcn-b1-sync-cover"}, {"cell": "gcn-b1-sync"}])]
        ['gcn-b1-sync']
    """
    return [c for c in cells if _MATRIX_CELL.match(c.get("cell", ""))]


def find(cells: list[dict[str, Any]], **kw: Any) -> dict[str, Any] | None:
    for c in cells:
        if all(c.get(k) == v for k, v in kw.items()):
            return c
    return None


# Figures are drawn for the docs page: mkdocs-material shows them about 690 px wide in a 1280 px
# browser window, so a FIG_W-inch figure is scaled to 690 / (FIG_W * dpi); every text must stay
# at least MIN_TEXT_PX tall there (checked when a figure is saved).
DOC_WIDTH_PX = 690
MIN_TEXT_PX = 11
FIG_W = 7.5
DPI = 110
STYLE = {"font.size": 10.5, "axes.titlesize": 11, "axes.labelsize": 10.5, "legend.fontsize": 10,
         "xtick.labelsize": 10, "ytick.labelsize": 10, "figure.titlesize": 11.5}  # fmt: skip
# Each series keeps its colour, dash and marker in every figure; lines are drawn thinner and smaller
# one after another, so that series with equal values (e.g. pipelined and pipelined + sync_every=5
# before epoch 5) stay visible.
SERIES_STYLE = {
    "1 bit sync": ("C0", "-", "o"),
    "1 bit pipelined": ("C1", "--", "s"),
    "1 bit pipelined + sync_every=5": ("C2", "-.", "^"),
    "1 bit periodic (refresh 5)": ("C3", ":", "D"),
    "32 bit sync": ("k", "--", "x"),
    "DDP + NeighborLoader": ("C4", ":", "v"),
    "single process (1 core)": ("C7", "-", "P"),
    "ideal (one core per rank)": ("0.4", ":", ""),
}
OTHER_STYLES = [("C0", "-", "o"), ("C1", "--", "s"), ("C2", "-.", "^"), ("C3", ":", "D"), ("C5", "-", "v")]


def smallest_text_px(fig: Any) -> float:
    """Height in pixels of the smallest visible text of ``fig`` as the docs page shows it."""
    from matplotlib.text import Text

    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return min(sizes, default=float("inf")) * DOC_WIDTH_PX / (72 * fig.get_figwidth())


def _save(fig: Any, out: Path, name: str) -> str:
    import matplotlib.pyplot as plt

    px = smallest_text_px(fig)
    if px < MIN_TEXT_PX:
        raise ValueError(f"{name}: smallest text would be {px:.1f} px on the docs page (< {MIN_TEXT_PX}); enlarge it")
    fig.savefig(out / name, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return name


def _plot_lines(ax: Any, series: list[tuple[str, list[float], list[float]]]) -> None:
    for i, (label, xs, ys) in enumerate(series):
        color, dash, marker = SERIES_STYLE.get(label.replace(",", ""), OTHER_STYLES[i % len(OTHER_STYLES)])
        ax.plot(xs, ys, color=color, linestyle=dash, marker=marker, label=label,
                linewidth=2.4 - 0.3 * i, markersize=8 - 0.8 * i)  # fmt: skip


def _shared_legend(fig: Any, axes: Any) -> None:
    """One legend for all panels, under them (savefig's tight bounding box makes room for it)."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, frameon=False)


def _curve_panels(
    graph: str, what: str, xlabel: str, panels: list[tuple[str, list[tuple[str, list[float], list[float]]], str]], out: Path, name: str
) -> list[str]:
    """One panel per model (stacked), or a sentence instead where no run has two evaluated points."""
    import matplotlib.pyplot as plt

    if all(len(xs) < 2 for _, series, _ in panels for _, xs, _ in series):
        # a single evaluation per run: a curve would be one dot with every series on top of each other
        at = (lambda x: f"epoch {x:g}") if xlabel == "epoch" else (lambda x: f"{x:.0f} s")
        parts = [
            f"{model.upper()} {label.replace(', ', ' ')} {ys[0]:.4f} ({at(xs[0])})"
            for model, series, _ in panels for label, xs, ys in series if xs
        ]  # fmt: skip
        key = panels[0][2].replace("_", " ")
        return [f"{graph}, {what}: every run was validated once, so there is no curve to draw; {key}: " + ", ".join(parts) + "."]
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(panels), 1, figsize=(FIG_W, 2.6 * len(panels) + 0.6), squeeze=False)
        for ax, (model, series, key) in zip(axes[:, 0], panels):
            _plot_lines(ax, series)
            ax.set(ylabel=key.replace("_", " "), title=model.upper())
            ax.grid(alpha=0.3)
        axes[-1, 0].set_xlabel(xlabel)
        if xlabel == "epoch":
            from matplotlib.ticker import MaxNLocator

            for ax in axes[:, 0]:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.suptitle(f"{graph}: {what}")
        fig.tight_layout()
        _shared_legend(fig, axes[:, 0])
        lines = [f"![{name}](img/{_save(fig, out, name)})"]
    evaluated = sorted({tuple(xs) for _, series, _ in panels for _, xs, _ in series if xs})
    if xlabel == "epoch" and all(len(xs) <= 3 for xs in evaluated):
        lines.append(f"(Each run was validated at epochs {', '.join(f'{x:g}' for x in evaluated[0])} only, so every curve "
                     f"has {len(evaluated[0])} points: that is how the cells were run, not the plot.)")  # fmt: skip
    return lines


def scaling_series(cells: list[dict[str, Any]]) -> dict[tuple[str, Any, bool], dict[int, list[tuple[int, float]]]]:
    """Sync epoch time per node count, for each (rate, hidden, sparse) setting measured at several node counts.

    A line only joins cells that differ in the number of nodes: a 2-node cell at another link
    rate or model size is a different experiment.
    """
    groups: dict[tuple[str, Any, bool], dict[int, list[tuple[int, float]]]] = {}
    for c in cells:
        if c.get("mode") != "sync" or "bits" not in c:
            continue
        key = (c["rate"], c.get("hidden"), bool(c.get("sparse")))
        groups.setdefault(key, {}).setdefault(c["bits"], []).append((c["nodes"], c["summary"]["epoch_s"]))
    return {
        key: {bits: sorted(pts) for bits, pts in by_bits.items() if len({n for n, _ in pts}) > 1}
        for key, by_bits in groups.items()
        if any(len({n for n, _ in pts}) > 1 for pts in by_bits.values())
    }


def plot_graph(graph: str, cells: list[dict[str, Any]], out: Path) -> list[str]:
    """The figures of one graph, as Markdown lines (images, or a sentence where a figure would be empty)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[str] = []
    halo = [c for c in cells if "bits" in c and c.get("nodes", 0) >= 2 and c.get("cell", "").split("-")[-1] != "neighbor"]
    groups = sorted({(c["nodes"], c["rate"]) for c in halo})
    for nodes, rate in groups:
        sel = [c for c in halo if (c["nodes"], c["rate"]) == (nodes, rate)]
        models = [m for m in ("gcn", "sage", "gat") if any(c["model"] == m for c in sel)]
        if not models:
            continue
        # 1. epoch-time breakdown per bit width, sync mode: the "communication dominates" picture
        with plt.rc_context(STYLE):
            fig, axes = plt.subplots(1, len(models), figsize=(FIG_W, 3.4), squeeze=False)
            for ax, model in zip(axes[0], models):
                bars = [(b, find(sel, model=model, bits=b, mode="sync")) for b in BITS]
                bars = [(b, c) for b, c in bars if c]
                bottom = [0.0] * len(bars)
                for key, label in PARTS:
                    vals = [c["summary"]["breakdown"][key] for _, c in bars]
                    ax.bar([str(b) for b, _ in bars], vals, bottom=bottom, label=label, width=0.8 if len(bars) > 2 else 0.45)
                    bottom = [x + y for x, y in zip(bottom, vals)]
                ax.set_title(f"{model.upper()} sync")
                ax.set_xlabel("bits")
            axes[0][0].set_ylabel("epoch time (s)")
            fig.suptitle(f"{graph}: epoch time breakdown, {nodes} nodes at {rate}")
            fig.tight_layout()
            _shared_legend(fig, axes[0])
            name = _save(fig, out, f"{graph}-{nodes}n-{rate}-breakdown.png")
        made.append(f"![{name}](img/{name})")
        if len({c["mode"] for c in sel}) < 2:  # scale runs (sync only): the breakdown is the figure
            continue
        # 2. validation vs epoch per mode (1 bit) and for bits=32 sync, one panel per model
        panels = []
        for model in models:
            lines = [(f"1 bit, {MODE_NAME[m]}", find(sel, model=model, bits=1, mode=m)) for m in MODES]
            lines.append(("32 bit, sync", find(sel, model=model, bits=32, mode="sync")))
            curves = [(label, *_val_curve(c, "epoch")) for label, c in lines if c]
            panels.append((model, [(label, xs, ys) for label, xs, ys, _ in curves], curves[0][3]))
        made += _curve_panels(graph, f"validation vs epoch per mode ({nodes} nodes, {rate})", "epoch", panels, out,
                              f"{graph}-{nodes}n-{rate}-acc-epoch.png")  # fmt: skip
        # 3. validation vs wall time against the baselines, one panel per model
        panels = []
        for model in models:
            curves = [(label, *_val_curve(c, "train_wall_s")) for label, c in _time_lines(cells, sel, model, nodes, rate) if c]
            panels.append((model, [(label, xs, ys) for label, xs, ys, _ in curves], curves[0][3]))
        made += _curve_panels(graph, f"validation vs time against the baselines ({nodes} nodes, {rate})",
                              "training wall time (s, excluding evaluation)", panels, out,
                              f"{graph}-{nodes}n-{rate}-acc-time.png")  # fmt: skip
    # 4. speedup vs number of nodes (scale runs), one line per bit width and setting
    for (rate, hidden, sparse), by_bits in scaling_series(halo).items():
        with plt.rc_context(STYLE):
            fig, ax = plt.subplots(figsize=(FIG_W, 4.2))
            series = []
            for bits in sorted(by_bits, reverse=True):
                pts = by_bits[bits]
                n0, t0 = pts[0]
                series.append((f"{bits} bit", [n for n, _ in pts], [t0 / t for _, t in pts]))
            node_counts = sorted({n for pts in by_bits.values() for n, _ in pts})
            series.append(("ideal (one core per rank)", node_counts, [n / node_counts[0] for n in node_counts]))
            _plot_lines(ax, series)
            ax.set_xticks(node_counts)
            ax.set_xlabel("nodes (ranks)")
            ax.set_ylabel(f"epoch-time speedup vs {node_counts[0]} nodes")
            setting = f"{rate}, hidden {hidden}" + (", sparse adjacency" if sparse else "")
            ax.set_title(f"{graph}: scaling at {setting}\n(all ranks share one 2-core machine)")
            ax.grid(alpha=0.3)
            ax.legend(loc="upper left")
            fig.tight_layout()
            suffix = "" if len(scaling_series(halo)) == 1 else f"-{rate}-h{hidden}"
            name = _save(fig, out, f"{graph}-scaling{suffix}.png")
        made.append(f"![{name}](img/{name})")
    return made


def _mode_name(c: dict[str, Any]) -> str:
    if c.get("cell", "").endswith("neighbor"):
        return "NeighborLoader DDP"
    if c.get("baseline") == "single":
        return "single process, " + ("sparse adjacency" if c.get("cell", "").endswith("sparse") else "edge_index")
    return MODE_NAME[c["mode"]]


def _holds_back(cell: dict[str, Any]) -> str:
    """Which part of an epoch dominates it, measured: what a missed speed-up target is waiting for."""
    b = cell["summary"]["breakdown"]
    parts = {"compute": b["compute_s"], "halo wait": b["wait_s"], "gradient all-reduce": b["allreduce_s"], "quantization": b["codec_s"]}
    top = max(parts, key=parts.get)  # type: ignore[arg-type]
    return ", ".join(f"{k} {v:.3f} s" for k, v in parts.items()) + f": {top} holds it back"


def cell_table(cells: list[dict[str, Any]]) -> str:
    rows = ["| model | mode | bits | epoch s (median) | mean | compute | kernel bound | compute / bound | quant | wait | all-reduce "
            "| MB/epoch | test after the last epoch (not converged) | test at best val (not converged) | peak RSS MB |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    order = {m: i for i, m in enumerate(MODES)}
    for c in sorted(cells, key=lambda c: (c.get("model", ""), order.get(c.get("mode", ""), 9), -c.get("bits", 0))):
        s = c["summary"]
        b = s["breakdown"]
        name, final = metric(c)
        _, best = metric(c, "best_val")
        mode = _mode_name(c)
        bits = "-" if "neighbor" in c.get("cell", "") or c.get("baseline") else c["bits"]
        bound = f"{s['kernel_bound_s']:.3f} | {s['compute_over_bound']:.2f}" if "kernel_bound_s" in s else "- | -"
        rows.append(
            f"| {c['model']} | {mode} | {bits} | {s['epoch_s']:.3f} | {s.get('epoch_s_mean', s['epoch_s']):.3f} | "
            f"{b['compute_s']:.3f} | {bound} | {b['codec_s']:.3f} | "
            f"{b['wait_s']:.3f} | {b['allreduce_s']:.3f} | {s['bytes_per_epoch'] / 1e6:.3f} | {final:.4f} | {best:.4f} | "
            f"{s['peak_rss_mb']:.0f} |"
        )
    return "\n".join(rows)


def targets(graph: str, cells: list[dict[str, Any]]) -> str:
    lines = []
    for nodes, rate in sorted({(c["nodes"], c["rate"]) for c in cells if "bits" in c and c.get("nodes", 0) == 2}):
        # the matrix's own cells: find() would otherwise take a variant (gcn-b1-sync-cover sorts first)
        sel = [c for c in matrix_cells(cells) if (c.get("nodes"), c.get("rate")) == (nodes, rate)]
        for model in ("gcn", "sage", "gat"):
            s32, s1 = find(sel, model=model, bits=32, mode="sync"), find(sel, model=model, bits=1, mode="sync")
            p1 = find(sel, model=model, bits=1, mode="pipelined")
            p15 = find(sel, model=model, bits=1, mode="pipelined5")
            if not (s32 and s1):
                continue
            sp = s32["summary"]["epoch_s"] / s1["summary"]["epoch_s"]
            by = s32["summary"]["bytes_per_epoch"] / max(s1["summary"]["bytes_per_epoch"], 1)
            name, a32 = metric(s32, "best_val")
            _, a1 = metric(s1, "best_val")
            how = f"hidden {s32.get('hidden')}" + (", sparse adjacency" if s32.get("sparse") else "")
            parts = [f"**{model.upper()} ({how}), {nodes} nodes at {rate}**: 1-bit sync epoch **{sp:.2f}×** faster than 32-bit "
                     f"(target ≥ 4× for GCN and SAGE), **{by:.1f}×** fewer bytes (target ≥ 25×), {name} {a1:.4f} vs {a32:.4f} "
                     f"(Δ {100 * (a1 - a32):+.2f} pp, target within 0.5 pp)"]  # fmt: skip
            if sp < 4 and model != "gat":
                parts.append(f"the 1-bit epoch: {_holds_back(s1)}")
            if "compute_over_bound" in s32["summary"]:
                parts.append(f"compute per epoch {s32['summary']['compute_over_bound']:.2f}× the partition's kernel bound "
                             f"(32-bit sync; target ≤ 1.5×)")  # fmt: skip
            # what any codec could reach here: 32-bit sync with its halo wait removed entirely
            bound = s32["summary"]["epoch_s"] / max(s32["summary"]["epoch_s"] - s32["summary"]["breakdown"]["wait_s"], 1e-9)
            share = s32["summary"]["breakdown"]["wait_s"] / s32["summary"]["epoch_s"]
            parts.append(f"32-bit sync spends {100 * share:.0f}% of its epoch waiting for halos, so even free communication "
                         f"would be at most **{bound:.2f}×** faster")  # fmt: skip
            if p1:
                parts.append(f"pipelined 1-bit **{s1['summary']['epoch_s'] / p1['summary']['epoch_s']:.2f}×** faster than sync 1-bit "
                             f"(target ≥ 1.3×) and **{p1['summary']['epoch_s'] / max(p1['summary']['breakdown']['compute_s'], 1e-9):.2f}×** "
                             f"its compute-only time (target ≤ 1.15×)")  # fmt: skip
            waits = []
            for bits in (32, 1):
                sw, pw = find(sel, model=model, bits=bits, mode="sync"), find(sel, model=model, bits=bits, mode="pipelined")
                if sw and pw:
                    waits.append(f"{bits}-bit {sw['summary']['breakdown']['wait_s']:.3f} s sync vs "
                                 f"{pw['summary']['breakdown']['wait_s']:.3f} s pipelined")  # fmt: skip
            if waits:
                parts.append("halo exchange wait per epoch: " + ", ".join(waits))
            reach = time_to_reach(cells, sel, model, nodes, rate)
            if reach:
                parts.append(reach)
            if p15:
                _, ap = metric(p15, "best_val")
                parts.append(f"pipelined + sync_every=5 {name} {ap:.4f} (Δ {100 * (ap - a32):+.2f} pp vs 32-bit, target within 1 pp)")
            lines.append("- " + "; ".join(parts) + ".")
    return "\n".join(lines)


def soak_section(results: Path, graph: str, img_dir: Path) -> list[str]:
    """Resident memory per rank and bytes per epoch of the long pipelined 1-bit runs (``python -m benchmarks.harness soak``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = []
    for summary_path in sorted((results / graph).glob("*/*-summary.json")):
        cell = json.loads(summary_path.with_name(summary_path.name.replace("-summary", "")).read_text())
        report = json.loads(summary_path.read_text())
        name = f"{graph}-{cell['cell']}-{cell['nodes']}n-{cell['rate']}.png"
        with plt.rc_context(STYLE):
            fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(FIG_W, 6.4))
            for i, r in enumerate(cell["ranks"]):
                ep = [e["epoch"] for e in r["epochs"]]
                kw = {"label": f"rank {r['rank']}", "linestyle": ("-", "--", "-.", ":")[i % 4], "linewidth": 2.2 - 0.5 * (i % 3)}
                ax0.plot(ep, [e["rss_mb"] for e in r["epochs"]], **kw)
                ax1.plot(ep[1:], [(e["fwd_bytes"] + e["bwd_bytes"]) / 1e6 for e in r["epochs"][1:]], **kw)
            ax0.set(ylabel="resident memory (MB)", title="RSS per rank")
            ax1.set(xlabel="epoch", ylabel="halo MB sent", title="bytes per epoch (after epoch 0)")
            ax0.legend(), ax1.legend()
            fig.suptitle(f"{graph} {cell['cell']}: {cell['model'].upper()} {cell['epochs']} epochs, 1-bit pipelined + sync_every=5,\n"
                         f"{cell['nodes']} nodes at {cell['rate']}")  # fmt: skip
            fig.tight_layout()
            _save(fig, img_dir, name)
        rows = ["| rank | peak RSS at epoch 20 (MB) | peak RSS at the end (MB) | growth | RSS trend after 20 (MB / 100 epochs) "
                "| final RSS (MB) | bytes/epoch min | bytes/epoch max |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for r in report["ranks"]:
            rows.append(f"| {r['rank']} | {r['peak_rss_at_20_mb']:.1f} | {r['peak_rss_final_mb']:.1f} | {100 * r['growth_after_20']:+.2f}% "
                        f"| {r['rss_trend_mb_per_100_epochs']:+.2f} | {r['rss_final_mb']:.1f} | {r['bytes_per_epoch_min']:,} "
                        f"| {r['bytes_per_epoch_max']:,} |")  # fmt: skip
        growth = max(r["growth_after_20"] for r in report["ranks"])
        env = ", ".join(f"`{k}={v}`" for k, v in report.get("env", {}).items()) or "default glibc malloc settings"
        lines += [f"#### Soak: {report['epochs']} epochs, {cell['nodes']} nodes at {cell['rate']}, {env}", "",
                  f"Pipelined 1-bit with `sync_every=5`, {cell['model'].upper()}, evaluation every 50 epochs; RSS sampled at "
                  f"every epoch end; largest growth of a rank's peak RSS after epoch 20: **{100 * growth:+.2f}%** "
                  f"(limit 5%); wall time {cell['wall_s'] / 60:.1f} min.", "",
                  *rows, "", f"![{name}](img/{name})", ""]  # fmt: skip
    return lines


def write_report(results: Path, page: Path) -> None:
    cells, failed = load(results)
    # long-run (soak) cells have their own section and are not part of the matrix
    cells = {g: [c for c in recs if "soak" not in c.get("cell", "")] for g, recs in cells.items()}
    img_dir = page.parent / "img"
    img_dir.mkdir(exist_ok=True)
    sections = []
    for graph in sorted(set(cells) | set(failed)):  # a graph whose every cell failed is reported too
        recs = cells.get(graph, [])
        made = plot_graph(graph, recs, img_dir)
        part = [f"### {graph}", ""]
        t = targets(graph, recs)
        if t:
            part += ["Targets (2 nodes, measured side by side; the test scores and times to a validation score here are after "
                     "the short runs of this matrix, 6–15 epochs, not converged: see [Time to accuracy](#time-to-accuracy)):",
                     "", t, ""]  # fmt: skip
        part += [line for m in made for line in (m, "")]
        for nodes, rate in sorted({(c.get("nodes", 1), c.get("rate", "local")) for c in recs}):
            sel = [c for c in recs if (c.get("nodes", 1), c.get("rate", "local")) == (nodes, rate)]
            part += [f"#### {graph}: {nodes} node(s), {rate}", "", cell_table(sel), ""]
        pj = results / graph / "partition.json"
        if pj.is_file():
            p = json.loads(pj.read_text())
            part += [f"Partitioning through `HaloDataModule` ({p['nodes']:,} nodes, {p['edges']:,} edges; graph loaded in "
                     f"{p['load_s']:.1f} s): "
                     + ", ".join(f"{k} parts: " + (f"{v.get('partitioner', 'metis')} {v.get('partition_s', v.get('metis_s', 0)):.1f} s + halo planning {v['halo_s']:.1f} s + cache write "
                                                   f"{v['write_s']:.1f} s, " if "halo_s" in v else "(cached), ")
                                 + f"edge cut {v['edge_cut']:,}, halo rows {v['halo_rows']:,}, balance {v['balance']:.3f}"
                                 for k, v in p.items() if isinstance(v, dict))
                     + f"; peak RSS {p['peak_rss_mb']:.0f} MB (graph alone {p['graph_rss_mb']:.0f} MB).", ""]  # fmt: skip
        if failed.get(graph):
            part += ["Cells that did not finish (the reason is the last line of the job's output, in the cell's JSON):", ""]
            part += [f"- {c['model']} {MODE_NAME.get(c['mode'], c['mode'])} {c['bits']}-bit, {c['nodes']} nodes at {c['rate']}: "
                     f"`{_last_line(c['failed'])}`" for c in failed[graph]]  # fmt: skip
            part += [""]
        part += soak_section(results, graph, img_dir)
        sections.append("\n".join(part))
    body = "\n".join(sections) if sections else "No results yet."
    text = page.read_text()
    pattern = re.compile(r"(<!-- BEGIN GENERATED: results -->\n).*?(<!-- END GENERATED: results -->)", re.S)
    page.write_text(pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text))
