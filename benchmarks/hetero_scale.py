"""Heterogeneous graphs at scale: a 2M-node graph shaped like OGB-MAG, partitioned with KaMinPar, trained.

    # the graph: 760,000 papers (128 features, 16 classes), 1.17M authors, institutions, fields of study
    # (no features): 2.0M nodes, 44.6M edges with the reverse types, as a heterogeneous graph directory
    python -m benchmarks.hetero_scale generate --papers 760000 --out benchmarks/results/tmp/mag2m
    # KaMinPar into 2 and 4 parts (one fresh process each): time, peak RSS, cut, halo rows per type
    python -m benchmarks.hetero_scale partition --graph benchmarks/results/tmp/mag2m --parts 2 4
    # training: local ranks (memory per rank and its bound) or 2 testbed nodes at a shaped rate (speed)
    python -m benchmarks.hetero_scale train --graph benchmarks/results/tmp/mag2m --ranks 2 4 --bits 32 --local
    python -m benchmarks.hetero_scale train --graph benchmarks/results/tmp/mag2m --ranks 2 --bits 32 1 --rate 100mbit
    # one process on one core, the whole graph: the time a 2-rank epoch is compared with
    python -m benchmarks.hetero_scale single --graph benchmarks/results/tmp/mag2m
    # the tables of docs/heterogeneous.md ("At scale") from the results
    python -m benchmarks.hetero_scale report --page docs/heterogeneous.md

The model is the zoo's ``HeteroNodeClassifier`` (SAGE per relation, 2 layers, 64 hidden,
``featureless="type"``: one learned row per type without features, so DDP's gradient all-reduce
carries no per-node embedding), Adam, no validation. Each rank records every epoch's wall time,
its bytes per epoch by layer and source type (``<layer>[<type>]``), and its memory as
:mod:`benchmarks.memory` measures a homogeneous rank: peak ``VmHWM`` above the idle process,
against the bound of :func:`benchmarks.memory.memory_bound` (part pages the step read, the
activations autograd saved, one layer's halo rows of every type, model, gradients, Adam).
Results: ``benchmarks/results/hetero_scale/*.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("LIGHTNING_HALO_BENCH_RESULTS", ROOT / "benchmarks" / "results")) / "hetero_scale"
HIDDEN = 64


def _model(dm: Any, hidden: int) -> Any:
    from lightning_halo.models import HeteroNodeClassifier

    return HeteroNodeClassifier(dm.num_classes, dm.metadata, dm.num_features, dm.num_nodes, dm.labelled_type,
                                hidden_channels=hidden, conv="sage", dropout=0.5, featureless="type")  # fmt: skip


# ---------------------------------------------------------------------------------------- generate, partition
def cmd_generate(a: argparse.Namespace) -> None:
    from lightning_halo.data import save_npy_graph
    from lightning_halo.datasets.synthetic import mag_like_graph

    t = time.perf_counter()
    data = mag_like_graph(a.papers, features=128, seed=0)
    save_npy_graph(data, a.out)
    nodes = {t: int(data[t].num_nodes) for t in data.node_types}
    edges = {"__".join(e): int(data[e].edge_index.size(1)) for e in data.edge_types}
    facts = {"papers": a.papers, "nodes": nodes, "edges": edges, "seconds": time.perf_counter() - t,
             "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # fmt: skip
    _save("graph", facts)
    print(f"{sum(nodes.values()):,} nodes, {sum(edges.values()):,} edges in {facts['seconds']:.0f} s -> {a.out}")


def parts_dir(graph: str, parts: int) -> Path:
    return Path(f"{graph}-kaminpar-{parts}")


def cmd_partition(a: argparse.Namespace) -> None:
    for parts in a.parts:
        out = parts_dir(a.graph, parts)
        t = time.perf_counter()
        cmd = [sys.executable, "-m", "lightning_halo.cli", "partition", a.graph, "--parts",
               str(parts), "--partitioner", "kaminpar", "--out", str(out), "--overwrite", "--json"]  # fmt: skip
        proc = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, text=True, check=True)
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        peak = int(proc.stderr.strip().splitlines()[-1]) * 1024  # GNU time's %M: KiB
        record = {"parts": parts, "seconds": time.perf_counter() - t, "peak_rss": peak, "stats": report["stats"],
                  "files": {k: v["bytes"] for k, v in report["manifest"]["files"].items()}}  # fmt: skip
        _save(f"partition-{parts}", record)
        print(f"{parts} parts: {record['seconds']:.0f} s, peak {peak / 1e9:.2f} GB, edge cut {report['stats']['edge_cut']:,}, "
              f"halo rows {report['stats']['halo_rows']:,}")  # fmt: skip


# ---------------------------------------------------------------------------------------- a training rank
def rank_main(a: argparse.Namespace) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import lightning as L
    import torch

    from benchmarks.memory import Sampler, mappings, memory_bound, reset_peak, saved_bytes_probe, status
    from lightning_halo import HaloDataModule, HaloQuantStrategy

    torch.set_num_threads(1)
    env = os.environ  # torchrun-style locally, SLURM's on the testbed
    world, rank = int(env.get("WORLD_SIZE") or env["SLURM_NTASKS"]), int(env.get("RANK") or env["SLURM_PROCID"])
    idle = status()
    reset_peak()
    sampler = Sampler()
    record: dict[str, Any] = {"rank": rank, "world": world, "bits": a.bits, "idle_rss": idle["VmRSS"], "epoch_s": [],
                              "traffic": []}  # fmt: skip
    files = [str(Path(a.parts) / f"part_{rank}.pt")]
    strategy = HaloQuantStrategy(bits=a.bits, halo_reduction=a.halo_reduction)

    class Probe(saved_bytes_probe(record, files)):  # type: ignore[misc]
        """Each epoch's time and bytes; what the first step saves (as benchmarks.memory); the part pages read."""

        t0 = 0.0
        seen: dict = {}

        def on_train_epoch_start(self, trainer, pl_module):
            self.seen = dict(strategy.traffic.total)
            self.t0 = time.perf_counter()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
            sampler.enter("step start")

        def on_before_backward(self, trainer, pl_module, loss):
            super().on_before_backward(trainer, pl_module, loss)
            sampler.enter("backward")

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            sampler.enter("optimizer step")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            sampler.enter("between steps")
            record["part_pages"] = sum(rss for _, _, rss in mappings(files))

        def on_train_epoch_end(self, trainer, pl_module):
            record["epoch_s"].append(time.perf_counter() - self.t0)
            now = dict(strategy.traffic.total)
            record["traffic"].append({f"{layer}/{kind}": v - self.seen.get((layer, kind), 0) for (layer, kind), v in now.items()})

    dm = HaloDataModule(a.parts)
    torch.manual_seed(0)
    model = _model(dm, a.hidden)
    label_phases(model, sampler)
    trainer = L.Trainer(
        strategy=strategy, accelerator="cpu", devices=a.devices, num_nodes=a.num_nodes, max_epochs=a.epochs, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, callbacks=[Probe()],
    )  # fmt: skip
    trainer.fit(model, datamodule=dm)
    record["at_peak"] = sampler.stop()
    record["peak_phase"], record["phase_peaks"] = sampler.peak_phase, sampler.by_phase
    record["peak_rss"] = status()["VmHWM"]
    part = dm.partition
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = sum(v.numel() * v.element_size() for s in trainer.optimizers[0].state.values() for v in s.values()
              if isinstance(v, torch.Tensor))  # fmt: skip
    halo = {t: int(part[t].num_nodes) - int(part[t].n_inner) for t in part.node_types}
    record["halo_rows"] = halo
    record["inner_rows"] = {t: int(part[t].n_inner) for t in part.node_types}
    record["halo_bytes"] = sum(halo.values()) * a.hidden * 4  # one layer's halo rows of every type
    record["model_bytes"], record["optimizer_bytes"] = params, opt
    record["adjacency_bytes"] = relation_adjacency_bytes(part, model)
    record["bound"] = memory_bound(record.get("part_pages", 0), record["adjacency_bytes"], record.get("saved_bytes", 0),
                                   record["halo_bytes"], params, params, opt)  # fmt: skip
    Path(a.result).mkdir(parents=True, exist_ok=True)
    (Path(a.result) / f"rank{rank}.json").write_text(json.dumps(record, indent=1))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def label_phases(model: Any, sampler: Any) -> None:
    """Name the sampler's phase after the layer and the relation the forward is in (``convs.<i>`` and, in a
    ``HeteroConv``, ``convs.<i>.convs.<edge type>``), so that a peak says where it is."""
    import re

    for name, module in model.named_modules():
        if re.fullmatch(r"convs\.\d+(\.convs\.[^.]+)?", name):
            module.register_forward_pre_hook(lambda m, args, n=name: sampler.enter(f"forward {n}"))
            module.register_forward_hook(lambda m, args, out, n=name: sampler.enter(f"after forward {n}"))


def relation_adjacency_bytes(part: Any, model: Any, element_size: int = 4) -> int:
    """What the fused aggregation of every relation the model reads needs at least, as the homogeneous bound
    counts it: the values of the product and of its transpose (``2 nnz s``) and both patterns with int32 ids
    (``4 (n_dst + 1 + nnz) + 4 (n_src + 1 + nnz)``), ``nnz`` the relation's distinct (target, source) pairs."""
    import torch

    relations = {tuple(e) for conv in model.convs for e in getattr(conv, "convs", {}).keys() if isinstance(e, tuple)}
    if not relations:  # HeteroConv keys its modules by "src__rel__dst"
        relations = {tuple(k.split("__")) for conv in model.convs for k in getattr(conv, "convs", {})}
    total = 0
    for src, rel, dst in relations:
        ei = part[src, rel, dst].edge_index
        n_src, n_dst = int(part[src].num_nodes), int(part[dst].n_inner)
        nnz = int(torch.unique(ei[1].long() * n_src + ei[0].long()).numel())
        total += 2 * nnz * element_size + 4 * (n_dst + 1 + nnz) + 4 * (n_src + 1 + nnz)
    return total


def _run(graph: str, ranks: int, bits: int, epochs: int, rate: Optional[str], cluster: Any, timeout: float,
         reduction: str = "cover") -> dict[str, Any]:  # fmt: skip
    out = Path(tempfile.mkdtemp(prefix="halo-hetero-"))
    parts = parts_dir(graph, ranks)
    args = ["-m", "benchmarks.hetero_scale", "_rank", "--parts", str(parts), "--bits", str(bits), "--epochs",
            str(epochs), "--hidden", str(HIDDEN), "--result", str(out), "--halo-reduction", reduction]  # fmt: skip
    t = time.perf_counter()
    if cluster is None:
        from benchmarks.launch import check, run_workers

        check(run_workers([*args, "--devices", str(ranks)], ranks, timeout=timeout, env={"PYTHONPATH": str(ROOT)}))
    else:
        from benchmarks.harness import testbed

        cluster.ensure(ranks, rate)
        nic = "export GLOO_SOCKET_IFNAME=$(ip -o link | grep -o 'hn[0-9]*' | head -1); "
        line = " ".join([sys.executable, *args, "--devices", "1", "--num-nodes", str(ranks)])
        job = f"cd {ROOT}; {nic}export OMP_NUM_THREADS=1 PYTHONPATH={shlex.quote(str(ROOT))}; {line}"
        proc = subprocess.run(
            [str(testbed()), "exec", "--", "srun", "-J", "halo-bench", f"-N{ranks}", "--ntasks-per-node=1",
             f"--time={int(timeout // 60) + 1}", "bash", "-c", job], capture_output=True, text=True, timeout=timeout + 120,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    recs = [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
    return {"ranks": ranks, "bits": bits, "epochs": epochs, "rate": rate or "local", "wall_s": time.perf_counter() - t,
            "records": recs, "when": time.strftime("%Y-%m-%d %H:%M:%S"), "halo_reduction": reduction}  # fmt: skip


def cmd_train(a: argparse.Namespace) -> None:
    from benchmarks.harness import Cluster

    cluster = None if a.local else Cluster()
    try:
        for ranks in a.ranks:
            for bits in a.bits:
                rec = _run(a.graph, ranks, bits, a.epochs, None if a.local else a.rate, cluster, a.timeout, a.halo_reduction)
                name = f"train-{ranks}r-b{bits}-{rec['rate']}{a.tag}"
                rec["env"] = {k: os.environ[k] for k in ("MALLOC_MMAP_THRESHOLD_",) if k in os.environ}
                _save(name, rec)
                epoch = _epoch(rec)
                peak = max(r["peak_rss"] - r["idle_rss"] for r in rec["records"])
                bound = max(r["bound"] for r in rec["records"])
                print(f"{name}: epoch {epoch:.2f} s, {_bytes_per_epoch(rec) / 1e6:.1f} MB/epoch per rank, peak above idle "
                      f"{peak / 1e9:.2f} GB = {peak / bound:.2f} x the bound", flush=True)  # fmt: skip
    finally:
        if cluster is not None:
            cluster.down()


def _epoch(rec: dict[str, Any]) -> float:
    """The median over epochs after the first of the slowest rank's epoch time."""
    import statistics

    per_epoch = [max(r["epoch_s"][e] for r in rec["records"]) for e in range(len(rec["records"][0]["epoch_s"]))]
    return statistics.median(per_epoch[1:] if len(per_epoch) > 1 else per_epoch)


def _bytes_per_epoch(rec: dict[str, Any]) -> float:
    """Bytes one rank sends per epoch (the mean over ranks of the last epoch)."""
    return sum(sum(r["traffic"][-1].values()) for r in rec["records"]) / len(rec["records"])


# ---------------------------------------------------------------------------------------- one process
def cmd_single(a: argparse.Namespace) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torch.nn.functional as F

    from lightning_halo import HaloDataModule
    from lightning_halo.data.hetero import load_npy_hetero_graph

    torch.set_num_threads(1)
    data = load_npy_hetero_graph(a.graph)
    dm = HaloDataModule(data, cache_dir=tempfile.mkdtemp())  # its facts only (metadata, sizes): nothing partitioned
    torch.manual_seed(0)
    model = _model(dm, HIDDEN)
    opt = model.configure_optimizers()
    store = data[dm.labelled_type]
    times = []
    for _ in range(a.epochs):
        t = time.perf_counter()
        opt.zero_grad()
        out = model(data)
        F.cross_entropy(out[store.train_mask], store.y[store.train_mask]).backward()
        opt.step()
        times.append(time.perf_counter() - t)
        print(f"epoch {times[-1]:.2f} s", flush=True)
    rec = {"epochs": a.epochs, "epoch_s": times, "threads": 1, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "when": time.strftime("%Y-%m-%d %H:%M:%S")}  # fmt: skip
    _save("single-1core", rec)


# ---------------------------------------------------------------------------------------- report
def _save(name: str, record: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1))


def _load(name: str) -> Optional[dict[str, Any]]:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def markdown() -> str:
    import statistics

    lines = []
    graph = _load("graph")
    if graph:
        nodes = ", ".join(f"{t} {n:,}" for t, n in graph["nodes"].items())
        lines += [f"Graph: {nodes} ({sum(graph['nodes'].values()):,} nodes); {sum(graph['edges'].values()):,} edges in "
                  f"{len(graph['edges'])} edge types; generated and written in {graph['seconds']:.0f} s.", ""]  # fmt: skip
    rows = [r for r in (_load(f"partition-{p}") for p in (2, 4)) if r]
    if rows:
        lines += ["| KaMinPar | time | peak RSS | edge cut | halo rows | halo rows per type | part file per rank |",
                  "|---|---|---|---|---|---|---|"]
        for r in rows:
            per_type = ", ".join(f"{t} {n:,}" for t, n in r["stats"]["halo_rows_per_type"].items())
            part = statistics.mean(v for k, v in r["files"].items() if k.startswith("part_"))
            lines.append(f"| {r['parts']} parts | {r['seconds']:.0f} s | {r['peak_rss'] / 1e9:.2f} GB | {r['stats']['edge_cut']:,} | "
                         f"{r['stats']['halo_rows']:,} | {per_type} | {part / 1e9:.2f} GB |")  # fmt: skip
        lines.append("")
    runs = sorted((p for p in RESULTS.glob("train-*.json")), key=lambda p: p.name)
    if runs:
        lines += ["| run | epoch (median after the first, slowest rank) | MB sent per epoch per rank | peak above idle, "
                  "largest rank | its bound | peak / bound | where the peak is |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for path in runs:
            rec = json.loads(path.read_text())
            worst = max(rec["records"], key=lambda r: r["peak_rss"] - r["idle_rss"])
            peak = worst["peak_rss"] - worst["idle_rss"]
            env = "".join(f", {k}={v}" for k, v in rec.get("env", {}).items())
            # runs before partial sums reached heterogeneous partitions fetched every halo row
            how = {"cover": ", partial sums", "none": ", every row"}[rec.get("halo_reduction", "none")]
            lines.append(f"| {rec['ranks']} ranks, {rec['bits']} bits, {rec['rate']}{how}{env} | {_epoch(rec):.2f} s | "
                         f"{_bytes_per_epoch(rec) / 1e6:,.1f} | {peak / 1e9:.2f} GB | {worst['bound'] / 1e9:.2f} GB | "
                         f"{peak / worst['bound']:.2f} | {worst.get('peak_phase', '–')} |")  # fmt: skip
        lines.append("")
    single = _load("single-1core")
    if single:
        one = statistics.median(single["epoch_s"][1:] or single["epoch_s"])
        lines.append(f"One process on one core, the whole graph: {one:.2f} s per epoch (median after the first), peak "
                     f"{single['peak_rss'] / 1e9:.2f} GB.")  # fmt: skip
        for rate in ("1gbit", "100mbit"):
            for bits in (32, 1):
                rec = _load(f"train-2r-b{bits}-{rate}")
                if rec:
                    lines.append(f"- 2 testbed nodes at {rate}, {bits} bits: {_epoch(rec):.2f} s per epoch, "
                                 f"{one / _epoch(rec):.2f} x faster than one process on one core.")  # fmt: skip
        lines.append("")
    b32, b1 = _load("train-2r-b32-100mbit"), _load("train-2r-b1-100mbit")
    if b32 and b1:
        lines.append(f"At 100 Mbit/s, 1-bit sync is {_epoch(b32) / _epoch(b1):.2f} x faster than 32-bit sync "
                     f"({_epoch(b32):.2f} s vs {_epoch(b1):.2f} s per epoch).")  # fmt: skip
        s32, s1 = _load("train-2r-b32-100mbit-partial-sums"), _load("train-2r-b1-100mbit-partial-sums")
        if s32 and s1:  # the default since partial sums reached heterogeneous partitions: both send fewer rows
            lines.append(f"With partial sums (both widths), 1-bit sync is {_epoch(s32) / _epoch(s1):.2f} x faster than "
                         f"32-bit sync ({_epoch(s32):.2f} s vs {_epoch(s1):.2f} s per epoch; "
                         f"{_bytes_per_epoch(s32) / 1e6:,.1f} and {_bytes_per_epoch(s1) / 1e6:,.1f} MB per epoch per rank).")  # fmt: skip
        lines.append("")
        traffic = b32["records"][0]["traffic"][-1]
        lines += ["Bytes per epoch of rank 0 by layer and source type (32 bits; every edge type of a source type reads "
                  "its one fetch):", "", "| exchange | bytes |", "|---|---|"]  # fmt: skip
        lines += [f"| `{k}` | {v:,} |" for k, v in sorted(traffic.items())]
    return "\n".join(lines).rstrip() + "\n"


def cmd_report(a: argparse.Namespace) -> None:
    from benchmarks.pages import write_section

    text = markdown()
    print(text)
    if a.page:
        write_section(Path(a.page), "hetero-scale", text)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--papers", type=int, default=760_000)
    g.add_argument("--out", required=True)
    p = sub.add_parser("partition")
    p.add_argument("--graph", required=True)
    p.add_argument("--parts", type=int, nargs="+", default=[2, 4])
    t = sub.add_parser("train")
    t.add_argument("--graph", required=True)
    t.add_argument("--ranks", type=int, nargs="+", default=[2])
    t.add_argument("--bits", type=int, nargs="+", default=[32])
    t.add_argument("--epochs", type=int, default=3)
    t.add_argument("--rate", default="100mbit")
    t.add_argument("--local", action="store_true")
    t.add_argument("--timeout", type=float, default=3600)
    t.add_argument("--halo-reduction", default="cover", choices=["cover", "none"],
                   help="partial sums per relation (the default) or every halo row")
    t.add_argument("--tag", default="", help="appended to the result's name (e.g. -mmap128k for a run with MALLOC_MMAP_THRESHOLD_)")
    s = sub.add_parser("single")
    s.add_argument("--graph", required=True)
    s.add_argument("--epochs", type=int, default=3)
    r = sub.add_parser("report")
    r.add_argument("--page")
    k = sub.add_parser("_rank")
    k.add_argument("--parts", required=True)
    k.add_argument("--bits", type=int, default=32)
    k.add_argument("--epochs", type=int, default=3)
    k.add_argument("--hidden", type=int, default=HIDDEN)
    k.add_argument("--result", required=True)
    k.add_argument("--devices", type=int, default=1)
    k.add_argument("--halo-reduction", default="cover")
    k.add_argument("--num-nodes", type=int, default=1)
    a = parser.parse_args(argv)
    {"generate": cmd_generate, "partition": cmd_partition, "train": cmd_train, "single": cmd_single, "report": cmd_report,
     "_rank": rank_main}[a.command](a)  # fmt: skip


if __name__ == "__main__":
    main()
