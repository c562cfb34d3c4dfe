"""Halo partial sums (``halo_reduction="cover"``) against every halo row: rows, bytes, time.

    # rows per exchange with and without partial sums, METIS partitions of the real graphs
    python -m benchmarks.reduction rows --graphs tolokers cornell5 amherst41 johnshopkins55 --parts 2 4 8
    # the cover's cost against the partition step, on a written partition directory (e.g. the 4M / 64M graph's)
    python -m benchmarks.reduction timing --dirs benchmarks/results/tmp/memory/big/metis-2 ...
    # testbed pairs, side by side in one run: each cell with halo_reduction="none", then "cover"
    python -m benchmarks.reduction testbed --graph tolokers --models gcn sage --bits 32 1 --nodes 2 --rate 100mbit
    # heterogeneous graphs: one training step of HeteroNodeClassifier on HeCo's DBLP and ACM, in-process ranks
    python -m benchmarks.reduction hetero --datasets dblp acm --convs sage --parts 2 3 4
    # the generated section of docs/benchmarks.md
    python -m benchmarks.reduction report

Results: ``benchmarks/results/reduction/*.json``; cells under ``benchmarks/results/<graph>/<n>n-<rate>/``
named ``<model>-b<bits>-<mode>-rows`` and ``...-cover``.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import RESULTS, ROOT, cluster_for, run_cell
from benchmarks.pages import write_section

OUT = RESULTS / "reduction"


def cover_rows(graphs: list[str], parts: list[int]) -> list[dict[str, Any]]:
    """Rows one exchange moves over all rank pairs, with and without partial sums (METIS), and the cover's time."""
    from benchmarks.partitioners import real_graph_source as graph_source  # the graphs of ../shared/datasets
    from lightning_halo.data.sources import load_graph
    from lightning_halo.partition import build_halo_partitions, partition_graph
    from lightning_halo.partition.halo import part_cover_rows

    rows = []
    for name in graphs:
        data = load_graph(graph_source(name))
        for k in parts:
            t0 = time.perf_counter()
            assignment = partition_graph(data.edge_index, data.num_nodes, k)
            pieces = build_halo_partitions(data, assignment, k)
            t1 = time.perf_counter()
            cover = [part_cover_rows(p) for p in pieces]
            t2 = time.perf_counter()
            halo = sum(int(p.n_halo) for p in pieces)
            rows.append({"graph": name, "parts": k, "halo_rows": halo, "cover_rows": sum(cover),
                         "ratio": halo / max(sum(cover), 1), "partition_s": t1 - t0, "cover_s": t2 - t1})  # fmt: skip
            print(f"{name} {k} parts: {halo:,} -> {sum(cover):,} rows ({halo / max(sum(cover), 1):.2f}x), "
                  f"cover {t2 - t1:.2f} s vs partitioning {t1 - t0:.2f} s", flush=True)  # fmt: skip
            _save("rows", rows)  # as it goes: a later graph's failure keeps the earlier ones
    return rows


def hetero_bytes(datasets: list[str], convs: list[str], parts: list[int], hidden: int = 64) -> list[dict[str, Any]]:
    """Halo bytes of one training step (forward and backward, 32 bits, all ranks) of ``HeteroNodeClassifier`` on
    HeCo's graphs, per layer and source type, with ``halo_reduction="none"`` and ``"cover"`` (partial sums per
    relation, one exchange per layer and source type): measured by the exchange's meter, ranks in threads."""
    import copy
    import os

    from benchmarks.shared import find_shared
    from examples.hetero_dblp import heco_graph
    from lightning_halo.exchange import HaloExchanger
    from lightning_halo.layers.hooks import LayerContext, install_hooks
    from lightning_halo.models import HeteroNodeClassifier
    from lightning_halo.partition.hetero import assign_hetero_parts, build_hetero_partitions
    from lightning_halo.testing import ThreadGroup

    heco = Path(os.environ["HECO"]) if "HECO" in os.environ else find_shared("datasets") / "heco"  # type: ignore[operator]
    out = []
    for dataset in datasets:
        data = heco_graph(heco / dataset)
        target = [t for t in data.node_types if "y" in data[t]][0]
        classes = int(data[target].y.max()) + 1
        features = {t: int(data[t].x.size(1)) if "x" in data[t] else 0 for t in data.node_types}
        counts = {t: int(data[t].num_nodes) for t in data.node_types}
        for conv in convs:
            torch.manual_seed(0)
            model = HeteroNodeClassifier(classes, data.metadata(), features, counts, target, hidden_channels=hidden,
                                         conv=conv, dropout=0.0)  # type: ignore[arg-type]  # fmt: skip
            for k in parts:
                pieces = build_hetero_partitions(data, assign_hetero_parts(data, k))
                cell: dict[str, Any] = {"dataset": dataset, "conv": conv, "parts": k, "hidden": hidden}
                for reduction in ("none", "cover"):
                    group = ThreadGroup(k, timeout=300)

                    def rank(r: int, reduction: str = reduction, group: ThreadGroup = group) -> dict:
                        net = copy.deepcopy(model)
                        ex = HaloExchanger(group.transport(r), bits=32)
                        ctx = LayerContext(ex, halo_reduction=reduction)  # type: ignore[arg-type]
                        install_hooks(net, ctx)
                        ex.bind(pieces[r])
                        ctx.bind(pieces[r])
                        ex.begin_step(True, epoch=0)
                        t0 = time.perf_counter()
                        store = pieces[r][target]
                        logits = net(pieces[r])[store.train_mask]
                        torch.nn.functional.cross_entropy(logits, store.y[store.train_mask], reduction="sum").backward()
                        return {"meter": dict(ex.meter.total), "s": time.perf_counter() - t0, "how": dict(ctx.choices)}

                    with ThreadPoolExecutor(k) as pool:
                        ranks = list(pool.map(rank, range(k)))
                    per: dict[str, float] = {}
                    for res in ranks:
                        for (layer, kind), v in res["meter"].items():
                            per[f"{layer}/{kind}"] = per.get(f"{layer}/{kind}", 0) + v
                    cell[reduction] = per
                    cell[f"{reduction}_first_step_s"] = max(res["s"] for res in ranks)
                    cell[f"{reduction}_partial_sum_relations"] = sorted(
                        name for name, how in ranks[0]["how"].items() if "partial sums" in how)  # fmt: skip
                fwd = {red: sum(v for key, v in cell[red].items() if key.endswith(("/fwd", "/bwd"))) for red in ("none", "cover")}
                cell["ratio"] = fwd["none"] / max(fwd["cover"], 1)
                print(f"{dataset} {conv} {k} parts: {fwd['none']:,.0f} -> {fwd['cover']:,.0f} halo bytes per step "
                      f"({cell['ratio']:.2f}x)", flush=True)  # fmt: skip
                out.append(cell)
                _save("hetero", out)
    return out


def cover_timing(dirs: list[str]) -> list[dict[str, Any]]:
    """The cover of every part of written partition directories, timed against their partition step.

    A directory written by this version times its cover in the same run (``timings["cover_s"]``);
    for an older one the cover is computed and timed now, against the step's recorded time.
    """
    from lightning_halo.data.partition_dir import read_manifest
    from lightning_halo.partition.cover import halo_cover

    out = []
    for d in dirs:
        manifest = read_manifest(d)
        timings = manifest["timings"]
        step = sum(timings.get(k, 0.0) for k in ("partition_s", "halo_s", "write_s", "cover_s"))
        t0, rows, halo = time.perf_counter(), 0, 0
        for p in range(int(manifest["num_parts"])):
            state = torch.load(Path(d) / f"part_{p}.pt", mmap=True, weights_only=True, map_location="cpu")
            cover = halo_cover(state["edge_index"], int(state["n_inner"]), int(state["n_halo"]), state["recv_counts"].tolist())
            rows, halo = rows + cover.rows, halo + int(state["n_halo"])
        cover_s = timings.get("cover_s", time.perf_counter() - t0)
        out.append({"dir": str(d), "num_parts": int(manifest["num_parts"]), "partitioner": manifest["partitioner"],
                    "num_nodes": manifest["graph"]["num_nodes"], "num_edges": manifest["graph"]["num_edges"],
                    "halo_rows": halo, "cover_rows": rows, "cover_s": cover_s, "partition_step_s": step,
                    "share": cover_s / step, "same_run": "cover_s" in timings})  # fmt: skip
        print(f"{d}: cover {cover_s:.1f} s = {100 * cover_s / step:.1f} % of the partition step ({step:.0f} s); "
              f"{halo:,} -> {rows:,} rows", flush=True)  # fmt: skip
    return out


def testbed_pairs(a: argparse.Namespace) -> list[dict[str, Any]]:
    """Each cell with every halo row, then with partial sums, back to back (ratios from one run)."""
    pairs = []
    with cluster_for(a) as cluster:
        for model in a.models:
            for mode in a.modes:
                for bits in a.bits:
                    cells = {}
                    for reduction in ("none", "cover"):
                        name = f"{model}-b{bits}-{mode}-{'rows' if reduction == 'none' else 'cover'}"
                        extra = ["--eval-every", str(a.eval_every), "--hidden", str(a.hidden), "--halo-reduction", reduction]
                        cells[reduction] = run_cell(a.graph, model, bits, mode, a.nodes, a.rate, a.epochs, cluster, a.force,
                                                    extra=extra, name=name)  # fmt: skip
                    pairs.append(_pair(a.graph, model, bits, mode, a.nodes, a.rate, cells["none"], cells["cover"]))
    return pairs


def _pair(graph: str, model: str, bits: int, mode: str, nodes: int, rate: str, rows: dict, cover: dict) -> dict[str, Any]:
    if "failed" in rows or "failed" in cover:
        return {"graph": graph, "model": model, "bits": bits, "mode": mode, "failed": True}
    r, c = rows["summary"], cover["summary"]

    def acc(s: dict) -> float:
        return s["final"].get("test_auroc", s["final"].get("test_acc", float("nan")))

    return {
        "graph": graph, "model": model, "bits": bits, "mode": mode, "nodes": nodes, "rate": rate,
        "bytes_rows": r["bytes_per_epoch"], "bytes_cover": c["bytes_per_epoch"],
        "byte_ratio": r["bytes_per_epoch"] / max(c["bytes_per_epoch"], 1),
        "epoch_rows": r["epoch_s"], "epoch_cover": c["epoch_s"], "speedup": r["epoch_s"] / c["epoch_s"],
        "wait_rows": r["breakdown"]["wait_s"], "wait_cover": c["breakdown"]["wait_s"],
        "test_rows": acc(r), "test_cover": acc(c),
    }  # fmt: skip


def _save(name: str, rows: list[dict[str, Any]]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(rows, indent=1))


def render() -> str:
    """The generated section of docs/benchmarks.md from the saved results."""
    lines = []
    rows_file = OUT / "rows.json"
    if rows_file.is_file():
        lines += ["Rows per exchange over all rank pairs, METIS partitions (`python -m benchmarks.reduction rows`):", "",
                  "| graph | parts | every halo row | with partial sums | fewer | cover s | partitioning s |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in json.loads(rows_file.read_text()):
            lines.append(f"| {r['graph']} | {r['parts']} | {r['halo_rows']:,} | {r['cover_rows']:,} | {r['ratio']:.2f}x | "
                         f"{r['cover_s']:.2f} | {r['partition_s']:.2f} |")  # fmt: skip
        lines.append("")
    timing = OUT / "timing.json"
    if timing.is_file():
        lines += ["The cover against the partition step (partitioner + halo plan + writing) of partition directories "
                  "(`python -m benchmarks.reduction timing`):", "",
                  "| graph | partitioner | parts | rows | with partial sums | cover s | partition step s | share | timed |",
                  "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in json.loads(timing.read_text()):
            size = f"{r['num_nodes'] / 1e6:.0f}M / {r['num_edges'] / 1e6:.0f}M"
            lines.append(f"| {size} | {r['partitioner']} | {r['num_parts']} | {r['halo_rows']:,} | {r['cover_rows']:,} | "
                         f"{r['cover_s']:.1f} | {r['partition_step_s']:.0f} | {100 * r['share']:.1f} % | "
                         f"{'in the same run' if r.get('same_run') else 'cover now, step when written'} |")  # fmt: skip
        lines.append("")
    hetero = OUT / "hetero.json"
    if hetero.is_file():
        lines += ["Heterogeneous graphs: halo bytes of one training step (forward and backward, 32 bits, all ranks) of "
                  "`HeteroNodeClassifier` (64 hidden, 2 layers) on HeCo's graphs, METIS, measured by the exchange's "
                  "meter on in-process ranks; one exchange per layer and source type carries the partial sums of every "
                  "relation of the layer (`python -m benchmarks.reduction hetero`):", "",
                  "| graph | model | parts | every halo row | with partial sums | fewer | relations with partial sums | "
                  "structure and coefficients, once |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in json.loads(hetero.read_text()):
            step = {red: sum(v for k, v in r[red].items() if k.endswith(("/fwd", "/bwd"))) for red in ("none", "cover")}
            aux = sum(v for k, v in r["cover"].items() if k.endswith("/aux"))
            names = ", ".join(f"`{n}`" for n in r["cover_partial_sum_relations"]) or "none (attention)"
            lines.append(f"| {r['dataset']} | {r['conv']} | {r['parts']} | {step['none']:,} | {step['cover']:,} | "
                         f"{r['ratio']:.2f}x | {names} | {aux:,} |")  # fmt: skip
        lines.append("")
    lines += _memory_lines()
    for path in sorted(OUT.glob("testbed-*.json")):
        pairs = [p for p in json.loads(path.read_text()) if not p.get("failed")]
        if not pairs:
            continue
        p0 = pairs[0]
        lines += [f"{p0['graph']}, {p0['nodes']} nodes at {p0['rate']}, each pair run back to back "
                  "(`python -m benchmarks.reduction testbed`):", "",
                  "| model | bits | mode | MB/epoch rows | MB/epoch partial sums | fewer bytes | epoch s rows | epoch s partial sums | "
                  "faster | wait s rows / partial sums | test rows / partial sums |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for p in pairs:
            lines.append(f"| {p['model']} | {p['bits']} | {p['mode']} | {p['bytes_rows'] / 1e6:.3f} | {p['bytes_cover'] / 1e6:.3f} | "
                         f"{p['byte_ratio']:.2f}x | {p['epoch_rows']:.3f} | {p['epoch_cover']:.3f} | {p['speedup']:.2f}x | "
                         f"{p['wait_rows']:.3f} / {p['wait_cover']:.3f} | {p['test_rows']:.4f} / {p['test_cover']:.4f} |")  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def _memory_lines() -> list[str]:
    """Peak memory per rank with and without partial sums, from ``benchmarks.memory train --variant``
    runs named "every row" and "partial sums" (real ranks, one training step)."""
    found = []
    for cover in sorted((RESULTS / "memory").glob("*/train-dir-*-partial-sums.json")):
        rows = cover.with_name(cover.name.replace("-partial-sums", "-every-row"))
        if rows.is_file():
            found.append((cover.parent.name, json.loads(rows.read_text()), json.loads(cover.read_text())))
    if not found:
        return []
    lines = ["Peak memory per rank above the idle process, one training step on real ranks, each pair run back to back "
             "(`python -m benchmarks.memory train --variant \"every row\" --halo-reduction none`, then `\"partial sums\" cover`):",
             "", "| graph | partitioner | ranks | every row MiB | partial sums MiB | ratio |", "|---|---|---|---|---|---|"]  # fmt: skip
    for label, rows, cover in found:
        def peak(rec: dict) -> float:
            return max(r["peak_rss"] - r["idle_rss"] for r in rec["ranks"]) / 2**20

        lines.append(f"| {label} | {cover.get('partitioner', '')} | {cover['world']} | {peak(rows):.0f} | {peak(cover):.0f} | "
                     f"{peak(cover) / peak(rows):.2f} |")  # fmt: skip
    return [*lines, ""]


def write_report(page: Path) -> None:
    write_section(page, "reduction", render() + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("rows")
    p.add_argument("--graphs", nargs="+", default=["tolokers", "cornell5"])
    p.add_argument("--parts", nargs="+", type=int, default=[2, 4, 8])
    p = sub.add_parser("timing")
    p.add_argument("--dirs", nargs="+", required=True)
    p = sub.add_parser("testbed")
    p.add_argument("--graph", default="tolokers")
    p.add_argument("--models", nargs="+", default=["gcn", "sage"])
    p.add_argument("--modes", nargs="+", default=["sync"])
    p.add_argument("--bits", nargs="+", type=int, default=[32, 1])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--local", action="store_true", help="local processes instead of the SLURM testbed")
    p.add_argument("--force", action="store_true", help="rerun cells that already have results")
    p = sub.add_parser("hetero")
    p.add_argument("--datasets", nargs="+", default=["dblp", "acm"])
    p.add_argument("--convs", nargs="+", default=["sage"])
    p.add_argument("--parts", nargs="+", type=int, default=[2, 3, 4])
    p.add_argument("--hidden", type=int, default=64)
    p = sub.add_parser("report")
    p.add_argument("--page", default=str(ROOT / "docs" / "benchmarks.md"))
    a = parser.parse_args()
    if a.cmd == "rows":
        _save("rows", cover_rows(a.graphs, a.parts))
    elif a.cmd == "timing":
        _save("timing", cover_timing(a.dirs))
    elif a.cmd == "hetero":
        _save("hetero", hetero_bytes(a.datasets, a.convs, a.parts, a.hidden))
    elif a.cmd == "testbed":
        _save(f"testbed-{a.graph}-{a.nodes}n-{a.rate if not a.local else 'local'}", testbed_pairs(a))
    else:
        write_report(Path(a.page))


if __name__ == "__main__":
    main()
