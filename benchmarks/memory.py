"""Memory benchmark: peak RSS of the partition step and of every training rank.

    # a graph written to disk a window at a time (never whole in memory): 4M nodes, 64M edges, 128 features
    python -m benchmarks.memory generate --out benchmarks/results/tmp/big --nodes 4000000 --degree 8 --features 128
    # the partition step with METIS and KaMinPar, one fresh process each: peak RSS of every phase, times, cut
    python -m benchmarks.memory partition --graph benchmarks/results/tmp/big --parts 2 4 8 --label big
    # train one epoch from each partition directory on 2/4/8 local ranks: peak RSS per rank and its bound
    python -m benchmarks.memory train --label sbm --ranks 2 4 8 --partitioners metis kaminpar
    # a saved Data given by path (HaloDataModule partitions it in prepare_data), 4 ranks; --code runs another checkout
    python -m benchmarks.memory file --graph benchmarks/results/tmp/sbm-1000000.pt --ranks 4 --label sbm
    # where one rank's memory goes: its training step replayed step by step in one process
    python -m benchmarks.memory breakdown --label sbm --ranks 2 --part 0 --partitioner kaminpar
    # every rank's step replayed in its own process, one after the other (when the ranks do not fit at once)
    python -m benchmarks.memory replay --label big --ranks 2 4 8 --partitioners metis kaminpar
    # summary JSON, the curve (docs/img/memory-per-rank.png) and the section of docs/benchmarks.md
    python -m benchmarks.memory report --page docs/benchmarks.md

Every figure is read from ``/proc/self/status`` of the measured process: ``VmHWM`` (peak resident
set, reset with ``/proc/self/clear_refs`` between phases) and, sampled every 20 ms, ``RssAnon`` /
``RssFile`` (anonymous memory vs pages of mapped files). The *idle baseline* is the resident set
of a rank after importing torch, Lightning, PyG and lightning_halo and building the model, before
any data. Results: ``benchmarks/results/memory/<label>/*.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("LIGHTNING_HALO_BENCH_RESULTS", ROOT / "benchmarks" / "results")) / "memory"
TMP = RESULTS.parent / "tmp"  # graphs and partition directories (git-ignored)
MB = 1 << 20
#: lightning_halo.partition.options.MASK_KEYS, spelled out so that `generate` needs numpy only
MASK_FILES = ("train_mask", "val_mask", "test_mask")


# ---------------------------------------------------------------------------------------- /proc
def status() -> dict[str, int]:
    """``VmRSS``, ``VmHWM``, ``RssAnon``, ``RssFile``, ``RssShmem`` of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(value.split()[0]) * 1024
    return out


def reset_peak() -> None:
    """Start a new ``VmHWM`` measurement (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class Sampler:
    """Samples ``/proc/self/status`` every ``interval`` s and keeps the composition at the largest RSS.

    The measured code may name what it is doing in ``phase`` as it goes: ``by_phase`` keeps the
    largest RSS seen in each phase and ``peak_phase`` the phase of the largest overall.
    """

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.at_peak: dict[str, int] = status()
        self.phase, self.peak_phase = "start", "start"
        self.by_phase: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            s, phase = status(), self.phase
            if s["VmRSS"] > self.by_phase.get(phase, 0):
                self.by_phase[phase] = s["VmRSS"]
            if s["VmRSS"] > self.at_peak["VmRSS"]:
                self.at_peak, self.peak_phase = s, phase

    def enter(self, phase: str) -> None:
        """What the measured code does from now on."""
        self.phase = phase

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        return self.at_peak


# ---------------------------------------------------------------------------------------- the bound
def mappings(paths: list[str]) -> list[tuple[int, int, int]]:
    """``(start, end, resident bytes)`` of this process's mappings of the files ``paths`` (``/proc/self/smaps``)."""
    wanted = {os.path.realpath(p) for p in paths}
    out, current = [], None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):  # a mapping's header line
                lo, hi = (int(v, 16) for v in head[0].split("-"))
                current = [lo, hi, 0] if len(head) >= 6 and head[5] in wanted else None
                if current is not None:
                    out.append(current)
            elif current is not None and head[0] == "Rss:":
                current[2] = int(head[1]) * 1024
    return [tuple(m) for m in out]  # type: ignore[misc]


def saved_tensor_hooks(record: dict[str, Any], exclude: Any) -> Any:
    """``torch.autograd.graph.saved_tensors_hooks`` that add up the distinct storages autograd saves.

    ``exclude(storage)`` says which are counted elsewhere (parameters, pages of the part files).
    """
    import torch

    seen: dict[int, int] = {}

    def pack(t: "torch.Tensor") -> "torch.Tensor":
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in seen and not exclude(st):
            seen[ptr] = st.nbytes()
            record["saved_bytes"] = sum(seen.values())
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)


def saved_bytes_probe(record: dict[str, Any], files: list[str]) -> type:
    """A Lightning callback class that counts what autograd saves in the first training step into
    ``record["saved_bytes"]`` (:func:`saved_tensor_hooks`; parameters and pages of ``files`` excluded)."""
    import lightning as L

    class SavedBytes(L.Callback):
        hooks: Any = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.current_epoch == 0:
                params = {p.untyped_storage().data_ptr() for p in pl_module.parameters()}
                ranges = [(lo, hi) for lo, hi, _ in mappings(files)]
                self.hooks = saved_tensor_hooks(record, lambda st: st.data_ptr() in params or any(
                    lo <= st.data_ptr() < hi for lo, hi in ranges))  # fmt: skip
                self.hooks.__enter__()

        def on_before_backward(self, trainer, pl_module, loss):
            if self.hooks is not None:
                self.hooks.__exit__(None, None, None)
                self.hooks = None

    return SavedBytes


def memory_bound(part_pages: int, adjacency: int, saved: int, halo: int, model: int, grads: int, optimizer: int) -> int:
    r"""The bytes a training rank cannot avoid: what its step reads of the part files (mapped pages:
    features, labels, the stored CSR pattern of the adjacency and its transpose), the values of one
    adjacency and of its transpose, the activations autograd saves for backward, one block of halo
    rows as a layer receives them (in backward: the halo gradients it sends back; never both at
    once), the model, its gradients and the optimizer state. The measured peak is compared with
    this (above the idle process), as the kernel bound is with compute time.

    Example:
        >>> memory_bound(100, 20, 50, 10, 4, 4, 8)
        196
    """
    return part_pages + adjacency + saved + halo + model + grads + optimizer


def adjacency_values_bytes(part: Any, element_size: int = 4) -> int:
    """Values of one fused adjacency and of its transpose on the part's stored CSR pattern (``2 nnz s``)."""
    from lightning_halo.layers.stored import StoredCSR

    stored = StoredCSR.of(part)
    return 2 * stored.nnz * element_size if stored is not None else 0


# ---------------------------------------------------------------------------------------- generate
def generate(out: Path, nodes: int, degree: int, features: int, classes: int, blocks: int, p_in: float, noise: float,
             seed: int, chunk: int = 1 << 18) -> dict[str, Any]:  # fmt: skip
    """The SBM of :func:`benchmarks.graphs.sbm`, written as a graph directory one window of nodes at a time.

    Every node draws ``degree`` out-edges (to its own block with probability ``p_in``), and both
    directions are stored, so ``E = 2 * nodes * degree``. Each window's arrays are written
    with ``os.pwrite`` at their offsets in the ``.npy`` files: the process never holds more than
    one window (its peak RSS is recorded).
    """
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    half = nodes * degree
    size = nodes // blocks
    means = rng.standard_normal((classes, features)).astype(np.float32)
    perm = rng.permutation(nodes)
    split = np.empty(nodes, dtype=np.int8)
    split[perm[: nodes // 2]], split[perm[nodes // 2 : 3 * nodes // 4]], split[perm[3 * nodes // 4 :]] = 0, 1, 2
    files = {
        "edge_index": ((2, 2 * half), np.int64),
        "x": ((nodes, features), np.float32),
        "y": ((nodes,), np.int64),
        "train_mask": ((nodes,), np.bool_),
        "val_mask": ((nodes,), np.bool_),
        "test_mask": ((nodes,), np.bool_),
    }
    fds, offsets = {}, {}
    for name, (shape, dtype) in files.items():
        mm = np.lib.format.open_memmap(out / f"{name}.npy", mode="w+", dtype=dtype, shape=shape)
        offsets[name] = mm.offset
        del mm  # header written, the file sized (sparse); the data goes in with pwrite
        fds[name] = os.open(out / f"{name}.npy", os.O_WRONLY)

    def put(name: str, first_item: int, array: "np.ndarray") -> None:
        buf = memoryview(np.ascontiguousarray(array)).cast("B")
        pos = offsets[name] + first_item * array.itemsize
        while buf:
            n = os.pwrite(fds[name], buf, pos)
            buf, pos = buf[n:], pos + n

    t = time.perf_counter()
    for a in range(0, nodes, chunk):
        b = min(nodes, a + chunk)
        src = np.repeat(np.arange(a, b, dtype=np.int64), degree)
        block = src // size
        local = rng.integers(0, size, src.size) + block * size
        dst = np.where(rng.random(src.size) < p_in, np.minimum(local, nodes - 1), rng.integers(0, nodes, src.size))
        first = a * degree
        put("edge_index", first, src)  # row 0, first half: src -> dst
        put("edge_index", 2 * half + first, dst)  # row 1
        put("edge_index", half + first, dst)  # row 0, second half: dst -> src
        put("edge_index", 3 * half + first, src)
        y = (np.arange(a, b) // size % classes).astype(np.int64)
        put("y", a, y)
        put("x", a * features, means[y] + noise * rng.standard_normal((b - a, features), dtype=np.float32))
        s = split[a:b]
        for k, name in enumerate(MASK_FILES):
            put(name, a, s == k)
    for fd in fds.values():
        os.fsync(fd)
        os.close(fd)
    info = {"nodes": nodes, "edges": 2 * half, "features": features, "classes": classes, "p_in": p_in,
            "bytes": sum((out / f"{n}.npy").stat().st_size for n in files), "seconds": time.perf_counter() - t,
            "peak_rss": status()["VmHWM"]}  # fmt: skip
    (out / "generated.json").write_text(json.dumps(info, indent=1))
    return info


# ---------------------------------------------------------------------------------------- partition
def partition_one(graph: str, parts: int, out: Path, structure: bool, partitioner: str = "metis") -> dict[str, Any]:
    """Run in a fresh process: ``partition_to_dir`` with the peak RSS of each of its phases."""
    from lightning_halo.data.offline import partition_to_dir

    idle = status()
    phases: dict[str, dict[str, float]] = {}
    current: list[str] = []
    sampler = Sampler()

    def on_phase(name: str) -> None:  # close the running phase, open the next
        now, s = time.perf_counter(), status()
        if current:
            phases[current[0]].update(peak=s["VmHWM"], seconds=now - phases[current[0]]["t0"])
            current.clear()
        if name != "done":
            reset_peak()
            phases[name] = {"start_rss": status()["VmRSS"], "t0": now}
            current.append(name)

    shutil.rmtree(out, ignore_errors=True)
    manifest = partition_to_dir(graph, out, parts, partitioner=partitioner, on_phase=on_phase)
    at_peak = sampler.stop()
    record: dict[str, Any] = {
        "graph": graph, "parts": parts, "partitioner": partitioner, "partitioned_with": manifest["partitioned_with"],
        "idle_rss": idle["VmRSS"], "phases": phases,
        "peak_rss": max(p["peak"] for p in phases.values()), "at_peak": at_peak,
        "timings": manifest["timings"], "stats": manifest["stats"], "graph_facts": manifest["graph"],
        "part_bytes": [manifest["files"][f"part_{p}.pt"]["bytes"] for p in range(parts)],
        "adj_bytes": [manifest["files"][f"adj_{p}.pt"]["bytes"] for p in range(parts)],
    }  # fmt: skip
    if structure:  # the CSR METIS gets, measured on its own (after the run: not part of its peak)
        from lightning_halo.data.sources import open_graph
        from lightning_halo.partition.graph import symmetric_csr

        data = open_graph(graph)
        reset_peak()
        before = status()["VmRSS"]
        xadj, adjncy = symmetric_csr(data.edge_index, int(data.num_nodes))
        record["csr_bytes"] = int(xadj.nbytes + adjncy.nbytes)
        record["csr_build_peak_above_start"] = status()["VmHWM"] - before
    return record


def graph_bytes(graph: str) -> int:
    p = Path(graph)
    return p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.glob("*.npy"))


def parts_dir(label: str, parts: int, partitioner: str = "metis") -> Path:
    """Where the partition directory of ``label`` into ``parts`` parts by ``partitioner`` is written."""
    return TMP / "memory" / label / f"{partitioner}-{parts}"


def cmd_partition(a: argparse.Namespace) -> None:
    """Each partitioner and part count in a fresh process; the partitioners side by side per part count."""
    for i, parts in enumerate(a.parts):
        for partitioner in a.partitioners:
            target = RESULTS / a.label / f"partition-{partitioner}-{parts}.json"
            cmd = [sys.executable, "-m", "benchmarks.memory", "_partition", "--graph", a.graph, "--parts", str(parts),
                   "--out", str(parts_dir(a.label, parts, partitioner)), "--result", str(target),
                   "--partitioner", partitioner] + (["--structure"] if i == 0 else [])  # fmt: skip
            _run(cmd)
            rec = json.loads(target.read_text())
            peaks = ", ".join(f"{k} {v['peak'] / MB:.0f}" for k, v in rec["phases"].items())
            print(f"{a.label} P={parts} {partitioner}: partition peak {rec['peak_rss'] / MB:.0f} MB ({peaks}), "
                  f"partitioner {rec['timings']['partition_s']:.1f} s, cut {rec['stats']['edge_cut']}, "
                  f"balance {rec['stats']['balance']:.3f}", flush=True)  # fmt: skip


# ---------------------------------------------------------------------------------------- train
def launch(args: list[str], world: int, timeout: float, code: Optional[str] = None) -> None:
    """This script with ``args`` as ``world`` local ranks (env rendezvous, as torchrun), fresh interpreters
    (forked from preloaded modules where ``$LIGHTNING_HALO_BENCH_PRELOAD`` says so, never with ``code``)."""
    # imported here: a rank may run with another checkout first on its path
    from benchmarks.launch import local_preload, run_workers

    # by path, not -m: sys.path[0] is then benchmarks/, so `code` (if given) supplies lightning_halo
    pythonpath = os.pathsep.join(filter(None, [code, str(ROOT)]))
    preload = () if code else local_preload()  # a preloaded lightning_halo is this checkout's
    results = run_workers([str(Path(__file__).resolve()), *args], world, timeout, env={"PYTHONPATH": pythonpath},
                          preload=preload, stream=not preload)  # fmt: skip
    for r in results:  # forked ranks' output comes back captured (streamed ranks printed theirs)
        print(r.stdout, end="", flush=True)
    codes = [r.returncode for r in results]
    if any(codes):
        raise SystemExit(f"ranks failed: exit codes {codes}")


def rank_main(a: argparse.Namespace) -> None:
    """One training rank: phases ``load`` (prepare_data, setup, strategy setup) and ``train``."""
    import warnings

    warnings.filterwarnings("ignore")
    import lightning as L
    import torch

    import lightning_halo
    from lightning_halo import HaloDataModule, HaloQuantStrategy
    from lightning_halo.models import GraphSAGE

    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    torch.manual_seed(0)
    probe = GraphSAGE(8, 2, hidden_channels=a.hidden, sparse=True)  # a model exists in the idle process too
    del probe
    idle = status()
    reset_peak()
    sampler = Sampler()
    record: dict[str, Any] = {"rank": rank, "world": world, "idle_rss": idle["VmRSS"], "phases": {},
                              "lightning_halo": str(Path(lightning_halo.__file__).parent)}  # fmt: skip
    t0 = time.perf_counter()

    files: list[str] = []

    class Probe(saved_bytes_probe(record, files)):  # type: ignore[misc]
        """Phase peaks; in the first step, what autograd saves; after it, the part pages the step read."""

        def on_fit_start(self, trainer, pl_module):  # data loaded, model wrapped
            record["phases"]["load"] = {"peak": status()["VmHWM"], "seconds": time.perf_counter() - t0}
            reset_peak()
            d = Path(a.data) if a.cache_dir is None else trainer.datamodule.cache_for(world).dir
            files.extend(str(d / f"{kind}_{rank}.pt") for kind in ("part", "adj"))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            record.setdefault("resident_after_step", []).append(status()["VmRSS"])
            record["part_pages"] = sum(rss for _, _, rss in mappings(files))

        def on_train_end(self, trainer, pl_module):
            record["phases"]["train"] = {"peak": status()["VmHWM"], "seconds": time.perf_counter() - t0}

    dm = HaloDataModule(a.data, cache_dir=a.cache_dir)
    # the model passes batch.edge_index; the strategy aggregates with the stored CSR (aggregation="auto")
    model = GraphSAGE(dm.num_features, dm.num_classes, hidden_channels=a.hidden, sparse=False)
    trainer = L.Trainer(
        strategy=HaloQuantStrategy(bits=32, **({"halo_reduction": a.halo_reduction} if a.halo_reduction else {})),
        accelerator="cpu", devices=world, max_epochs=a.epochs, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, callbacks=[Probe()],
    )  # fmt: skip
    trainer.fit(model, datamodule=dm)
    record["at_peak"] = sampler.stop()
    record["peak_rss"] = max(p["peak"] for p in record["phases"].values())
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = sum(v.numel() * v.element_size() for s in trainer.optimizers[0].state.values() for v in s.values()
              if isinstance(v, torch.Tensor))  # fmt: skip
    record["model_bytes"], record["grad_bytes"], record["optimizer_bytes"] = params, params, opt
    record["adjacency_bytes"] = adjacency_values_bytes(dm.partition)
    record["halo_bytes"] = int(dm.partition.n_halo) * a.hidden * 4  # layer 2's halo rows (layer 1's: the part file)
    record["bound"] = memory_bound(record.get("part_pages", 0), record["adjacency_bytes"], record.get("saved_bytes", 0),
                                   record["halo_bytes"], params, params, opt)  # fmt: skip
    if hasattr(dm, "cache_for"):  # this checkout's partition directories (not in the code before them)
        directory = Path(a.data) if a.cache_dir is None else dm.cache_for(world).dir
        manifest = json.loads((directory / "manifest.json").read_text())
        record["part_bytes"] = manifest["files"][f"part_{rank}.pt"]["bytes"]
        record["graph_facts"] = manifest["graph"]
    part = dm.partition
    record["n_inner"], record["n_halo"] = int(part.n_inner), int(part.n_halo)
    Path(a.result).mkdir(parents=True, exist_ok=True)
    (Path(a.result) / f"rank{rank}.json").write_text(json.dumps(record, indent=1))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def train(data: str, world: int, result: Path, *, cache_dir: Optional[str], epochs: int, hidden: int,
          code: Optional[str] = None, timeout: float = 3600, halo_reduction: Optional[str] = None) -> dict[str, Any]:  # fmt: skip
    tmp = result.with_suffix(".ranks")
    shutil.rmtree(tmp, ignore_errors=True)
    args = ["_rank", "--data", data, "--result", str(tmp), "--epochs", str(epochs), "--hidden", str(hidden)]
    if halo_reduction:  # the strategy's default otherwise (and the only choice of code before partial sums)
        args += ["--halo-reduction", halo_reduction]
    if cache_dir:
        args += ["--cache-dir", cache_dir]
    t = time.perf_counter()
    launch(args, world, timeout, code)
    ranks = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(world)]
    shutil.rmtree(tmp, ignore_errors=True)
    record = {"data": data, "world": world, "epochs": epochs, "hidden": hidden, "code": code or "this checkout",
              "seconds": time.perf_counter() - t, "ranks": ranks}  # fmt: skip
    result.parent.mkdir(parents=True, exist_ok=True)
    result.write_text(json.dumps(record, indent=1))
    return record


def _line(rec: dict[str, Any]) -> str:
    cells = []
    for r in rec["ranks"]:
        above = (r["peak_rss"] - r["idle_rss"]) / MB
        bound = f" bound {r['bound'] / MB:.0f}" if "bound" in r else ""
        cells.append(f"r{r['rank']} {r['peak_rss'] / MB:.0f} MB (+{above:.0f}{bound})")
    return ", ".join(cells)


def cmd_train(a: argparse.Namespace) -> None:
    """Real ranks from every partition directory of the label (``partition`` wrote them)."""
    for partitioner in a.partitioners:
        for world in a.ranks:
            directory = parts_dir(a.label, world, partitioner)
            if not (directory / "manifest.json").is_file():
                raise SystemExit(f"{directory} does not exist: run `python -m benchmarks.memory partition` first")
            suffix = "-" + re.sub(r"[^A-Za-z0-9]+", "-", a.variant).strip("-").lower() if a.variant else ""  # a file name
            target = RESULTS / a.label / f"train-dir-{partitioner}-{world}{suffix}.json"
            rec = train(str(directory), world, target, cache_dir=None, epochs=a.epochs, hidden=a.hidden, code=a.code,
                        halo_reduction=a.halo_reduction)  # fmt: skip
            rec["partitioner"], rec["variant"] = partitioner, a.variant
            target.write_text(json.dumps(rec, indent=1))
            print(f"{a.label} {partitioner}, {world} ranks: {_line(rec)}", flush=True)


def cmd_file(a: argparse.Namespace) -> None:
    """``HaloDataModule(<file>)`` on ``--ranks`` ranks: cold cache (rank 0 partitions), then warm."""
    tag = a.tag or ("main" if a.code else "file")
    cache = TMP / "memory" / a.label / f"cache-{tag}"
    shutil.rmtree(cache, ignore_errors=True)
    for state in ("cold", "warm"):
        rec = train(a.graph, a.ranks, RESULTS / a.label / f"train-{tag}-{state}-{a.ranks}.json", cache_dir=str(cache),
                    epochs=a.epochs, hidden=a.hidden, code=a.code)  # fmt: skip
        rec["graph_bytes"] = graph_bytes(a.graph)
        (RESULTS / a.label / f"train-{tag}-{state}-{a.ranks}.json").write_text(json.dumps(rec, indent=1))
        print(f"{a.label} {tag} {state}, {a.ranks} ranks: {_line(rec)}", flush=True)
    shutil.rmtree(cache, ignore_errors=True)


def _run(cmd: list[str]) -> None:
    """``cmd`` (``sys.executable`` first) in its own process: a fresh interpreter, or forked from the
    preloaded modules where ``$LIGHTNING_HALO_BENCH_PRELOAD`` says so (its peaks are still its own)."""
    from benchmarks.launch import local_preload, run_forked

    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    if not local_preload():
        subprocess.run(cmd, cwd=ROOT, env=env, check=True)
        return
    done = run_forked(cmd[1:], env, ROOT, local_preload(), timeout=3600)
    print(done.stdout, end="", flush=True)
    print(done.stderr, end="", file=sys.stderr, flush=True)
    if done.returncode:
        raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)


# ---------------------------------------------------------------------------------------- breakdown
def breakdown(directory: str, part_id: int, hidden: int, epochs: int = 1) -> dict[str, Any]:
    """Where one rank's memory goes: its training step replayed in one process, step by step.

    The rank's part is loaded as in training (memory-mapped) and one GraphSAGE step (two
    ``SAGEConv``, mean, the fused path) runs through the library's own pieces as the strategy
    runs them: the first layer's input ``[x; halo_x]`` by :func:`~lightning_halo.layers.apply.join`
    (a view of the part file's tensor), the adjacency and its transpose from the stored CSR
    (:class:`~lightning_halo.layers.stored.StoredCSR`), the second layer's input with the halo
    rows a peer would send (zeros here), backward and an Adam step. Each row: the peak RSS of
    that step and the resident set after it, split into anonymous memory and mapped-file pages;
    then the bound of :func:`memory_bound` from what autograd saved and the part pages read.
    """
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import SAGEConv

    from lightning_halo.data import PartitionDirectory
    from lightning_halo.layers.apply import join
    from lightning_halo.layers.stored import StoredCSR

    rows: list[dict[str, Any]] = []
    record: dict[str, Any] = {"saved_bytes": 0}

    def mark(step: str) -> None:
        s = status()
        rows.append({"step": step, "peak_mb": s["VmHWM"] / MB, "rss_mb": s["VmRSS"] / MB, "anon_mb": s["RssAnon"] / MB,
                     "file_mb": s["RssFile"] / MB})  # fmt: skip
        reset_peak()

    torch.manual_seed(0)
    n_classes = int(json.loads((Path(directory) / "manifest.json").read_text())["graph"]["num_classes"])
    mark("idle")
    part = PartitionDirectory(directory).load_part(part_id)
    files = [str(Path(directory) / f"{kind}_{part_id}.pt") for kind in ("part", "adj")]
    mark("part loaded (mapped)")
    stored = StoredCSR.of(part)
    assert stored is not None, "a format-4 partition directory stores the CSR"
    n_in, n_halo = int(part.n_inner), int(part.n_halo)
    adj = stored.raw(None, "mean", n_in, torch.float32)
    mark("adjacency values (stored CSR)")
    conv1, conv2 = SAGEConv(part.x.size(1), hidden), SAGEConv(hidden, n_classes)
    params = [*conv1.parameters(), *conv2.parameters()]
    opt = torch.optim.Adam(params)
    ptrs = {p.untyped_storage().data_ptr() for p in params}
    ranges = [(lo, hi) for lo, hi, _ in mappings(files)]
    for epoch in range(epochs):  # the first epoch counts what autograd saves; later ones show the peak is steady
        tag = "" if epochs == 1 else f"epoch {epoch}: "
        exclude = lambda st: st.data_ptr() in ptrs or any(lo <= st.data_ptr() < hi for lo, hi in ranges)  # noqa: E731
        hooks = saved_tensor_hooks(record, exclude) if epoch == 0 else contextlib.nullcontext()
        opt.zero_grad(set_to_none=True)
        with hooks:
            x_all = join(part.x, part.halo_x)
            mark(tag + "[x; halo_x]: layer 1 input (a view)")
            h = conv1((x_all, part.x), adj).relu()
            del x_all  # as in a model: the layer's input is dropped when it returns (autograd keeps what it saved)
            mark(tag + "layer 1")
            h_all = join(h, h.new_zeros(n_halo, hidden))
            mark(tag + "layer 2 input (with halo rows)")
            out = conv2((h_all, h), adj)
            del h_all
            loss = F.cross_entropy(out[part.train_mask], part.y[part.train_mask])
            mark(tag + "layer 2 + loss")
        loss.backward()
        mark(tag + "backward (transpose from the stored pattern)")
        opt.step()
        del h, out, loss
        mark(tag + "Adam step")
    model = sum(p.numel() * p.element_size() for p in params)
    state = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if torch.is_tensor(v))
    pages = sum(rss for _, _, rss in mappings(files))
    adjacency = adjacency_values_bytes(part)
    halo = n_halo * hidden * 4  # layer 2's halo rows (layer 1's come from the part file: pages)
    return {"steps": rows, "part_pages": pages, "adjacency_bytes": adjacency, "saved_bytes": record["saved_bytes"],
            "halo_bytes": halo, "model_bytes": model, "grad_bytes": model, "optimizer_bytes": state, "n_inner": n_in,
            "n_halo": n_halo, "bound": memory_bound(pages, adjacency, record["saved_bytes"], halo, model, model, state)}  # fmt: skip


def cmd_replay(a: argparse.Namespace) -> None:
    """:func:`breakdown` of every part, each in a fresh process: per-rank peaks when the ranks of one
    machine would not fit in its memory at once (calibrated against real runs where they do)."""
    for partitioner in a.partitioners:
        for world in a.ranks:
            directory = parts_dir(a.label, world, partitioner)
            manifest = json.loads((directory / "manifest.json").read_text())
            parts = []
            for p in range(world):
                _run([sys.executable, "-m", "benchmarks.memory", "breakdown", "--label", a.label, "--ranks", str(world),
                      "--part", str(p), "--hidden", str(a.hidden), "--partitioner", partitioner, "--epochs", str(a.epochs)])  # fmt: skip
                target = RESULTS / a.label / f"breakdown-{partitioner}-{world}.json"
                rec = json.loads(target.read_text())
                target.unlink()
                rec["part_bytes"] = manifest["files"][f"part_{p}.pt"]["bytes"]
                rec["adj_bytes"] = manifest["files"][f"adj_{p}.pt"]["bytes"]
                parts.append(rec)
            out = {"world": world, "partitioner": partitioner, "hidden": a.hidden, "epochs": a.epochs, "parts": parts}
            (RESULTS / a.label / f"replay-{partitioner}-{world}.json").write_text(json.dumps(out, indent=1))
            cells = ", ".join(f"{max(st['peak_mb'] for st in r['steps']):.0f} (bound {r['bound'] / MB:.0f})" for r in parts)
            print(f"{a.label} {partitioner} replay, {world} parts: peak MB per rank {cells}", flush=True)


# ---------------------------------------------------------------------------------------- report
def _partition_summary(r: dict[str, Any]) -> dict[str, Any]:
    used = r["partitioned_with"]
    own = used.get("kaminpar_s", used.get("metis_s"))
    csr = r.get("csr_bytes") or used.get("csr_bytes")
    return {
        "peak_mb": r["peak_rss"] / MB, "idle_mb": r["idle_rss"] / MB,
        "partition_phase_peak_mb": r["phases"]["partition"]["peak"] / MB,
        "phase_peaks_mb": {k: v["peak"] / MB for k, v in r["phases"].items()},
        "partition_s": r["timings"]["partition_s"], "partitioner_s": own, "csr_s": used.get("csr_s"),
        "halo_s": r["timings"]["halo_s"], "write_s": r["timings"]["write_s"],
        "seconds": sum(v["seconds"] for v in r["phases"].values()),
        "csr_mb": csr / MB if csr else None, "features_mb": _features_mb(r["graph_facts"]),
        # the target for the partition step: peak <= 1.5 x the CSR's bytes + 0.5 GB
        "target_mb": 1.5 * csr / MB + 512 if csr else None,
        "part_mb": [b / MB for b in r["part_bytes"]], "adj_mb": [b / MB for b in r.get("adj_bytes", [])],
        "edge_cut": r["stats"]["edge_cut"], "balance": r["stats"]["balance"],
        "halo_rows": r["stats"]["halo_rows"], "replication": r["stats"]["replication"],
    }  # fmt: skip


def _rank_summary(rank: int, peak: float, idle: float, resident: float, part: float, bound: Optional[float],
                  anon: Optional[float] = None, file: Optional[float] = None) -> dict[str, Any]:  # fmt: skip
    """One rank, in MiB: the peak and the resident set after the step above the idle process, against the bound."""
    return {"rank": rank, "peak_mb": peak, "idle_mb": idle, "above_idle_mb": peak - idle, "resident_above_idle_mb": resident - idle,
            "part_mb": part, "bound_mb": bound, "peak_over_bound": (peak - idle) / bound if bound else None,
            "resident_over_bound": (resident - idle) / bound if bound else None, "anon_at_peak_mb": anon,
            "file_at_peak_mb": file}  # fmt: skip


def summarise(label: str) -> dict[str, Any]:
    """Per-rank and partition figures of one graph, with the issue's ratios (pure: reads the JSONs only)."""
    folder = RESULTS / label
    out: dict[str, Any] = {"label": label, "partition": {}, "directory": {}, "replay": {}, "file": {}}
    for f in sorted(folder.glob("partition-*-*.json")):
        r = json.loads(f.read_text())
        out["partition"].setdefault(r["partitioner"], {})[r["parts"]] = _partition_summary(r)
    known = [p["csr_mb"] for runs in out["partition"].values() for p in runs.values() if p["csr_mb"]]
    for runs in out["partition"].values():  # the CSR is measured once per graph (the first run with --structure)
        for p in runs.values():
            if known and not p["csr_mb"]:
                p["csr_mb"], p["target_mb"] = known[0], 1.5 * known[0] + 512
    for f in sorted(folder.glob("train-dir-*-*.json")):
        r = json.loads(f.read_text())
        ranks = [_rank_summary(x["rank"], x["peak_rss"] / MB, x["idle_rss"] / MB, max(x["resident_after_step"]) / MB,
                               x.get("part_bytes", 0) / MB, x["bound"] / MB, x["at_peak"]["RssAnon"] / MB,
                               x["at_peak"]["RssFile"] / MB) for x in r["ranks"]]  # fmt: skip
        group = r["partitioner"] + (f", {r['variant']}" if r.get("variant") else "")
        out["directory"].setdefault(group, {})[r["world"]] = {"world": r["world"], "seconds": r["seconds"], "ranks": ranks}
    for f in sorted(folder.glob("replay-*-*.json")):
        r = json.loads(f.read_text())
        ranks = []
        for p, rec in enumerate(r["parts"]):
            steps = rec["steps"]
            ranks.append(_rank_summary(p, max(st["peak_mb"] for st in steps), steps[0]["rss_mb"], steps[-1]["rss_mb"],
                                       rec["part_bytes"] / MB, rec["bound"] / MB) | {"steps": steps})  # fmt: skip
        out["replay"].setdefault(r["partitioner"], {})[r["world"]] = {"world": r["world"], "epochs": r.get("epochs", 1), "ranks": ranks}
    for f in sorted(folder.glob("train-*-*-*.json")):
        if f.name.startswith("train-dir-"):
            continue
        r = json.loads(f.read_text())
        ranks = [{"rank": x["rank"], "above_idle_mb": (x["peak_rss"] - x["idle_rss"]) / MB,
                  "load_above_idle_mb": (x["phases"]["load"]["peak"] - x["idle_rss"]) / MB} for x in r["ranks"]]  # fmt: skip
        entry = {"world": r["world"], "code": r["code"], "ranks": ranks, "graph_mb": r["graph_bytes"] / MB}
        entry["max_above_idle_over_graph"] = max(x["above_idle_mb"] for x in ranks) / entry["graph_mb"]
        out["file"][f.stem.removeprefix("train-")] = entry
    return out


def _features_mb(facts: dict[str, Any]) -> float:
    return facts["num_nodes"] * facts["num_features"] * {"float64": 8, "float16": 2, "bfloat16": 2}.get(facts["x_dtype"], 4) / MB


def _curve(runs: dict[Any, Any], key: str) -> tuple[list[int], list[float]]:
    worlds = sorted(int(w) for w in runs)
    return worlds, [max(r[key] for r in runs[w if w in runs else str(w)]["ranks"]) / 1024 for w in worlds]


def plot(summaries: list[dict[str, Any]], path: Path) -> None:
    """Peak per rank above the idle process (max over ranks) against the bound, per graph and partitioner."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.8))
    for s in summaries:
        for kind, style in (("directory", "o-"), ("replay", "s--")):
            for partitioner, runs in s[kind].items():
                worlds, peak = _curve(runs, "above_idle_mb")
                (line,) = ax.plot(worlds, peak, style, label=f"{s['label']} {partitioner}: peak above idle ({'real ranks' if kind == 'directory' else 'replayed'})")
                _, bound = _curve(runs, "bound_mb")
                ax.plot(worlds, bound, ":x", color=line.get_color(), alpha=0.7, label=f"{s['label']} {partitioner}: bound")
    ax.set_xscale("log", base=2)
    ax.set_xticks([2, 4, 8], ["2", "4", "8"])
    ax.set_xlabel("ranks")
    ax.set_ylabel("GiB above the idle process")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    ax.set_title("Training rank: peak resident memory vs the bound (max over ranks), one step", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def _span(values: list[float], fmt: str = ".0f") -> str:
    lo, hi = min(values), max(values)
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}–{hi:{fmt}}"


def markdown(summaries: list[dict[str, Any]]) -> str:
    lines = []
    for s in summaries:
        lines += [f"#### {s['label']}", ""]
        if s["partition"]:
            lines += ["Partition step (`lightning-halo partition GRAPH --parts P --partitioner NAME --out DIR`, one fresh process "
                      "each; MiB; *target*: 1.5 × the int64 CSR + 512 MiB):", "",
                      "| partitioner | parts | peak RSS | target | partition phase peak | scan / halo / write peaks | partitioner s "
                      "| total s | edge cut | balance |",
                      "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"]  # fmt: skip
            for partitioner, runs in sorted(s["partition"].items()):
                for parts, p in sorted(runs.items(), key=lambda kv: int(kv[0])):
                    ph = p["phase_peaks_mb"]
                    own = f"{p['partitioner_s']:.1f}" if p["partitioner_s"] else f"{p['partition_s']:.1f} (with the CSR)"
                    target = f"{p['target_mb']:.0f}" if p["target_mb"] else "–"
                    lines.append(f"| {partitioner} | {parts} | {p['peak_mb']:.0f} | {target} | {p['partition_phase_peak_mb']:.0f} | "
                                 f"{ph['scan']:.0f} / {ph['halo']:.0f} / {ph['write']:.0f} | {own} | {p['seconds']:.0f} | "
                                 f"{p['edge_cut']:,} | {p['balance']:.3f} |")  # fmt: skip
            first = next(iter(next(iter(s["partition"].values())).values()))
            if first.get("csr_mb"):
                lines += ["", f"The CSR (int64) the partitioners start from: {first['csr_mb']:.0f} MiB; the node features: "
                          f"{first['features_mb']:.0f} MiB; idle process {first['idle_mb']:.0f} MiB."]  # fmt: skip
            lines.append("")
        for kind, title in (("directory", "Training from the partition directory, real ranks, one epoch"),
                            ("replay", "Every rank's training step replayed in its own process, one after the other")):  # fmt: skip
            if not s[kind]:
                continue
            lines += [title + " (GraphSAGE hidden 64, fused mean aggregation, bits=32; MiB above the idle process; "
                      "*bound*: part pages read + the values of one adjacency and its transpose + activations autograd saves + one block of halo rows "
                      "+ model + gradients + Adam state):", "",
                      "| partitioner | ranks | part file | bound | peak | peak / bound | resident after the step | resident / bound "
                      "| anon / file pages at peak |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
            for partitioner, runs in sorted(s[kind].items()):
                for world, d in sorted(runs.items(), key=lambda kv: int(kv[0])):
                    rs = d["ranks"]
                    comp = (f"{max(r['anon_at_peak_mb'] for r in rs):.0f} / {max(r['file_at_peak_mb'] for r in rs):.0f}"
                            if rs[0].get("anon_at_peak_mb") is not None else "–")  # fmt: skip
                    steps = f" ({d['epochs']} steps)" if d.get("epochs", 1) > 1 else ""
                    lines.append(
                        f"| {partitioner} | {world}{steps} | {_span([r['part_mb'] for r in rs])} | {_span([r['bound_mb'] for r in rs])} | "
                        f"{_span([r['above_idle_mb'] for r in rs])} | {max(r['peak_over_bound'] for r in rs):.2f} | "
                        f"{_span([r['resident_above_idle_mb'] for r in rs])} | {max(r['resident_over_bound'] for r in rs):.2f} | {comp} |"
                    )  # fmt: skip
            lines.append("")
        if s["file"]:
            lines += ["A saved `Data` given by path (`HaloDataModule(\"graph.pt\")`; *cold*: rank 0 partitions in `prepare_data`, "
                      "*warm*: the cache exists; *before*: the code before partition directories; measured with format 3, "
                      "not re-run). Above the idle baseline, MiB:", "",
                      "| run | ranks | graph file | data loading, per rank | peak, per rank | max peak above idle / graph |",
                      "|---|---:|---:|---|---|---:|"]  # fmt: skip
            for name, f in sorted(s["file"].items(), key=lambda kv: (int(kv[0].split("-")[-1]), kv[0])):
                load = ", ".join(f"{r['load_above_idle_mb']:.0f}" for r in f["ranks"])
                per = ", ".join(f"{r['above_idle_mb']:.0f}" for r in f["ranks"])
                who = "before" if name.startswith("main") else "now"
                lines.append(f"| {who}, {name.split('-')[1]} | {f['world']} | {f['graph_mb']:.0f} | {load} | {per} | "
                             f"{f['max_above_idle_over_graph']:.2f} |")  # fmt: skip
            lines.append("")
    return "\n".join(lines)


def cmd_report(a: argparse.Namespace) -> None:
    labels = a.labels or sorted(p.name for p in RESULTS.iterdir() if p.is_dir())
    summaries = [summarise(label) for label in labels]
    (RESULTS / "summary.json").write_text(json.dumps(summaries, indent=1))
    plot(summaries, Path(a.img))
    text = markdown(summaries)
    if a.page:
        page = Path(a.page)
        body = page.read_text()
        begin, end = "<!-- BEGIN GENERATED: memory -->\n", "<!-- END GENERATED: memory -->"
        start, stop = body.index(begin) + len(begin), body.index(end)
        page.write_text(body[:start] + text + "\n" + body[stop:])
    print(text)


# ---------------------------------------------------------------------------------------- main
def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--out", required=True)
    g.add_argument("--nodes", type=int, default=4_000_000)
    g.add_argument("--degree", type=int, default=8, help="out-edges drawn per node (E = 2 * nodes * degree)")
    g.add_argument("--features", type=int, default=128)
    g.add_argument("--classes", type=int, default=8)
    g.add_argument("--blocks", type=int, default=256)
    g.add_argument("--p-in", type=float, default=0.95)
    g.add_argument("--noise", type=float, default=2.0)
    g.add_argument("--seed", type=int, default=0)
    pa = sub.add_parser("partition")
    pa.add_argument("--graph", required=True)
    pa.add_argument("--parts", nargs="+", type=int, default=[2, 4, 8])
    pa.add_argument("--label", required=True)
    pa.add_argument("--partitioners", nargs="+", default=["metis", "kaminpar"])
    for name in ("train", "file"):
        t = sub.add_parser(name)
        t.add_argument("--label", required=True)
        t.add_argument("--epochs", type=int, default=1)
        t.add_argument("--hidden", type=int, default=64)
        if name == "train":
            t.add_argument("--ranks", nargs="+", type=int, default=[2, 4, 8])
            t.add_argument("--partitioners", nargs="+", default=["metis", "kaminpar"])
            t.add_argument("--variant", default="", help="a name for the run's setting (e.g. an environment variable set)")
            t.add_argument("--code", default=None, help="import lightning_halo from this source tree instead")
            t.add_argument("--halo-reduction", default=None, choices=["cover", "none"],
                           help="HaloQuantStrategy(halo_reduction=...) (default: the strategy's); name it with --variant")
        else:
            t.add_argument("--graph", required=True)
            t.add_argument("--ranks", type=int, default=4)
            t.add_argument("--code", default=None, help="import lightning_halo from this source tree instead")
            t.add_argument("--tag", default=None)
    b = sub.add_parser("breakdown")
    b.add_argument("--label", required=True)
    b.add_argument("--ranks", type=int, default=2, help="the partition directory of the label into this many parts")
    b.add_argument("--part", type=int, default=0)
    b.add_argument("--hidden", type=int, default=64)
    b.add_argument("--partitioner", default="metis")
    b.add_argument("--epochs", type=int, default=1, help="training steps replayed (one per full-graph epoch)")
    rp = sub.add_parser("replay")
    rp.add_argument("--label", required=True)
    rp.add_argument("--ranks", nargs="+", type=int, default=[2, 4, 8])
    rp.add_argument("--hidden", type=int, default=64)
    rp.add_argument("--partitioners", nargs="+", default=["metis", "kaminpar"])
    rp.add_argument("--epochs", type=int, default=1, help="training steps replayed per rank")
    r = sub.add_parser("report")
    r.add_argument("--labels", nargs="*")
    r.add_argument("--page", default=None)
    r.add_argument("--img", default=str(ROOT / "docs" / "img" / "memory-per-rank.png"))
    one = sub.add_parser("_partition")
    one.add_argument("--graph", required=True)
    one.add_argument("--parts", type=int, required=True)
    one.add_argument("--out", required=True)
    one.add_argument("--result", required=True)
    one.add_argument("--structure", action="store_true")
    one.add_argument("--partitioner", default="metis")
    rk = sub.add_parser("_rank")
    rk.add_argument("--data", required=True)
    rk.add_argument("--result", required=True)
    rk.add_argument("--cache-dir", default=None)
    rk.add_argument("--epochs", type=int, default=1)
    rk.add_argument("--hidden", type=int, default=64)
    rk.add_argument("--halo-reduction", default=None)
    a = p.parse_args(argv)
    if a.cmd == "generate":
        print(json.dumps(generate(Path(a.out), a.nodes, a.degree, a.features, a.classes, a.blocks, a.p_in, a.noise, a.seed)))
    elif a.cmd == "partition":
        cmd_partition(a)
    elif a.cmd == "_partition":
        rec = partition_one(a.graph, a.parts, Path(a.out), a.structure, a.partitioner)
        Path(a.result).parent.mkdir(parents=True, exist_ok=True)
        Path(a.result).write_text(json.dumps(rec, indent=1))
    elif a.cmd == "train":
        cmd_train(a)
    elif a.cmd == "file":
        cmd_file(a)
    elif a.cmd == "_rank":
        rank_main(a)
    elif a.cmd == "replay":
        cmd_replay(a)
    elif a.cmd == "breakdown":
        rec = breakdown(str(parts_dir(a.label, a.ranks, a.partitioner)), a.part, a.hidden, a.epochs)
        target = RESULTS / a.label / f"breakdown-{a.partitioner}-{a.ranks}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps({"ranks": a.ranks, "part": a.part, "hidden": a.hidden, **rec}, indent=1))
        for st in rec["steps"]:
            print(f"{st['step']:45s} peak {st['peak_mb']:7.0f} MB  after {st['rss_mb']:7.0f} (anon {st['anon_mb']:.0f}, file {st['file_mb']:.0f})")
        print(f"bound {rec['bound'] / MB:.0f} MB: part pages {rec['part_pages'] / MB:.0f}, adjacency values "
              f"{rec['adjacency_bytes'] / MB:.0f}, halo block {rec['halo_bytes'] / MB:.0f}, saved activations "
              f"{rec['saved_bytes'] / MB:.0f}, model + grad + Adam {(rec['model_bytes'] * 2 + rec['optimizer_bytes']) / MB:.1f}")
    else:
        cmd_report(a)


if __name__ == "__main__":
    main()
