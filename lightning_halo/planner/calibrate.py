r"""Kernel rates of this machine, measured once by a short calibration, stored and reused.

:func:`calibrate` times, with the thread count the ranks will use (default one, as
``OMP_NUM_THREADS=1`` ranks run): the fused aggregation's sparse-dense product
(``spmm``: edge·features per second, on a matrix with a partitioned graph's locality), a dense matmul (``dense``: flop/s), the per-value cost of
the elementwise work around a layer (activation, dropout, bias and their backward:
``elementwise_s``), the quantizer (``codec``: bytes of float32 rows encoded and decoded per
second), the fixed cost of one training step through Lightning and the strategy on a tiny graph
(``step_s``), the resident memory of an idle process with torch, Lightning and PyG imported
(``idle_bytes``) and what the quantizer's compiled kernels add to it (``codec_bytes``). :func:`load_rates` returns the stored figures and measures only when none
match this host, torch version and thread count. Every figure is the shortest of a few
repetitions: on a shared host, other work only ever adds time. The store is one JSON file:
``$LIGHTNING_HALO_CALIBRATION``, else ``$XDG_CACHE_HOME/lightning-halo/calibration.json``
(``~/.cache/...``).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

#: Bumped when what is measured changes, so that older stored figures are measured again.
CALIBRATION_VERSION = 3
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


def calibrate(threads: int = 1, step: bool = True, rounds: int = 3) -> dict[str, Any]:
    """Measure every rate (about 10-20 s a round) with ``threads`` threads; see the module docstring.

    Args:
        threads (int, optional): torch threads, as each rank will run. (default: ``1``)
        step (bool, optional): also time a tiny Lightning training step (``step_s``; else 0). (default: ``True``)
        rounds (int, optional): rounds of measurement; each figure is the best of them (a busy host
            slows some rounds down, never speeds one up). (default: ``3``)
    """
    import torch

    from lightning_halo.planner.step import measure_step_seconds

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        runs = [{**measure_kernels(), "step_s": measure_step_seconds() if step else 0.0} for _ in range(max(rounds, 1))]
    finally:
        torch.set_num_threads(before)
    rates: dict[str, Any] = {k: (min if k.endswith("_s") else max)(r[k] for r in runs) for k in runs[0]}
    rates["idle_bytes"], rates["codec_bytes"] = measure_idle_bytes()
    rates.update(version=CALIBRATION_VERSION, key=machine_key(threads), threads=threads, rounds=len(runs),
                 measured=time.strftime("%Y-%m-%d %H:%M:%S"))  # fmt: skip
    return rates


def load_rates(threads: int = 1, path: Optional[Path] = None, recalibrate: bool = False) -> dict[str, Any]:
    """The stored rates for this machine and ``threads``; measured (and stored) when missing or stale.

    Args:
        threads (int, optional): as for :func:`calibrate`. (default: ``1``)
        path (Path, optional): the store. (default: ``None``: ``calibration_path()``)
        recalibrate (bool, optional): measure again even if stored. (default: ``False``)
    """
    path = Path(path) if path is not None else calibration_path()
    key = machine_key(threads)
    stored = read_store(path)
    entry = stored.get(key)
    if recalibrate or not entry or entry.get("version") != CALIBRATION_VERSION:
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
RATE_KEYS = ("spmm", "dense", "elementwise_s", "codec", "step_s", "idle_bytes", "codec_bytes")


def check_rates(rates: Any, source: str) -> dict[str, Any]:
    """``rates`` if it holds every one of :data:`RATE_KEYS` as a number, else the ``ValueError`` naming what is missing.

    A missing figure is never taken as 0: a calibration without ``codec_bytes`` would plan every
    quantized run without the quantizer's compiled kernels (tens of MB a rank).

    Args:
        rates: the calibration. source (str): where it came from, for the message.
    """
    missing = [k for k in RATE_KEYS if not isinstance(rates, dict) or k not in rates]
    if missing:
        raise ValueError(
            f"{source} is not a complete calibration: it lacks {', '.join(missing)}; write one with "
            '`python -c "import json, lightning_halo.planner.calibrate as c; print(json.dumps(c.calibrate()))"`'
            " (or let the planner measure this machine: leave out the calibration)"
        )
    bad = [k for k in RATE_KEYS if isinstance(rates[k], bool) or not isinstance(rates[k], (int, float)) or rates[k] < 0]
    if bad:
        raise ValueError(f"{source}: {', '.join(f'{k}={rates[k]!r}' for k in bad)} must be non-negative numbers")
    return rates


def read_rates(path: str | os.PathLike) -> dict[str, Any]:
    """Rates stored in a file of their own (``plan(rates=...)``, ``lightning-halo plan --calibration FILE``).

    The file holds one calibration as :func:`calibrate` returns it (or as ``plan --json``
    prints it under ``assumptions.calibration``): another machine's figures, or fixed ones for
    a reproducible plan.
    """
    try:
        rates = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read the calibration {path}: {err}") from err
    return check_rates(rates, str(path))
