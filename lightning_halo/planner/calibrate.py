r"""Kernel rates and step overheads of this machine, measured once by a short calibration, stored and reused.

:func:`calibrate` times, with the thread count the ranks will use (default one, as
``OMP_NUM_THREADS=1`` ranks run): the fused aggregation's sparse-dense product
(``spmm``: edge·features per second, on a matrix with a partitioned graph's locality), a dense matmul (``dense``: flop/s), the per-value cost of
the elementwise work around a layer (activation, dropout, bias and their backward:
``elementwise_s``), the quantizer (``codec``: bytes of float32 rows encoded and decoded per
second), what a training step costs beyond its kernels (:mod:`lightning_halo.planner.step`):
per step and per layer on one rank (``step_s``, ``layer_s``) and on two ranks of this host
exchanging halos over gloo (``dist_step_s``, ``dist_layer_s``), the slowdown of the kernels
while two ranks run them at once on this host's ``cores`` (``share``), the resident memory of
an idle process with torch, Lightning and PyG imported (``idle_bytes``) and what the
quantizer's compiled kernels add to it (``codec_bytes``). :func:`load_rates` returns the stored
figures and measures only when none match this host, torch version, thread count and
:data:`CALIBRATION_VERSION`. Every figure is the best of a few repetitions: on a shared host,
other work only ever adds time. The store is one JSON file:
``$LIGHTNING_HALO_CALIBRATION``, else ``$XDG_CACHE_HOME/lightning-halo/calibration.json``
(``~/.cache/...``).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

#: Bumped when what is measured changes, so that older stored figures are measured again (4: the step
#: overhead per step and per layer, at one and two ranks, and the slowdown of ranks sharing cores).
CALIBRATION_VERSION = 4
#: The command that measures this machine again and stores it (``--out FILE``: writes a file for
#: ``plan --calibration FILE`` instead); ``lightning-halo plan ... --recalibrate`` does the same before planning.
RECALIBRATE = "python -m lightning_halo.planner.calibrate"
log = logging.getLogger("lightning_halo.planner")
_IDLE = (
    "import torch, lightning, torch_geometric, lightning_halo.strategy, lightning_halo.models\n"
    "rss = lambda: [int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmRSS:')][0]\n"
    "idle = rss()\n"
    "from lightning_halo.quant import dequantize, quantize\n"
    "dequantize(quantize(torch.randn(64, 256), 1))\n"
    "print(idle, rss() - idle)"
)


def calibration_path() -> Path:
    """Where the measured rates are stored (see the module docstring)."""
    env = os.environ.get("LIGHTNING_HALO_CALIBRATION")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lightning-halo" / "calibration.json"


def machine_key(threads: int) -> str:
    """What the figures are valid for: host, CPU architecture, torch version, threads."""
    import torch

    return f"{platform.node()}|{platform.machine()}|torch {torch.__version__}|threads {threads}"


def _best_time(fn: Callable[[], Any], repeats: int) -> float:
    """The shortest of ``repeats`` timed calls after a warm-up: other work on the host only adds time."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def local_csr(rows: int, degree: int, window: int, generator: Any) -> Any:
    """A ``[rows, 2 rows]`` CSR whose columns lie within ``window`` of the row: the locality a partitioned graph has.

    METIS and KaMinPar number a part's nodes so that neighbours are mostly near each other; a
    matrix with uniformly random columns would time cache misses the real products do not have.
    """
    import torch

    nnz = rows * degree
    base = (torch.arange(rows) * 2).repeat_interleave(degree)
    cols = (base + torch.randint(-window, window, (nnz,), generator=generator)).clamp_(0, 2 * rows - 1)
    cols = cols.view(rows, degree).sort(1).values.flatten()
    return torch.sparse_csr_tensor(
        torch.arange(0, nnz + 1, degree), cols, torch.rand(nnz, generator=generator), (rows, 2 * rows)
    )


def measure_kernels(rows: int = 20000, width: int = 256, degree: int = 32, repeats: int = 7) -> dict[str, float]:
    """``spmm`` (edge·features/s), ``dense`` (flop/s), ``elementwise_s`` (s per value), ``codec`` (bytes/s).

    Args:
        rows (int, optional): rows of the timed tensors. (default: ``20000``)
        width (int, optional): their columns (a typical hidden width). (default: ``256``)
        degree (int, optional): nonzeros per row of the sparse matrix (:func:`local_csr`). (default: ``32``)
        repeats (int, optional): timed repetitions (the shortest counts). (default: ``7``)
    """
    import torch

    from lightning_halo.quant import dequantize, quantize

    g = torch.Generator().manual_seed(0)
    a = local_csr(rows, degree, 2048, g)
    h = torch.randn(2 * rows, width, generator=g)
    x, w = torch.randn(rows, width, generator=g), torch.randn(width, width, generator=g)
    spmm = rows * degree * width / _best_time(lambda: torch.sparse.mm(a, h), repeats)
    dense = 2 * rows * width * width / _best_time(lambda: x @ w, repeats)
    leaf = torch.randn(rows, width, generator=g, requires_grad=True)
    bias = torch.zeros(width, requires_grad=True)

    def around_layer() -> None:
        out = torch.nn.functional.dropout(torch.relu(leaf + bias), 0.5, training=True)
        out.sum().backward()

    elementwise = _best_time(around_layer, repeats) / (rows * width)
    codec = rows * width * 4 / _best_time(lambda: dequantize(quantize(x, 1, generator=g)), repeats)
    return {"spmm": spmm, "dense": dense, "elementwise_s": elementwise, "codec": codec}


def measure_idle_bytes(timeout: float = 120.0) -> tuple[int, int]:
    """Resident bytes of a fresh interpreter after importing torch, Lightning, PyG and the strategy, and what
    the quantizer's kernels (numba, compiled on first use) add to it once a quantized run starts."""
    run = subprocess.run([sys.executable, "-c", _IDLE], capture_output=True, text=True, timeout=timeout,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))  # fmt: skip
    if run.returncode != 0:
        raise RuntimeError(f"measuring the idle process failed: {run.stderr[-2000:]}")
    idle, codec = run.stdout.strip().splitlines()[-1].split()
    return int(idle), max(int(codec), 0)


def host_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def best_of(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's best over ``runs``: the shortest time (``*_s``), the highest rate (the rest).

    Example:
        >>> best_of([{"spmm": 2.0, "elementwise_s": 3.0}, {"spmm": 3.0, "elementwise_s": 4.0}])
        {'spmm': 3.0, 'elementwise_s': 3.0}
    """
    return {k: (min if k.endswith("_s") else max)(r[k] for r in runs) for k in runs[0]}


def sharing_slowdown(alone: dict[str, float], together: list[dict[str, float]]) -> float:
    """How much slower the kernels ran on ranks sharing the host than alone: the median over ``spmm``,
    ``dense`` and ``elementwise_s`` of the slowest rank's time over the time alone (at least 1).

    Example:
        >>> alone = {"spmm": 4e9, "dense": 8e10, "elementwise_s": 1e-8}
        >>> sharing_slowdown(alone, [{"spmm": 2e9, "dense": 8e10, "elementwise_s": 1.25e-8}, alone])  # 2x, 1x, 1.25x
        1.25
    """
    ratios = sorted([alone["spmm"] / min(t["spmm"] for t in together), alone["dense"] / min(t["dense"] for t in together),
                     max(t["elementwise_s"] for t in together) / alone["elementwise_s"]])  # fmt: skip
    return max(ratios[1], 1.0)


def calibrate(threads: int = 1, step: bool = True, rounds: int = 3, ranks: int = 2) -> dict[str, Any]:
    """Measure every figure (about a minute) with ``threads`` threads per rank; see the module docstring.

    Args:
        threads (int, optional): torch threads, as each rank will run. (default: ``1``)
        step (bool, optional): also time the step overhead and the sharing of cores through real
            Lightning runs (:mod:`~lightning_halo.planner.step`; else those figures are 0 and
            ``share`` 1). (default: ``True``)
        rounds (int, optional): rounds of measurement in this process; each figure is the best of
            them (a busy host slows some rounds down, never speeds one up). (default: ``3``)
        ranks (int, optional): processes of the multi-rank measurement. (default: ``2``)

    Raises:
        RuntimeError: the multi-rank measurement failed (its ranks' output is in the message).
    """
    import torch

    from lightning_halo.planner.step import EPOCHS, LAYERS, fit_epochs, measure_ranks, overhead_fit

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    kernels, epochs = [], {layers: [] for layers in LAYERS}
    try:
        for _ in range(max(rounds, 1)):
            kernels.append(measure_kernels())
            for layers in LAYERS if step else ():
                epochs[layers] += fit_epochs(layers, EPOCHS)[2:]  # the first two warm up
    finally:
        torch.set_num_threads(before)
    rates: dict[str, Any] = best_of(kernels)
    rates["step_s"], rates["layer_s"] = overhead_fit({k: min(v) for k, v in epochs.items()}, 1, rates) if step else (0.0, 0.0)
    if step:
        per_rank = measure_ranks(ranks, threads, EPOCHS, rounds=len(kernels))
        slowest = {layers: max(min(r["epochs"][str(layers)][2:]) for r in per_rank) for layers in LAYERS}
        rates["dist_step_s"], rates["dist_layer_s"] = overhead_fit(slowest, ranks, rates)
        rates["share"] = sharing_slowdown(rates, [r["kernels"] for r in per_rank])
    else:
        rates.update(dist_step_s=0.0, dist_layer_s=0.0, share=1.0)
    rates["idle_bytes"], rates["codec_bytes"] = measure_idle_bytes()
    rates.update(cores=host_cores(), share_ranks=ranks if step else 1, version=CALIBRATION_VERSION,
                 key=machine_key(threads), threads=threads, rounds=len(kernels),
                 measured=time.strftime("%Y-%m-%d %H:%M:%S"))  # fmt: skip
    return rates


def load_rates(threads: int = 1, path: Optional[Path] = None, recalibrate: bool = False) -> dict[str, Any]:
    """The stored rates for this machine and ``threads``; measured (and stored) when missing or stale.

    A stored calibration of an older :data:`CALIBRATION_VERSION` is measured again, with a
    warning that says why (it lacks figures the planner now reads).

    Args:
        threads (int, optional): as for :func:`calibrate`. (default: ``1``)
        path (Path, optional): the store. (default: ``None``: ``calibration_path()``)
        recalibrate (bool, optional): measure again even if stored. (default: ``False``)
    """
    path = Path(path) if path is not None else calibration_path()
    key = machine_key(threads)
    stored = read_store(path)
    entry = stored.get(key)
    stale = bool(entry) and entry.get("version") != CALIBRATION_VERSION
    if stale:
        log.warning("lightning-halo: the calibration stored in %s for this machine is version %s, this planner reads "
                    "version %d (it adds the step overhead per layer and of ranks sharing cores): measuring this "
                    "machine again (about a minute)", path, entry.get("version"), CALIBRATION_VERSION)  # fmt: skip
    if recalibrate or not entry or stale:
        entry = calibrate(threads)
        stored[key] = entry
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(stored, indent=1, sort_keys=True))
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old or the new store
    return entry


def read_store(path: Path) -> dict[str, Any]:
    """The stored calibrations by :func:`machine_key` (empty if none or unreadable)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


#: What :func:`~lightning_halo.planner.plan.plan` reads from a calibration.
RATE_KEYS = ("spmm", "dense", "elementwise_s", "codec", "step_s", "layer_s", "dist_step_s", "dist_layer_s", "share",
             "cores", "threads", "share_ranks", "idle_bytes", "codec_bytes")  # fmt: skip


def check_rates(rates: Any, source: str) -> dict[str, Any]:
    """``rates`` if it is a calibration this planner reads, else the ``ValueError`` naming what is wrong and the fix.

    Refused: a calibration of another :data:`CALIBRATION_VERSION` (older ones lack figures or
    measured them differently), one without every one of :data:`RATE_KEYS` (a missing figure is
    never taken as 0: a calibration without ``codec_bytes`` would plan every quantized run
    without the quantizer's compiled kernels, tens of MB a rank), or one whose figures are not
    non-negative numbers (``share``, ``cores``, ``threads``, ``share_ranks``: at least 1).

    Args:
        rates: the calibration. source (str): where it came from (a file's path), for the message.

    Raises:
        ValueError: as above; the message names ``source``, what is wrong and :data:`RECALIBRATE`.
    """
    fix = (f"measure this machine again with `{RECALIBRATE}` (`--out FILE` writes a file for --calibration), or "
           "leave out the calibration and let the planner measure this machine")  # fmt: skip
    if not isinstance(rates, dict):
        raise ValueError(f"{source} is not a calibration (a JSON object of figures): {fix}")
    version = rates.get("version", CALIBRATION_VERSION)  # a hand-written set of figures need not carry one
    if version != CALIBRATION_VERSION:
        raise ValueError(f"{source} is a calibration of version {version!r}; this planner reads version "
                         f"{CALIBRATION_VERSION} (it adds the step overhead per layer and of ranks sharing cores): {fix}")  # fmt: skip
    missing = [k for k in RATE_KEYS if k not in rates]
    if missing:
        raise ValueError(f"{source} is not a complete calibration: it lacks {', '.join(missing)}; {fix}")
    bad = [k for k in RATE_KEYS if isinstance(rates[k], bool) or not isinstance(rates[k], (int, float)) or rates[k] < 0
           or (k in ("share", "cores", "threads", "share_ranks") and rates[k] < 1)]  # fmt: skip
    if bad:
        raise ValueError(f"{source}: {', '.join(f'{k}={rates[k]!r}' for k in bad)} must be non-negative numbers "
                         f"(share, cores, threads and share_ranks at least 1); {fix}")  # fmt: skip
    return rates


def read_rates(path: str | os.PathLike) -> dict[str, Any]:
    """Rates stored in a file of their own (``plan(rates=...)``, ``lightning-halo plan --calibration FILE``).

    The file holds one calibration as :func:`calibrate` returns it (``python -m
    lightning_halo.planner.calibrate --out FILE`` writes one; ``plan --json`` prints it under
    ``assumptions.calibration``): another machine's figures, or fixed ones for a reproducible plan.

    Raises:
        ValueError: the file cannot be read, or :func:`check_rates` refuses it (naming the file).
    """
    try:
        rates = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read the calibration {path}: {err}") from err
    return check_rates(rates, f"the calibration file {path}")


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m lightning_halo.planner.calibrate [--threads N] [--out FILE]``: measure this machine again."""
    import argparse

    p = argparse.ArgumentParser(description="Measure this machine's kernel rates and step overheads for the planner.")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default: 1)")
    p.add_argument("--out", default=None, help="write the calibration to this file instead of the machine's store")
    a = p.parse_args(argv)
    if a.out:
        Path(a.out).write_text(json.dumps(calibrate(a.threads), indent=1, sort_keys=True))
        print(f"wrote {a.out}")
    else:
        load_rates(a.threads, recalibrate=True)
        print(f"stored in {calibration_path()}")


if __name__ == "__main__":
    main()
