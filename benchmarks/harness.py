"""Benchmark harness: runs cells on the real SLURM testbed (or local processes) and summarises them.

    # the whole matrix for one graph on 2 nodes at 100 Mbit/s (cells already done are skipped)
    python -m benchmarks.harness matrix --graph cornell5 --nodes 2 --rate 100mbit
    # one cell
    python -m benchmarks.harness cell --graph tolokers --model gcn --bits 1 --mode pipelined5 --nodes 2
    # baselines: single-process full graph, and DDP + NeighborLoader mini-batches
    python -m benchmarks.harness baselines --graph cornell5 --nodes 2 --rate 100mbit
    # scale: METIS time/memory on the generated graph, training on 2, 4 and 8 ranks
    python -m benchmarks.harness scale --graph sbm --ranks 2 4 8
    # plots and the tables of docs/benchmarks.md from whatever results exist
    python -m benchmarks.harness report

Cells run as ``srun -N<nodes> --ntasks-per-node=1`` on ``../shared/testbed/cluster.sh`` (each node a
network namespace whose link is shaped to ``--rate``); ``--local`` runs the ranks as local
processes instead (no shaping; used by the CI smoke test). Results: one JSON per cell under
``benchmarks/results/<graph>/<nodes>n-<rate>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Iterator, Optional

from benchmarks.shared import shared_path
from benchmarks.summary import BITS, MODELS, MODES, summarise

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("LIGHTNING_HALO_BENCH_RESULTS", ROOT / "benchmarks" / "results"))


def testbed() -> Path:
    """The testbed script (:mod:`benchmarks.shared`); without one the harness stops, naming where it looked."""
    try:
        return shared_path("testbed/cluster.sh", override="LIGHTNING_HALO_TESTBED")
    except FileNotFoundError as err:
        raise SystemExit(f"no testbed: {err}") from err


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


@contextmanager
def cluster_for(a: argparse.Namespace) -> Iterator[Optional[Cluster]]:
    """The testbed for a command (``None`` with ``--local``), always taken down afterwards."""
    cluster = None if a.local else Cluster()
    try:
        yield cluster
    finally:
        if cluster:
            cluster.down()


def cell_path(graph: str, nodes: int, rate: str, name: str) -> Path:
    return RESULTS / graph.replace(":", "-") / f"{nodes}n-{rate}" / f"{name}.json"


def run_ranks(
    args: list[str], nodes: int, rate: str, cluster: Optional[Cluster], timeout: float, env: Optional[dict[str, str]] = None
) -> Path:
    """Run bench_cell.py on ``nodes`` ranks (with ``env`` added to theirs); return the folder holding rank<r>.json."""
    env = env or {}
    out = Path(tempfile.mkdtemp(prefix="halo-bench-"))
    cache = os.environ.get("LIGHTNING_HALO_CACHE", str(RESULTS / "tmp" / "cache"))
    cmd = [sys.executable, "-m", "benchmarks.bench_cell", *args, "--out", str(out), "--cache-dir", cache]
    if cluster is None:
        from benchmarks.launch import check, local_preload, run_workers  # local processes, torchrun-style

        try:
            check(run_workers([*cmd[1:], "--devices", str(nodes)], nodes, timeout=timeout, env=env, preload=local_preload()))
        except AssertionError as err:
            raise RuntimeError(f"cell failed:\n{err}") from err
        return out
    cluster.ensure(nodes, rate)
    nic = "export GLOO_SOCKET_IFNAME=$(ip -o link | grep -o 'hn[0-9]*' | head -1); "
    line = " ".join(cmd + ["--devices", "1", "--num-nodes", str(nodes)])
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **env}.items())
    job = f"cd {ROOT}; {nic}export {exports}; {line}"
    result = subprocess.run(
        [str(testbed()), "exec", "--", "srun", "-J", "halo-bench", f"-N{nodes}", "--ntasks-per-node=1",
         f"--time={int(timeout // 60) + 1}", "bash", "-c", job],
        capture_output=True, text=True, timeout=timeout + 120,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"cell failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return out


def run_cell(
    graph: str, model: str, bits: int, mode: str, nodes: int, rate: str, epochs: int, cluster: Optional[Cluster],
    force: bool = False, extra: Optional[list[str]] = None, name: Optional[str] = None, timeout: float = 3600,
    env: Optional[dict[str, str]] = None, label: Optional[str] = None,
) -> dict[str, Any]:
    name = name or f"{model}-b{bits}-{mode}"
    path = cell_path(label or graph, nodes, rate if cluster else "local", name)
    if path.is_file() and not force:
        return json.loads(path.read_text())  # done, or failed (rerun with --force)
    args = ["--graph", graph, "--model", model, "--bits", str(bits), "--mode", mode, "--epochs", str(epochs), *(extra or [])]
    t0 = time.time()
    try:
        out = run_ranks(args, nodes, rate, cluster, timeout, env)
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        # one failed cell (e.g. out of memory) must not cost the rest of the matrix; it is recorded and reported
        failed = {"graph": graph, "model": model, "bits": bits, "mode": mode, "nodes": nodes, "rate": rate if cluster else "local",
                  "epochs": epochs, "cell": name, "failed": str(err)[-4000:], "wall_s": time.time() - t0,
                  "when": time.strftime("%Y-%m-%d %H:%M:%S")}  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(failed))
        print(f"{graph} {nodes}n {failed['rate']} {name}: FAILED ({str(err).strip().splitlines()[-1][:200]})", flush=True)
        if cluster:  # a crashed job can leave the testbed in a bad state: start it afresh
            cluster.down()
        return failed
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    shutil.rmtree(out, ignore_errors=True)
    record = {
        "graph": graph, "model": model, "bits": bits, "mode": mode, "nodes": nodes,
        "rate": rate if cluster else "local", "epochs": epochs, "cell": name,
        "env": env or {}, "summary": summarise(ranks), "ranks": ranks, "wall_s": time.time() - t0,
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


def run_single_baseline(graph: str, model: str, epochs: int, force: bool = False, extra: Sequence[str] = ()) -> dict[str, Any]:
    """One process, full graph, no halo strategy, one thread: accuracy and compute-only epoch time.

    With ``--sparse`` in ``extra`` the model passes a sparse adjacency (PyG's fused path), else
    ``edge_index`` (its per-edge path): the cells ``<model>-single-sparse`` and ``<model>-single``.
    """
    path = cell_path(graph, 1, "local", f"{model}-single" + ("-sparse" if "--sparse" in extra else ""))
    if path.is_file() and not force:
        return json.loads(path.read_text())
    out = Path(tempfile.mkdtemp(prefix="halo-bench-"))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_NTASKS"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "benchmarks.bench_cell", "--graph", graph, "--model", model,
           "--baseline", "single", "--epochs", str(epochs), "--out", str(out), *extra]  # fmt: skip
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=7200)
    ranks = [json.loads((out / "rank0.json").read_text())]
    record = {"graph": graph, "model": model, "baseline": "single", "nodes": 1, "epochs": epochs, "cell": path.stem,
              "summary": summarise(ranks), "ranks": ranks, "when": time.strftime("%Y-%m-%d %H:%M:%S")}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    print(f"{graph} single-process {model}: epoch {record['summary']['epoch_s']:.3f} s", flush=True)
    return record


def _sparse(a: argparse.Namespace) -> list[str]:
    return ["--sparse"] if getattr(a, "sparse", False) else []


def cmd_matrix(a: argparse.Namespace) -> None:
    if a.label and len(a.graph) > 1:
        raise SystemExit("--label names the results folder of one graph; pass one --graph")
    with cluster_for(a) as cluster:
        for graph in a.graph:
            for model in a.models:
                for mode in a.modes:
                    for bits in a.bits:
                        run_cell(graph, model, bits, mode, a.nodes, a.rate, a.epochs, cluster, a.force,
                                 extra=["--eval-every", str(a.eval_every), "--hidden", str(a.hidden), *_sparse(a)],
                                 label=a.label)  # fmt: skip


def cmd_cell(a: argparse.Namespace) -> None:
    with cluster_for(a) as cluster:
        run_cell(a.graph[0], a.model, a.bits, a.mode, a.nodes, a.rate, a.epochs, cluster, a.force,
                 extra=["--eval-every", str(a.eval_every), "--hidden", str(a.hidden), *_sparse(a)], label=a.label)  # fmt: skip


def cmd_baselines(a: argparse.Namespace) -> None:
    with cluster_for(a) as cluster:
        for graph in a.graph:
            for model in a.models:
                paths = a.single_paths if model != "gat" else ["edge_index"]  # GAT has no fused path
                for path in paths:  # PyG's per-edge path and its fused path on a sparse adjacency
                    run_single_baseline(graph, model, a.epochs, a.force, extra=["--sparse"] if path == "sparse" else [])
                run_cell(graph, model, 32, "sync", a.nodes, a.rate, a.neighbor_epochs, cluster, a.force,
                         extra=["--baseline", "neighbor"], name=f"{model}-neighbor")  # fmt: skip


def cmd_scale(a: argparse.Namespace) -> None:
    """METIS time and peak memory of the generated graph, then training on more and more ranks."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cache = os.environ.get("LIGHTNING_HALO_CACHE", str(RESULTS / "tmp" / "cache"))
    probe = [sys.executable, "-m", "benchmarks.scale_probe", "--graph", a.graph[0], "--cache-dir", cache,
             "--parts", *map(str, a.ranks)]  # fmt: skip
    res = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=7200, check=True)
    part = json.loads(res.stdout.strip().splitlines()[-1])
    path = RESULTS / a.graph[0].replace(":", "-") / "partition.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(part, indent=1))
    print(json.dumps(part, indent=1), flush=True)
    with cluster_for(a) as cluster:
        for nodes in a.ranks:
            for bits in a.scale_bits:
                run_cell(a.graph[0], a.models[0], bits, "sync", nodes, a.rate, a.epochs, cluster, a.force,
                         extra=["--hidden", str(a.hidden), "--eval-every", str(a.eval_every)], timeout=7200)  # fmt: skip


def cmd_soak(a: argparse.Namespace) -> None:
    """A long pipelined 1-bit run: resident memory per rank must stay flat and bytes per epoch constant."""
    # glibc's dynamic mmap threshold moves mid-sized tensors between mmap and the heap, which makes
    # RSS wander by tens of MB without any leak; a fixed threshold (as with jemalloc/tcmalloc) does not
    env = {"MALLOC_MMAP_THRESHOLD_": str(a.mmap_threshold)} if a.mmap_threshold else {}
    name = f"{a.models[0]}-soak{a.epochs}" + ("-mmap" if env else "")
    with cluster_for(a) as cluster:
        run_cell(a.graph[0], a.models[0], 1, "pipelined5", a.nodes, a.rate, a.epochs, cluster, a.force,
                 extra=["--eval-every", "50"], name=name, timeout=7200, env=env)  # fmt: skip
    path = cell_path(a.graph[0], a.nodes, a.rate if cluster else "local", name)
    report = soak_summary(json.loads(path.read_text()))
    path.with_name(f"{name}-summary.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


def soak_summary(record: dict[str, Any]) -> dict[str, Any]:
    """Per rank: peak RSS at epoch 20 and at the end, the RSS trend after 20, bytes per epoch range."""
    report: dict[str, Any] = {"epochs": record["epochs"], "env": record.get("env", {}), "ranks": []}
    for r in record["ranks"]:
        rss = [e["rss_mb"] for e in r["epochs"]]
        by = [e["fwd_bytes"] + e["bwd_bytes"] for e in r["epochs"][1:]]
        k = min(20, len(rss) - 1)
        # peak RSS (the largest resident size seen so far, sampled at every epoch end) at epoch 20 and at the end
        peak20, peak = max(rss[: k + 1]), max(rss)
        tail = rss[k:]
        slope = statistics.linear_regression(range(len(tail)), tail).slope if len(tail) > 1 else 0.0
        report["ranks"].append({
            "rank": r["rank"], "rss_at_20_mb": rss[k], "peak_rss_at_20_mb": peak20, "peak_rss_final_mb": peak,
            "growth_after_20": peak / peak20 - 1.0, "rss_trend_mb_per_100_epochs": 100 * slope, "rss_final_mb": rss[-1],
            "bytes_per_epoch_min": min(by), "bytes_per_epoch_max": max(by), "process_peak_rss_mb": r["peak_rss_mb"],
        })  # fmt: skip
    return report


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
            p.add_argument("--single-paths", nargs="+", choices=["edge_index", "sparse"], default=["edge_index", "sparse"],
                           help="single-process PyG paths to measure (edge_index needs [edges, d] messages)")  # fmt: skip
        if name == "report":
            p.add_argument("--page", default=str(ROOT / "docs" / "benchmarks.md"))
        p.add_argument("--hidden", type=int, default=64 if name == "scale" else 256, help="hidden channels of the model")
        if name in ("matrix", "cell"):
            p.add_argument("--label", default=None,
                           help="results folder (and report section) instead of the graph name, e.g. sbm-h256 for runs at "
                                "another hidden size")  # fmt: skip
        if name in ("matrix", "cell", "baselines"):
            p.add_argument("--sparse", action="store_true",
                           help="models aggregate on lightning_halo.sparse_adjacency (fused spmm, no [edges, d] messages)")  # fmt: skip
        if name == "scale":
            p.add_argument("--ranks", nargs="+", type=int, default=[2, 4, 8])
            p.add_argument("--scale-bits", nargs="+", type=int, default=[32, 1])
        if name == "soak":
            p.add_argument("--mmap-threshold", type=int, default=0,
                           help="fix glibc's mmap threshold (MALLOC_MMAP_THRESHOLD_) for the ranks; 0 keeps the default")  # fmt: skip
    a = parser.parse_args()
    if a.cmd == "cell":
        a.bits = a.bits[0] if len(a.bits) == 1 else 32
    commands = {"matrix": cmd_matrix, "cell": cmd_cell, "baselines": cmd_baselines, "scale": cmd_scale, "soak": cmd_soak,
                "report": cmd_report}  # fmt: skip
    commands[a.cmd](a)


if __name__ == "__main__":
    main()
