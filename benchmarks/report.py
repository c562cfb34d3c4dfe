"""Plots (PNG) and the tables of docs/benchmarks.md from benchmarks/results/*.

    python benchmarks/harness.py report
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

BITS = (32, 16, 8, 4, 2, 1)
MODES = ("sync", "pipelined", "pipelined5", "periodic")
MODE_NAME = {"sync": "sync", "pipelined": "pipelined", "pipelined5": "pipelined + sync_every=5", "periodic": "periodic (refresh 5)"}
PARTS = (("compute_s", "compute"), ("codec_s", "quantize/dequantize"), ("wait_s", "halo exchange wait"), ("allreduce_s", "gradient all-reduce"))


def load(results: Path) -> dict[str, list[dict[str, Any]]]:
    cells: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(results.glob("*/*/*.json")):
        if "tmp" in path.relative_to(results).parts or path.name.endswith("-summary.json"):
            continue
        rec = json.loads(path.read_text())
        if rec.get("ranks"):  # recompute: the summary rules may be newer than the run
            from benchmarks.harness import summarise

            rec["summary"] = summarise(rec["ranks"])
        rec.pop("ranks", None)
        rec["path"] = str(path.relative_to(results))
        cells.setdefault(path.parts[-3], []).append(rec)
    return cells


def metric(rec: dict[str, Any], which: str = "final") -> tuple[str, float]:
    s = rec["summary"][which]
    if "test_auroc" in s:
        return "test ROC-AUC", s["test_auroc"]
    return "test acc", s.get("test_acc", float("nan"))


def find(cells: list[dict[str, Any]], **kw: Any) -> dict[str, Any] | None:
    for c in cells:
        if all(c.get(k) == v for k, v in kw.items()):
            return c
    return None


def plot_graph(graph: str, cells: list[dict[str, Any]], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    halo = [c for c in cells if "bits" in c and c.get("nodes", 0) >= 2 and c.get("cell", "").split("-")[-1] != "neighbor"]
    groups = sorted({(c["nodes"], c["rate"]) for c in halo})
    for nodes, rate in groups:
        sel = [c for c in halo if (c["nodes"], c["rate"]) == (nodes, rate)]
        models = [m for m in ("gcn", "sage", "gat") if any(c["model"] == m for c in sel)]
        if not models:
            continue
        # 1. epoch-time breakdown per bit width, sync mode: the "communication dominates" picture
        fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6), squeeze=False)
        for ax, model in zip(axes[0], models):
            bars = [(b, find(sel, model=model, bits=b, mode="sync")) for b in BITS]
            bars = [(b, c) for b, c in bars if c]
            bottom = [0.0] * len(bars)
            for key, label in PARTS:
                vals = [c["summary"]["breakdown"][key] for _, c in bars]
                ax.bar([str(b) for b, _ in bars], vals, bottom=bottom, label=label)
                bottom = [x + y for x, y in zip(bottom, vals)]
            ax.set_title(f"{model.upper()} sync")
            ax.set_xlabel("bits")
            ax.set_ylabel("epoch time (s)")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"{graph}: epoch time breakdown, {nodes} nodes at {rate}")
        fig.tight_layout()
        name = f"{graph}-{nodes}n-{rate}-breakdown.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(name)
        # 2. accuracy vs epoch per mode (1 bit) and for bits=32 sync
        fig, ax = plt.subplots(figsize=(6, 3.8))
        model = models[0]
        for mode in MODES:
            c = find(sel, model=model, bits=1, mode=mode)
            if c:
                key = "val_auroc" if "val_auroc" in c["summary"]["curve"][0] else "val_acc"
                ax.plot([p["epoch"] for p in c["summary"]["curve"]], [p.get(key) for p in c["summary"]["curve"]], label=f"1 bit, {MODE_NAME[mode]}")
        c = find(sel, model=model, bits=32, mode="sync")
        if c:
            key = "val_auroc" if "val_auroc" in c["summary"]["curve"][0] else "val_acc"
            ax.plot([p["epoch"] for p in c["summary"]["curve"]], [p.get(key) for p in c["summary"]["curve"]], "k--", label="32 bit, sync")
        ax.set_xlabel("epoch")
        ax.set_ylabel(key.replace("_", " "))
        ax.set_title(f"{graph} {model.upper()}: validation vs epoch per mode ({nodes} nodes, {rate})")
        ax.legend(fontsize=7)
        fig.tight_layout()
        name = f"{graph}-{nodes}n-{rate}-acc-epoch.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(name)
        # 3. accuracy vs wall time against the baselines
        fig, ax = plt.subplots(figsize=(6, 3.8))
        lines = [("32 bit sync", find(sel, model=model, bits=32, mode="sync")),
                 ("1 bit sync", find(sel, model=model, bits=1, mode="sync")),
                 ("1 bit pipelined + sync_every=5", find(sel, model=model, bits=1, mode="pipelined5")),
                 ("DDP + NeighborLoader", find(cells, cell=f"{model}-neighbor", nodes=nodes, rate=rate)),
                 ("single process (1 core)", find(cells, model=model, baseline="single"))]  # fmt: skip
        for label, c in lines:
            if c:
                cur = c["summary"]["curve"]
                key = "val_auroc" if "val_auroc" in cur[0] else "val_acc"
                ax.plot([p["train_wall_s"] for p in cur], [p.get(key) for p in cur], label=label)
        ax.set_xlabel("training wall time (s, excluding evaluation)")
        ax.set_ylabel(key.replace("_", " "))
        ax.set_title(f"{graph} {model.upper()}: validation vs time ({nodes} nodes, {rate})")
        ax.legend(fontsize=7)
        fig.tight_layout()
        name = f"{graph}-{nodes}n-{rate}-acc-time.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(name)
    # 4. speedup vs number of nodes (scale runs)
    scale = [c for c in halo if c["mode"] == "sync"]
    node_counts = sorted({c["nodes"] for c in scale})
    if len(node_counts) > 1:
        fig, ax = plt.subplots(figsize=(5, 3.6))
        for bits in sorted({c["bits"] for c in scale}, reverse=True):
            pts = sorted((c["nodes"], c["summary"]["epoch_s"]) for c in scale if c["bits"] == bits)
            if len(pts) > 1:
                base = pts[0][1] * pts[0][0]
                ax.plot([n for n, _ in pts], [base / (t * n) * n for n, t in pts], "o-", label=f"{bits} bit")
        ax.plot(node_counts, node_counts, "k:", label="ideal")
        ax.set_xlabel("nodes (ranks)")
        ax.set_ylabel(f"speedup vs {node_counts[0]} nodes x{node_counts[0]}")
        ax.set_title(f"{graph}: scaling")
        ax.legend(fontsize=7)
        fig.tight_layout()
        name = f"{graph}-scaling.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(name)
    return made


def cell_table(cells: list[dict[str, Any]]) -> str:
    rows = ["| model | mode | bits | epoch s (median) | mean | compute | quant | wait | all-reduce | MB/epoch | final test | best-val test | peak RSS MB |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    order = {m: i for i, m in enumerate(MODES)}
    for c in sorted(cells, key=lambda c: (c.get("model", ""), order.get(c.get("mode", ""), 9), -c.get("bits", 0))):
        s = c["summary"]
        b = s["breakdown"]
        name, final = metric(c)
        _, best = metric(c, "best_val")
        mode = "NeighborLoader DDP" if c.get("cell", "").endswith("neighbor") else ("single process" if c.get("baseline") == "single" else MODE_NAME[c["mode"]])
        bits = "-" if "neighbor" in c.get("cell", "") or c.get("baseline") else c["bits"]
        rows.append(
            f"| {c['model']} | {mode} | {bits} | {s['epoch_s']:.3f} | {s.get('epoch_s_mean', s['epoch_s']):.3f} | "
            f"{b['compute_s']:.3f} | {b['codec_s']:.3f} | "
            f"{b['wait_s']:.3f} | {b['allreduce_s']:.3f} | {s['bytes_per_epoch'] / 1e6:.3f} | {final:.4f} | {best:.4f} | "
            f"{s['peak_rss_mb']:.0f} |"
        )
    return "\n".join(rows)


def targets(graph: str, cells: list[dict[str, Any]]) -> str:
    lines = []
    for nodes, rate in sorted({(c["nodes"], c["rate"]) for c in cells if "bits" in c and c.get("nodes", 0) == 2}):
        sel = [c for c in cells if (c.get("nodes"), c.get("rate")) == (nodes, rate)]
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
            parts = [f"**{model.upper()}, {nodes} nodes at {rate}**: 1-bit sync epoch **{sp:.2f}×** faster than 32-bit "
                     f"(target ≥ 5×), **{by:.1f}×** fewer bytes (target ≥ 25×), {name} {a1:.4f} vs {a32:.4f} "
                     f"(Δ {100 * (a1 - a32):+.2f} pp, target within 0.5 pp)"]  # fmt: skip
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
            if p15:
                _, ap = metric(p15, "best_val")
                parts.append(f"pipelined + sync_every=5 {name} {ap:.4f} (Δ {100 * (ap - a32):+.2f} pp vs 32-bit, target within 1 pp)")
            lines.append("- " + "; ".join(parts) + ".")
    return "\n".join(lines)


def write_report(results: Path, page: Path) -> None:
    cells = load(results)
    img_dir = page.parent / "img"
    img_dir.mkdir(exist_ok=True)
    sections = []
    for graph, recs in sorted(cells.items()):
        made = plot_graph(graph, recs, img_dir)
        part = [f"### {graph}", ""]
        t = targets(graph, recs)
        if t:
            part += ["Targets (2 nodes, hidden 256, measured side by side in one harness run):", "", t, ""]
        part += [f"![{m}](img/{m})" for m in made] + [""]
        for nodes, rate in sorted({(c.get("nodes", 1), c.get("rate", "local")) for c in recs}):
            sel = [c for c in recs if (c.get("nodes", 1), c.get("rate", "local")) == (nodes, rate)]
            part += [f"#### {graph}: {nodes} node(s), {rate}", "", cell_table(sel), ""]
        pj = results / graph / "partition.json"
        if pj.is_file():
            p = json.loads(pj.read_text())
            part += [f"Partitioning ({p['nodes']:,} nodes, {p['edges']:,} edges; graph loaded in {p['load_s']:.1f} s): "
                     + ", ".join(f"{k} parts: METIS {v['metis_s']:.1f} s + halo planning {v['halo_s']:.1f} s, "
                                 f"edge cut {v['edge_cut']:,}, balance {v['balance']:.3f}" for k, v in p.items() if isinstance(v, dict))
                     + f"; peak RSS {p['peak_rss_mb']:.0f} MB (graph alone {p['graph_rss_mb']:.0f} MB).", ""]  # fmt: skip
        sections.append("\n".join(part))
    body = "\n".join(sections) if sections else "No results yet."
    text = page.read_text()
    pattern = re.compile(r"(<!-- BEGIN GENERATED: results -->\n).*?(<!-- END GENERATED: results -->)", re.S)
    page.write_text(pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text))
