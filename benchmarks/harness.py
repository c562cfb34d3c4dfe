"""Benchmark harness: runs cells on the real SLURM testbed (or local processes) and summarises them.

    # the whole matrix for one graph on 2 nodes at 100 Mbit/s (cells already done are skipped)
    python benchmarks/harness.py matrix --graph cornell5 --nodes 2 --rate 100mbit
    # one cell
    python benchmarks/harness.py cell --graph tolokers --model gcn --bits 1 --mode pipelined5 --nodes 2
    # baselines: single-process full graph, and DDP + NeighborLoader mini-batches
    python benchmarks/harness.py baselines --graph cornell5 --nodes 2 --rate 100mbit
    # scale: METIS time/memory on the generated graph, training on 2, 4 and 8 ranks
    python benchmarks/harness.py scale --graph sbm --ranks 2 4 8
    # plots and the tables of docs/benchmarks.md from whatever results exist
    python benchmarks/harness.py report

Cells run as ``srun -N<nodes> --ntasks-per-node=1`` on ``../shared/testbed/cluster.sh`` (each node a
network namespace whose link is shaped to ``--rate``); ``--local`` runs the ranks as local
processes instead (no shaping; used by the CI smoke test). Results: one JSON per cell under
``benchmarks/results/<graph>/<nodes>n-<rate>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("LIGHTNING_HALO_BENCH_RESULTS", ROOT / "benchmarks" / "results"))
BITS = (32, 16, 8, 4, 2, 1)
MODES = ("sync", "pipelined", "pipelined5", "periodic")
MODELS = ("gcn", "sage", "gat")
WARMUP = 3  # epochs excluded from timing medians (JIT, first-touch, input-feature exchange)


def testbed() -> Path:
    for candidate in (os.environ.get("LIGHTNING_HALO_TESTBED"), ROOT.parent / "shared" / "testbed" / "cluster.sh",
                      "/work/shared/testbed/cluster.sh"):  # fmt: skip
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise SystemExit("no testbed: ../shared/testbed/cluster.sh not found (set LIGHTNING_HALO_TESTBED)")


class Cluster:
    """The SLURM testbed, brought up (or reshaped) on demand and taken down at exit."""

    def __init__(self) -> None:
        self.nodes = 0
        self.rate = ""

    def ensure(self, nodes: int, rate: str) -> None:
        script = str(testbed())
        if nodes != self.nodes:
            subprocess.run([script, "up", "--nodes", str(nodes), "--rate", rate], check=True, capture_output=True)
            self.nodes, self.rate = nodes, rate
        elif rate != self.rate:
            subprocess.run([script, "shape", "--rate", rate], check=True, capture_output=True)
            self.rate = rate

    def down(self) -> None:
        if self.nodes:
            subprocess.run([str(testbed()), "down"], capture_output=True)
            self.nodes = 0


def cell_path(graph: str, nodes: int, rate: str, name: str) -> Path:
    return RESULTS / graph.replace(":", "-") / f"{nodes}n-{rate}" / f"{name}.json"


def run_ranks(args: list[str], nodes: int, rate: str, cluster: Optional[Cluster], timeout: float) -> Path:
    """Run bench_cell.py on ``nodes`` ranks; return the folder holding rank<r>.json."""
    out = Path(tempfile.mkdtemp(prefix="halo-bench-"))
    cache = os.environ.get("LIGHTNING_HALO_CACHE", str(RESULTS / "tmp" / "cache"))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_cell.py"), *args, "--out", str(out), "--cache-dir", cache]
    if cluster is None:
        from tests.support.launch import check, run_workers  # local processes, torchrun-style

        check(run_workers([*cmd[1:], "--devices", str(nodes)], nodes, timeout=timeout))
        return out
    cluster.ensure(nodes, rate)
    nic = "export GLOO_SOCKET_IFNAME=$(ip -o link | grep -o 'hn[0-9]*' | head -1); "
    line = " ".join(cmd + ["--devices", "1", "--num-nodes", str(nodes)])
    job = f"cd {ROOT}; {nic}export OMP_NUM_THREADS=1 PYTHONPATH={ROOT}; {line}"
    result = subprocess.run(
        [str(testbed()), "exec", "--", "srun", "-J", "halo-bench", f"-N{nodes}", "--ntasks-per-node=1",
         f"--time={int(timeout // 60) + 1}", "bash", "-c", job],
        capture_output=True, text=True, timeout=timeout + 120,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"cell failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return out


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
    traffic = [sum(r["epochs"][e]["fwd_bytes"] + r["epochs"][e]["bwd_bytes"] for r in ranks) for e in measured]
    return {
        "epoch_s": med(step),
        "epoch_s_mean": statistics.fmean(step),
        "breakdown": breakdown,
        # the mean: a periodic run sends in refresh epochs only, a median would hide that
        "bytes_per_epoch": statistics.fmean(traffic),
        "once_bytes": sum(r["epochs"][0]["once_bytes"] for r in ranks),
        "final": {k: curve[-1][k] for k in curve[-1] if k not in ("epoch", "train_wall_s")},
        "best_val": {k: best[k] for k in best if k != "train_wall_s"},
        "curve": curve,
        "peak_rss_mb": max(r["peak_rss_mb"] for r in ranks),
        "peak_rss_mb_per_rank": [r["peak_rss_mb"] for r in ranks],
        "total_s": max(r["total_s"] for r in ranks),
    }


def run_cell(
    graph: str, model: str, bits: int, mode: str, nodes: int, rate: str, epochs: int, cluster: Optional[Cluster],
    force: bool = False, extra: Optional[list[str]] = None, name: Optional[str] = None, timeout: float = 3600,
) -> dict[str, Any]:
    name = name or f"{model}-b{bits}-{mode}"
    path = cell_path(graph, nodes, rate if cluster else "local", name)
    if path.is_file() and not force:
        return json.loads(path.read_text())
    args = ["--graph", graph, "--model", model, "--bits", str(bits), "--mode", mode, "--epochs", str(epochs), *(extra or [])]
    t0 = time.time()
    out = run_ranks(args, nodes, rate, cluster, timeout)
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    shutil.rmtree(out, ignore_errors=True)
    record = {
        "graph": graph, "model": model, "bits": bits, "mode": mode, "nodes": nodes,
        "rate": rate if cluster else "local", "epochs": epochs, "cell": name,
        "summary": summarise(ranks), "ranks": ranks, "wall_s": time.time() - t0,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    s = record["summary"]
    acc = s["final"].get("test_auroc", s["final"].get("test_acc", float("nan")))
    print(f"{graph} {nodes}n {record['rate']} {name}: epoch {s['epoch_s']:.3f} s (wait {s['breakdown']['wait_s']:.3f}, "
          f"codec {s['breakdown']['codec_s']:.3f}, allreduce {s['breakdown']['allreduce_s']:.3f}), "
          f"{s['bytes_per_epoch'] / 1e6:.3f} MB/epoch, test {acc:.4f}", flush=True)  # fmt: skip
    return record


def run_single_baseline(graph: str, model: str, epochs: int, force: bool = False) -> dict[str, Any]:
    """One process, full graph, no halo strategy, one thread: accuracy and compute-only epoch time."""
    path = cell_path(graph, 1, "local", f"{model}-single")
    if path.is_file() and not force:
        return json.loads(path.read_text())
    out = Path(tempfile.mkdtemp(prefix="halo-bench-"))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_NTASKS"):
        env.pop(key, None)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_cell.py"), "--graph", graph, "--model", model,
           "--baseline", "single", "--epochs", str(epochs), "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=7200)
    ranks = [json.loads((out / "rank0.json").read_text())]
    record = {"graph": graph, "model": model, "baseline": "single", "nodes": 1, "epochs": epochs,
              "summary": summarise(ranks), "ranks": ranks, "when": time.strftime("%Y-%m-%d %H:%M:%S")}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    print(f"{graph} single-process {model}: epoch {record['summary']['epoch_s']:.3f} s", flush=True)
    return record


def cmd_matrix(a: argparse.Namespace) -> None:
    cluster = None if a.local else Cluster()
    try:
        for graph in a.graph:
            for model in a.models:
                for mode in a.modes:
                    for bits in a.bits:
                        run_cell(graph, model, bits, mode, a.nodes, a.rate, a.epochs, cluster, a.force,
                                 extra=["--eval-every", str(a.eval_every)])  # fmt: skip
    finally:
        if cluster:
            cluster.down()


def cmd_cell(a: argparse.Namespace) -> None:
    cluster = None if a.local else Cluster()
    try:
        run_cell(a.graph[0], a.model, a.bits, a.mode, a.nodes, a.rate, a.epochs, cluster, a.force,
                 extra=["--eval-every", str(a.eval_every)])  # fmt: skip
    finally:
        if cluster:
            cluster.down()


def cmd_baselines(a: argparse.Namespace) -> None:
    cluster = None if a.local else Cluster()
    try:
        for graph in a.graph:
            for model in a.models:
                run_single_baseline(graph, model, a.epochs, a.force)
                run_cell(graph, model, 32, "sync", a.nodes, a.rate, a.neighbor_epochs, cluster, a.force,
                         extra=["--baseline", "neighbor"], name=f"{model}-neighbor")  # fmt: skip
    finally:
        if cluster:
            cluster.down()


def cmd_scale(a: argparse.Namespace) -> None:
    """METIS time and peak memory of the generated graph, then training on more and more ranks."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    probe = (
        "import json,resource,sys,time,torch; sys.path.insert(0, %r)\n"
        "from benchmarks.graphs import graph_source\n"
        "from lightning_halo.data import load_graph\n"
        "from lightning_halo import partition_graph, build_halo_partitions, partition_stats\n"
        "t=time.time(); d=load_graph(graph_source(%r)); load=time.time()-t\n"
        "rss0=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "out={'nodes': d.num_nodes, 'edges': d.num_edges, 'load_s': load}\n"
        "for p in %r:\n"
        "    t=time.time(); parts=partition_graph(d.edge_index, d.num_nodes, p); tm=time.time()-t\n"
        "    t=time.time(); hp=build_halo_partitions(d, parts, p); th=time.time()-t\n"
        "    s=partition_stats(hp); del hp\n"
        "    out[str(p)]={'metis_s': tm, 'halo_s': th, 'edge_cut': s['edge_cut'], 'halo_rows': s['halo_rows'], 'balance': s['balance']}\n"
        "out['peak_rss_mb']=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024\n"
        "out['graph_rss_mb']=rss0/1024\n"
        "print(json.dumps(out))\n"
    ) % (str(ROOT), a.graph[0], list(a.ranks))
    res = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=7200, check=True)
    part = json.loads(res.stdout.strip().splitlines()[-1])
    path = RESULTS / a.graph[0].replace(":", "-") / "partition.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(part, indent=1))
    print(json.dumps(part, indent=1), flush=True)
    cluster = None if a.local else Cluster()
    try:
        for nodes in a.ranks:
            for bits in a.scale_bits:
                run_cell(a.graph[0], a.models[0], bits, "sync", nodes, a.rate, a.epochs, cluster, a.force,
                         extra=["--hidden", str(a.hidden)], timeout=7200)  # fmt: skip
    finally:
        if cluster:
            cluster.down()


def cmd_soak(a: argparse.Namespace) -> None:
    """A long pipelined 1-bit run: resident memory per rank must stay flat and bytes per epoch constant."""
    cluster = None if a.local else Cluster()
    try:
        run_cell(a.graph[0], a.models[0], 1, "pipelined5", a.nodes, a.rate, a.epochs, cluster, a.force,
                       extra=["--eval-every", "50"], name=f"{a.models[0]}-soak{a.epochs}", timeout=7200)  # fmt: skip
    finally:
        if cluster:
            cluster.down()
    path = cell_path(a.graph[0], a.nodes, a.rate if cluster else "local", f"{a.models[0]}-soak{a.epochs}")
    ranks = json.loads(path.read_text())["ranks"]
    report = {"epochs": a.epochs, "ranks": []}
    for r in ranks:
        rss = [e["rss_mb"] for e in r["epochs"]]
        by = [e["fwd_bytes"] + e["bwd_bytes"] for e in r["epochs"][1:]]
        base = rss[min(20, len(rss) - 1)]
        report["ranks"].append({
            "rank": r["rank"], "rss_at_20_mb": base, "rss_max_after_20_mb": max(rss[20:] or [base]),
            "growth_after_20": max(rss[20:] or [base]) / base - 1.0, "rss_final_mb": rss[-1],
            "bytes_per_epoch_min": min(by), "bytes_per_epoch_max": max(by), "peak_rss_mb": r["peak_rss_mb"],
        })  # fmt: skip
    out = path.with_name(f"{a.models[0]}-soak{a.epochs}-summary.json")
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


def cmd_report(a: argparse.Namespace) -> None:
    from benchmarks.report import write_report

    write_report(RESULTS, Path(a.page))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("matrix", "cell", "baselines", "scale", "soak", "report"):
        p = sub.add_parser(name)
        p.add_argument("--graph", nargs="+", default=["cornell5"])
        p.add_argument("--nodes", type=int, default=2)
        p.add_argument("--rate", default="100mbit")
        p.add_argument("--epochs", type=int, default=30)
        p.add_argument("--models", nargs="+", default=list(MODELS))
        p.add_argument("--modes", nargs="+", default=list(MODES))
        p.add_argument("--bits", nargs="+", type=int, default=list(BITS))
        p.add_argument("--local", action="store_true", help="local processes instead of the SLURM testbed")
        p.add_argument("--eval-every", type=int, default=1, help="evaluate every k epochs")
        p.add_argument("--force", action="store_true", help="rerun cells that already have results")
        if name == "cell":
            p.add_argument("--model", default="gcn")
            p.add_argument("--mode", default="sync")
        if name == "baselines":
            p.add_argument("--neighbor-epochs", type=int, default=10)
        if name == "report":
            p.add_argument("--page", default=str(ROOT / "docs" / "benchmarks.md"))
        if name == "scale":
            p.add_argument("--ranks", nargs="+", type=int, default=[2, 4, 8])
            p.add_argument("--scale-bits", nargs="+", type=int, default=[32, 1])
            p.add_argument("--hidden", type=int, default=64)
    a = parser.parse_args()
    if a.cmd == "cell":
        a.bits = a.bits[0] if len(a.bits) == 1 else 32
    commands = {"matrix": cmd_matrix, "cell": cmd_cell, "baselines": cmd_baselines, "scale": cmd_scale, "soak": cmd_soak,
                "report": cmd_report}  # fmt: skip
    commands[a.cmd](a)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
