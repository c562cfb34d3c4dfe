"""The prepared check for a CUDA machine (issue 18): one command, a few minutes, one JSON file.

    tools/gpu_check.sh --tolokers DATASETS_ROOT --out DIR      # on a machine with one CUDA GPU
    tools/gpu_check.sh --dry-run --out DIR                     # anywhere: tiny sizes, on the CPU

Three sections, each written to ``DIR/gpu_check.json`` as soon as it ends (so a run cut short
still reports what it did), in this order:

1. **tests** -- the test subset that makes sense at world size 1 on CUDA, run by pytest with
   ``LIGHTNING_HALO_DEVICE=cuda``: the codec tests marked ``device`` (unbiasedness, byte
   exactness, device records against the CPU reference), single-process parity of the hooked
   layers through ``HaloQuantStrategy`` with ``accelerator="gpu", devices=1``, and exact resume
   at world size 1. Every test's outcome and duration are recorded.
2. **codec** -- encode + decode throughput of ``quantize(out=)`` / ``dequantize(out=)`` at
   1/2/4/8 bits, ``d`` = 64 and 256, 1M rows, against a device-to-device ``copy_`` of the same
   fp32 rows in the same run; ``torch.compile``'d (the default) and eager; the first call of
   each kernel (compilation included); and a check that every decoded value lies within one
   quantization step of its input.
3. **epoch** -- one epoch's compute (forward + backward, CUDA-synchronised) of every part of a
   2-part METIS partition of the generated graph (``benchmarks.graphs.sbm``, 1M nodes) and of
   Tolokers, for GCN and GraphSAGE at hidden 256, through the public API (``HaloDataModule``,
   ``HaloQuantStrategy``, ``lightning_halo.models`` with their default aggregation path). A part
   is trained as a one-process graph made of its inner nodes, its halo and the inner nodes'
   in-edges: the tensors a rank's layers see, without the exchange (there is one GPU).

Without CUDA the run is a dry run (tiny sizes, the CUDA-only parts skipped, each skip recorded
with its reason), which CI runs to keep this script working. ``--simulate FILE`` prints the
simulated GPU-cluster epoch per bit width from a check's JSON and the testbed's measured cells
(``benchmarks/results/<graph>/2n-100mbit``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "lightning-halo/gpu-check/1"

#: The world-size-1 tests of the strategy (the codec's device tests are selected by marker);
#: tests/test_gpu_check.py checks that every id still names a test.
STRATEGY_TESTS = [
    "tests/strategy/test_parity.py::test_parity_with_single_process_pyg[1-metis-cover]",
    "tests/strategy/test_parity.py::test_parity_with_sparse_adjacency[1]",
    "tests/callbacks/test_resume.py::test_resume_is_bitwise_exact[gcn]",
    "tests/callbacks/test_resume.py::test_resume_is_bitwise_exact[gcn-adaptive-bits]",
]
#: Every supported layer on the GPU, one rank (tests/support/threaded.py: threaded ranks cannot exchange
#: in a CUDA backward, which autograd runs on one thread per device), both aggregation paths.
LAYER_TESTS = ["tests/layers/test_parity.py::test_every_supported_layer_matches_the_whole_graph"]

SIZES = {
    # name: (codec rows, codec widths, sbm nodes, epochs per cell, timed repeats)
    "cuda": dict(rows=1_000_000, widths=(64, 256), sbm_nodes=1_000_000, epochs=6, repeats=10),
    "dry-run": dict(rows=4096, widths=(64, 256), sbm_nodes=3000, epochs=3, repeats=3),
}
CODEC_BITS = (1, 2, 4, 8)
MODELS = ("gcn", "sage")
HIDDEN = 256


class Report:
    """The JSON being built; written after every section."""

    def __init__(self, path: Path, mode: str, budget_s: float, argv: list[str]) -> None:
        self.path = path
        self.t0 = time.monotonic()
        self.budget_s = budget_s
        self.data: dict[str, Any] = {
            "schema": SCHEMA,
            "mode": mode,
            "argv": argv,
            "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "budget_s": budget_s,
            "machine": machine_info(),
            "sections": {},
            "skipped": [],
        }

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def skip(self, what: str, why: str) -> None:
        print(f"[gpu-check] SKIPPED {what}: {why}", flush=True)
        self.data["skipped"].append({"what": what, "why": why})

    def write(self) -> None:
        self.data["wall_s"] = round(time.monotonic() - self.t0, 3)
        self.data["finished_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


def _version(name: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001 - not installed
        return None


def machine_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "packages": {n: _version(n) for n in ("lightning", "torch_geometric", "torchmetrics", "numba", "pymetis", "triton")},
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_GiB=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}",
                    multiprocessors=p.multi_processor_count)  # fmt: skip
        smi = shutil.which("nvidia-smi")
        if smi:
            q = subprocess.run([smi, "--query-gpu=driver_version,clocks.sm,clocks.mem", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)  # fmt: skip
            info["nvidia_smi"] = q.stdout.strip()
    try:
        info["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                            timeout=10).stdout.strip() or None  # fmt: skip
    except OSError:
        info["git_commit"] = None
    return info


# --------------------------------------------------------------------------- 1. tests


def junit_cases(xml_path: Path) -> list[dict[str, Any]]:
    """Every test case of a pytest ``--junitxml`` file: id, outcome, duration, message."""
    cases = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (el.get("message") or "") + ("\n" + el.text if el.text and tag != "skipped" else "")
                break
        cases.append({"id": f"{module}.py::{case.get('name')}", "outcome": outcome,
                      "duration_s": round(float(case.get("time") or 0.0), 3), "message": message[-3000:]})  # fmt: skip
    return cases


def run_pytest(name: str, args: list[str], device: str, timeout: float, workdir: Path) -> dict[str, Any]:
    xml = workdir / f"junit-{name}.xml"
    # no:benchmark: pytest-benchmark (in the GPU image) warns once per xdist worker, burying the output's tail
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark", f"--junitxml={xml}", *args]
    env = {**os.environ, "LIGHTNING_HALO_DEVICE": device, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    print(f"[gpu-check] tests/{name}: {' '.join(argv[2:])} (LIGHTNING_HALO_DEVICE={device}, timeout {timeout:.0f} s)", flush=True)
    t0 = time.monotonic()
    try:
        res = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out = res.returncode, res.stdout + res.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = "timeout", f"{exc.stdout or ''}{exc.stderr or ''}"
        out = out if isinstance(out, str) else out.decode(errors="replace")
    cases = junit_cases(xml) if xml.is_file() else []
    count = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "error", "skipped")}
    print(f"[gpu-check] tests/{name}: rc={rc} {count} in {time.monotonic() - t0:.1f} s", flush=True)
    return {"name": name, "argv": argv[1:], "device": device, "returncode": rc, "wall_s": round(time.monotonic() - t0, 2),
            **count, "tests": cases, "output_tail": out[-4000:]}  # fmt: skip


def section_tests(rep: Report, cuda: bool, workdir: Path) -> dict[str, Any]:
    device = "cuda" if cuda else "cpu"
    # The codec tests compile every kernel (80 s on an H200 with torch 2.11); the strategy's ranks are
    # fresh interpreters on CUDA (about 30 s a test); the sections after the tests need about 60 s.
    runs = [run_pytest("codec", ["tests/quant", "-m", "device"], device, min(150.0, max(30.0, rep.left() - 300)), workdir)]
    if cuda:
        runs.append(run_pytest("strategy", STRATEGY_TESTS, device, min(200.0, max(60.0, rep.left() - 160)), workdir))
        # spread over workers (the suite's loadscope would put one module on one), each test bounded
        layers = [*LAYER_TESTS, "-n", "8", "--dist", "load", "--timeout", "60"]
        runs.append(run_pytest("layers", layers, device, min(100.0, max(45.0, rep.left() - 70)), workdir))
    else:
        rep.skip("tests/layers and tests/strategy (layers as threaded ranks; parity and resume at world size 1 on CUDA)",
                 "needs CUDA; on CPU the suite runs these tests at world sizes 1-4")  # fmt: skip
    ok = all(r["returncode"] == 0 and r["passed"] > 0 for r in runs)
    return {"status": "ok" if ok else "failed", "runs": runs}


# --------------------------------------------------------------------------- 2. codec


def _sync_for(device: Any) -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def _timed_once(fn: Callable[[], Any], sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def section_codec(rep: Report, cuda: bool, sizes: dict[str, Any]) -> dict[str, Any]:
    import torch

    from benchmarks.quant_bench import time_median
    from lightning_halo.quant import dequantize, quantize, row_nbytes

    device = torch.device("cuda" if cuda else "cpu")
    sync = _sync_for(device)
    n, repeats = sizes["rows"], sizes["repeats"]
    impls = ["compiled", "eager"] if cuda else ["cpu-default"]
    if not cuda:
        rep.skip("codec on the GPU and torch.compile's first-call time", "needs CUDA; the dry run times the CPU backend")
    results, gen = [], torch.Generator().manual_seed(0)
    for d in sizes["widths"]:
        if rep.left() < 60:
            rep.skip(f"codec d={d}", f"time budget ({rep.left():.0f} s left)")
            continue
        g = torch.Generator(device=device).manual_seed(d)
        x = torch.randn(n, d, device=device, generator=g)
        x.mul_(torch.rand(n, 1, device=device, generator=g) * 4).add_(torch.randn(n, 1, device=device, generator=g))
        y = torch.empty_like(x)
        y.copy_(x)
        copy_s = time_median(lambda: y.copy_(x), repeats, sync)
        for impl in impls:
            os.environ["LIGHTNING_HALO_COMPILE"] = "0" if impl == "eager" else "1"
            for bits in CODEC_BITS:
                buf = torch.empty(n * row_nbytes(d, bits), dtype=torch.uint8, device=device)
                holder: dict[str, Any] = {}
                first_q = _timed_once(lambda: holder.update(q=quantize(x, bits, gen, out=buf)), sync)
                first_dq = _timed_once(lambda: dequantize(holder["q"], out=y), sync)
                q = holder["q"]
                # every decoded value within one step of its input (|x_hat - x| < s, plus the
                # float32 rounding of z + c * s), over all rows
                dev, s_ = (y - x).abs(), q.scale[:, None]
                err = (dev / s_.clamp(min=1e-30)).max().item()
                within = bool((dev <= s_ + 1e-6 * x.abs() + 1e-45).all())
                del dev, s_
                enc = time_median(lambda: quantize(x, bits, gen, out=buf), repeats, sync)
                dec = time_median(lambda: dequantize(q, out=y), repeats, sync)
                gb = n * d * 4 / 1e9
                row = {
                    "device": str(device), "impl": impl, "n": n, "d": d, "bits": bits,
                    "wire_bytes": q.nbytes, "fp32_bytes": n * d * 4,
                    "copy_s": copy_s, "encode_s": enc, "decode_s": dec, "encode_decode_s": enc + dec,
                    "copy_over_encode_decode": copy_s / (enc + dec),
                    "copy_GBps": gb / copy_s, "encode_GBps": gb / enc, "decode_GBps": gb / dec,
                    "first_encode_s": first_q, "first_decode_s": first_dq,
                    "max_error_in_steps": err, "within_one_step": within,
                }  # fmt: skip
                results.append(row)
                print(f"[gpu-check] codec {impl:>11} d={d:3d} bits={bits}: copy_ {copy_s * 1e3:8.3f} ms, "
                      f"encode {enc * 1e3:8.3f} ms, decode {dec * 1e3:8.3f} ms ({row['copy_over_encode_decode']:.2f}x of "
                      f"copy_), first call {first_q:.2f} s + {first_dq:.2f} s, max error {err:.3f} steps", flush=True)  # fmt: skip
        os.environ.pop("LIGHTNING_HALO_COMPILE", None)
    ok = bool(results) and all(r["within_one_step"] for r in results)
    return {"status": "ok" if ok else "failed", "repeats": repeats,
            "notes": "median of repeats after a first call; times CUDA-synchronised; GB/s of fp32 input bytes; "
                     "first_* include torch.compile (the first d compiles each kernel once; sizes are dynamic, "
                     "so other widths reuse it); eager = LIGHTNING_HALO_COMPILE=0",
            "results": results}  # fmt: skip


# --------------------------------------------------------------------------- 3. epoch


def local_graph(part: Any) -> Any:
    """A part as a one-process graph: inner nodes, then halo nodes; the inner nodes' in-edges."""
    import torch
    from torch_geometric.data import Data

    n_halo = int(part.n_halo)

    def pad(t: Any) -> Any:
        return torch.cat([t, t.new_zeros((n_halo, *t.shape[1:]))])

    masks = {k: pad(part[k]) for k in ("train_mask", "val_mask", "test_mask") if k in part}
    return Data(x=torch.cat([part.x, part.halo_x]), edge_index=part.edge_index, y=pad(part.y), **masks)


def _graph(name: str, sizes: dict[str, Any], tolokers: Optional[Path]) -> Any:
    from benchmarks.graphs import sbm
    from lightning_halo import load_graph

    if name == "sbm":
        return sbm(num_nodes=sizes["sbm_nodes"])
    assert tolokers is not None
    return load_graph(f"pyg:HeterophilousGraphDataset:{tolokers}:Tolokers")


def _epoch_cell(dm: Any, num_classes: int, model_name: str, cuda: bool, epochs: int) -> dict[str, Any]:
    import lightning as L
    import torch

    from lightning_halo import HaloQuantStrategy
    from lightning_halo.models import GCN, GraphSAGE

    sync = torch.cuda.synchronize if cuda else (lambda: None)

    class Timer(L.Callback):
        def __init__(self) -> None:
            self.rows: list[dict[str, float]] = []
            self.path = "unknown"

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # type: ignore[no-untyped-def]
            sync()
            self.t0 = time.perf_counter()

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):  # type: ignore[no-untyped-def]
            sync()
            self.t1 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
            sync()
            t2 = time.perf_counter()
            self.rows.append({"fwd_bwd_s": self.t1 - self.t0, "step_s": t2 - self.t0})
            try:  # what the layers were given: the library's default aggregation input
                adj = pl_module.adjacency(batch)
                self.path = "edge_index" if adj.layout == torch.strided else str(adj.layout)
            except Exception:  # noqa: BLE001 - a model without adjacency()
                pass

    torch.manual_seed(0)
    cls = {"gcn": GCN, "sage": GraphSAGE}[model_name]
    model = cls(in_channels=dm.num_features, out_channels=num_classes, hidden_channels=HIDDEN)
    timer = Timer()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = L.Trainer(
        accelerator="gpu" if cuda else "cpu", devices=1, strategy=HaloQuantStrategy(bits=32), max_epochs=epochs,
        limit_val_batches=0, num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, logger=False, callbacks=[timer],
    )  # fmt: skip
    trainer.fit(model, datamodule=dm)
    later = timer.rows[1:] or timer.rows
    return {
        "model": model_name, "hidden": HIDDEN, "layers": int(model.hparams.num_layers), "epochs": len(timer.rows),
        "aggregation_input": timer.path,
        "compute_s": statistics.median(r["fwd_bwd_s"] for r in later),
        "step_s": statistics.median(r["step_s"] for r in later),
        "first_epoch_s": timer.rows[0]["step_s"] if timer.rows else None,
        "per_epoch": timer.rows,
        "peak_gpu_memory_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
    }  # fmt: skip


def section_epoch(rep: Report, cuda: bool, sizes: dict[str, Any], tolokers: Optional[Path], parts: int,
                  workdir: Path) -> dict[str, Any]:  # fmt: skip
    import warnings

    from lightning_halo import HaloDataModule

    warnings.filterwarnings("ignore", module="lightning")
    if not cuda:
        rep.skip("epoch compute on the GPU", "needs CUDA; the dry run times a tiny generated graph on the CPU")
    graphs = ["sbm"]
    if tolokers is None:
        rep.skip("tolokers epoch", "no --tolokers DATASETS_ROOT given")
    else:
        graphs.append("tolokers")
    results = []
    for name in graphs:
        if rep.left() < 45:
            rep.skip(f"epoch {name}", f"time budget ({rep.left():.0f} s left)")
            continue
        try:
            t0 = time.monotonic()
            data = _graph(name, sizes, tolokers)
            full = HaloDataModule(data, num_parts=parts, cache_dir=str(workdir / "partitions"))
            num_classes = full.num_classes
            split = full.partitions()
            prep_s = time.monotonic() - t0
            print(f"[gpu-check] epoch {name}: {data.num_nodes} nodes, {data.edge_index.size(1)} edges, "
                  f"{parts} parts in {prep_s:.1f} s", flush=True)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - recorded, the other graphs still run
            results.append({"graph": name, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]})
            continue
        for part in split:
            dm = HaloDataModule(local_graph(part), cache_dir=str(workdir / "local"))
            for model_name in MODELS:
                if rep.left() < 30:
                    rep.skip(f"epoch {name} part {int(part.part_id)} {model_name}", f"time budget ({rep.left():.0f} s left)")
                    continue
                cell = {"graph": name, "graph_nodes": int(data.num_nodes), "graph_edges": int(data.edge_index.size(1)),
                        "parts": parts, "part": int(part.part_id), "n_inner": int(part.n_inner),
                        "n_halo": int(part.n_halo), "edges": int(part.edge_index.size(1)), "partition_s": prep_s}  # fmt: skip
                try:
                    cell.update(_epoch_cell(dm, num_classes, model_name, cuda, sizes["epochs"]))
                    print(f"[gpu-check] epoch {name} part {cell['part']} {model_name}: compute {cell['compute_s'] * 1e3:.1f} ms "
                          f"(fwd+bwd, median of {cell['epochs'] - 1}), first epoch {cell['first_epoch_s']:.2f} s, "
                          f"input {cell['aggregation_input']}", flush=True)  # fmt: skip
                except Exception as exc:  # noqa: BLE001
                    cell.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
                    print(f"[gpu-check] epoch {name} part {cell['part']} {model_name}: FAILED {cell['error']}", flush=True)
                results.append(cell)
            del dm
            shutil.rmtree(workdir / "local", ignore_errors=True)
    ok = bool(results) and all("error" not in r for r in results)
    return {"status": "ok" if ok else "failed", "results": results,
            "notes": "compute_s: forward + backward of one epoch (one full-graph step), CUDA-synchronised, median of "
                     "the epochs after the first; step_s adds the optimizer step; each part trained at bits=32 as a "
                     "one-process graph of its inner nodes + halo (no exchange)"}  # fmt: skip


# --------------------------------------------------------------------------- simulation


def simulate(check: dict[str, Any], results_dir: Path, rate: str = "2n-100mbit") -> list[dict[str, Any]]:
    """Simulated 2-GPU epoch per bit width: the slowest part's GPU compute + the testbed's halo wait.

    For every (graph, model) of the check's epoch section with sync cells of the CPU testbed
    (``results_dir/<graph dir>/<rate>/<model>-b<bits>-sync.json``): the testbed's measured halo
    wait and bytes per epoch, and ``gpu_compute_s + wait_s`` as the sync epoch of the same
    partition on GPUs over the same link (the wait on the testbed also holds any compute skew
    between its CPU ranks, so this over-states the wait a little).
    """
    dirs = {"sbm": "sbm-h256", "tolokers": "tolokers"}
    cells: dict[tuple[str, str], list[float]] = {}
    for r in check.get("sections", {}).get("epoch", {}).get("results", []):
        if "compute_s" in r:
            cells.setdefault((r["graph"], r["model"]), []).append(r["compute_s"])
    rows = []
    for (graph, model), computes in sorted(cells.items()):
        gpu = max(computes)
        for f in sorted((results_dir / dirs.get(graph, graph) / rate).glob(f"{model}-b*-sync.json")):
            cell = json.loads(f.read_text())
            s = cell["summary"]
            wait = s["breakdown"]["wait_s"]
            rows.append({"graph": graph, "model": model, "bits": int(cell["bits"]), "gpu_compute_s": gpu,
                         "testbed_wait_s": wait, "testbed_codec_s": s["breakdown"]["codec_s"],
                         "testbed_epoch_s": s["epoch_s"], "bytes_per_epoch": s["bytes_per_epoch"],
                         "simulated_epoch_s": gpu + wait, "compute_share": gpu / (gpu + wait), "source": str(f)})  # fmt: skip
    rows.sort(key=lambda r: (r["graph"], r["model"], -r["bits"]))
    return rows


# --------------------------------------------------------------------------- main


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu"), help="directory for the JSON")
    p.add_argument("--tolokers", default=None, help="datasets root holding tolokers/raw/tolokers.npz")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes (the default without CUDA)")
    p.add_argument("--budget", type=float, default=450.0, help="seconds for the whole check (sections skip when short)")
    p.add_argument("--parts", type=int, default=2, help="parts of each graph's partition")
    p.add_argument("--sections", nargs="+", default=["tests", "codec", "epoch"], choices=["tests", "codec", "epoch"])
    p.add_argument("--simulate", metavar="CHECK_JSON", default=None, help="print the simulated epoch table and exit")
    a = p.parse_args(argv)
    if a.simulate:
        rows = simulate(json.loads(Path(a.simulate).read_text()), ROOT / "benchmarks" / "results")
        print(json.dumps(rows, indent=1))
        return 0

    import torch

    cuda = torch.cuda.is_available() and not a.dry_run
    mode = "cuda" if cuda else "dry-run"
    if not cuda and not a.dry_run:
        print("[gpu-check] no CUDA device: running the dry run (tiny sizes, CUDA-only parts skipped)", flush=True)
    tolokers = None
    if a.tolokers:
        root = Path(a.tolokers)
        tolokers = root.parent if root.name.lower() == "tolokers" else root
        if not (tolokers / "tolokers" / "raw").is_dir():
            print(f"[gpu-check] --tolokers {a.tolokers}: no tolokers/raw/ under it", file=sys.stderr)
            return 2
    out = Path(a.out)
    rep = Report(out / ("gpu_check.json" if cuda else "gpu_check_dry_run.json"), mode, a.budget, sys.argv[1:] if argv is None else argv)
    sizes = SIZES[mode]
    rep.data["sizes"] = sizes
    print(f"[gpu-check] mode {mode}, budget {a.budget:.0f} s, writing {rep.path}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="halo-gpu-check-"))
    steps: dict[str, Callable[[], dict[str, Any]]] = {
        "tests": lambda: section_tests(rep, cuda, workdir),
        "codec": lambda: section_codec(rep, cuda, sizes),
        "epoch": lambda: section_epoch(rep, cuda, sizes, tolokers, a.parts, workdir),
    }
    try:
        for name in a.sections:
            t0 = time.monotonic()
            try:
                result = steps[name]()
            except Exception as exc:  # noqa: BLE001 - recorded; the next section still runs
                result = {"status": "error", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
                print(f"[gpu-check] section {name} FAILED: {result['error']}", flush=True)
            result["wall_s"] = round(time.monotonic() - t0, 2)
            rep.data["sections"][name] = result
            rep.write()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()  # the Trainers' group; gloo aborts at exit otherwise
    status = {k: v["status"] for k, v in rep.data["sections"].items()}
    rep.data["status"] = "ok" if all(s == "ok" for s in status.values()) else "failed"
    rep.write()
    print(f"[gpu-check] {rep.data['status']}: {status}; {rep.data['wall_s']:.0f} s; {len(rep.data['skipped'])} skipped; "
          f"wrote {rep.path}", flush=True)  # fmt: skip
    return 0 if rep.data["status"] == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
