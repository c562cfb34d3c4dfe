"""METIS against KaMinPar on the real graphs: edge cut, balance, time and peak memory, side by side.

    python -m benchmarks.partitioners                       # every real graph, 2 / 4 / 8 parts
    python -m benchmarks.partitioners --graphs tolokers --parts 2 4
    python -m benchmarks.partitioners --report docs/large-graphs.md   # the table of the page

Every (graph, parts, partitioner) runs in a fresh process (``partition_graph`` on the loaded graph:
the CSR build and the partitioner, nothing else), METIS and KaMinPar one after the other for each
cell, so a ratio compares runs made seconds apart. Cut: undirected edges whose endpoints lie in
different parts (the symmetrised graph without self-loops, what both partitioners minimise).
Balance: largest part / mean part. Peak: ``VmHWM`` of the process above the loaded graph.
Results: ``benchmarks/results/partitioners.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("LIGHTNING_HALO_BENCH_RESULTS", ROOT / "benchmarks" / "results"))
GRAPHS = ("cora", "citeseer", "actor", "tolokers", "cornell5", "minesweeper", "amherst41", "johnshopkins55", "reed98")
_EXTRA = {  # graphs of ../shared/datasets that benchmarks.graphs does not name
    "minesweeper": "pyg:HeterophilousGraphDataset:{root}:Minesweeper",
    "amherst41": "pyg:LINKXDataset:{root}:amherst41",
    "johnshopkins55": "pyg:LINKXDataset:{root}:johnshopkins55",
    "reed98": "pyg:LINKXDataset:{root}:reed98",
}


def real_graph_source(name: str) -> str:
    from benchmarks.graphs import graph_source, shared_datasets

    if name in _EXTRA:
        return _EXTRA[name].format(root=shared_datasets())
    return graph_source(name)  # type: ignore[return-value]


def undirected_cut(edge_index: Any, parts: Any) -> int:
    """Undirected edges (self-loops and repeats dropped) whose endpoints lie in different parts.

    Example:
        >>> import torch
        >>> undirected_cut(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), torch.tensor([0, 0, 1]))
        1
    """
    import torch

    src, dst = edge_index
    keep = src != dst
    lo, hi = torch.minimum(src[keep], dst[keep]), torch.maximum(src[keep], dst[keep])
    n = int(parts.numel())
    key = torch.unique(lo * n + hi)
    a, b = torch.div(key, n, rounding_mode="floor"), key % n
    return int((parts[a] != parts[b]).sum())


def one(graph: str, parts: int, partitioner: str) -> dict[str, Any]:
    """Run in a fresh process: load the graph, then partition it, measuring time and peak RSS."""
    import torch

    from benchmarks.memory import reset_peak, status
    from lightning_halo.data import load_graph
    from lightning_halo.partition import partition_graph

    data = load_graph(real_graph_source(graph))
    base = status()["VmRSS"]
    reset_peak()
    t = time.perf_counter()
    assignment = partition_graph(data.edge_index, int(data.num_nodes), parts, partitioner=partitioner)  # type: ignore[arg-type]
    seconds = time.perf_counter() - t
    peak = status()["VmHWM"] - base
    sizes = torch.bincount(assignment, minlength=parts).double()
    return {
        "graph": graph, "parts": parts, "partitioner": partitioner, "seconds": seconds, "peak_above_loaded": peak,
        "cut": undirected_cut(data.edge_index, assignment), "balance": float(sizes.max() / sizes.mean()),
        "nodes": int(data.num_nodes), "edges": int(data.edge_index.size(1)),
    }  # fmt: skip


def run(graphs: list[str], parts: list[int], out: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads(out.read_text()) if out.is_file() else []
    done = {(r["graph"], r["parts"], r["partitioner"]) for r in records}
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for graph in graphs:
        for p in parts:
            for partitioner in ("metis", "kaminpar"):
                if (graph, p, partitioner) in done:
                    continue
                cmd = [sys.executable, "-m", "benchmarks.partitioners", "_one", graph, str(p), partitioner]
                rec = json.loads(subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
                records.append(rec)
                print(f"{graph:>15} P={p} {partitioner:>8}: cut {rec['cut']:>9}  balance {rec['balance']:.3f}  "
                      f"{rec['seconds']:6.2f} s  peak +{rec['peak_above_loaded'] / 2**20:.0f} MiB", flush=True)  # fmt: skip
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(records, indent=1))
    return records


def table(records: list[dict[str, Any]]) -> str:
    """Markdown: one row per graph and part count, METIS and KaMinPar side by side (pure)."""
    by = {(r["graph"], r["parts"], r["partitioner"]): r for r in records}
    cells = sorted({(r["graph"], r["parts"]) for r in records}, key=lambda gp: (GRAPHS.index(gp[0]) if gp[0] in GRAPHS else 99, gp[1]))
    lines = [
        "| graph | nodes | edges | parts | cut METIS | cut KaMinPar | KaMinPar / METIS | balance METIS | balance KaMinPar | time METIS s | time KaMinPar s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for graph, p in cells:
        m, k = by.get((graph, p, "metis")), by.get((graph, p, "kaminpar"))
        if m is None or k is None:
            continue
        ratio = k["cut"] / m["cut"] if m["cut"] else float("nan")
        lines.append(f"| {graph} | {m['nodes']:,} | {m['edges']:,} | {p} | {m['cut']:,} | {k['cut']:,} | {ratio:.2f} | "
                     f"{m['balance']:.3f} | {k['balance']:.3f} | {m['seconds']:.2f} | {k['seconds']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def report(records: list[dict[str, Any]], page: Optional[Path]) -> str:
    text = table(records)
    if page is not None:
        body = page.read_text()
        begin, end = "<!-- BEGIN GENERATED: partitioners -->\n", "<!-- END GENERATED: partitioners -->"
        start, stop = body.index(begin) + len(begin), body.index(end)
        page.write_text(body[:start] + text + "\n" + body[stop:])
    return text


def main(argv: Optional[list[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_one"]:
        print(json.dumps(one(argv[1], int(argv[2]), argv[3])))
        return
    p = argparse.ArgumentParser(prog="python -m benchmarks.partitioners", description=__doc__.splitlines()[0])
    p.add_argument("--graphs", nargs="+", default=list(GRAPHS))
    p.add_argument("--parts", nargs="+", type=int, default=[2, 4, 8])
    p.add_argument("--out", default=str(RESULTS / "partitioners.json"))
    p.add_argument("--report", default=None, help="rewrite the generated table of this page")
    a = p.parse_args(argv)
    records = run(a.graphs, a.parts, Path(a.out))
    print(report(records, Path(a.report) if a.report else None))


if __name__ == "__main__":
    main()
