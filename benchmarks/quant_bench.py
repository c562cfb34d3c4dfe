"""Throughput of the halo row codec against a plain ``copy_`` of the same rows.

For every (n, d) cell an fp32 tensor ``x`` [n, d] is created once; ``y.copy_(x)``
into a pre-allocated, already-touched ``y`` is timed in the same run as the
baseline. Then, for each implementation and bit width, it times

* ``quantize(x, bits)``            -- the API call, allocating its output;
* ``quantize(x, bits, out=buf)``   -- into a pre-allocated send buffer;
* ``dequantize(q)``                -- the API call, allocating ``[n, d]``;
* ``dequantize(q, out=y2)``        -- into a pre-allocated, touched tensor.

Throughput is GB/s of fp32 *input* bytes (``n * d * 4 / t``) for every column,
so ratios to ``copy_`` compare like with like. Timings are the median of
``--repeats`` runs after one warm-up (which also pays any JIT cost).

Usage::

    python -m benchmarks.quant_bench                 # full default grid, both impls
    python -m benchmarks.quant_bench --quick         # CI smoke (n=2e4)
    python -m benchmarks.quant_bench --impl numba --n 1000000 --d 256 --bits 1 4

With CUDA available, a device section times the (compiled) torch path on the
GPU against a device-to-device ``copy_`` (measured memory bandwidth).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch


from lightning_halo.quant import dequantize, numba_available, quantize, row_nbytes, use_impl


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _machine_info(threads: int) -> dict:
    info = {
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch_threads": threads,
        "numba": None,
        "numba_threads": None,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        import numba

        info["numba"] = numba.__version__
        info["numba_threads"] = numba.get_num_threads()
        info["numba_kernels"] = "serial (one thread per call, nogil)"
    except ImportError:
        pass
    try:
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
        info["transparent_hugepage"] = thp
    except OSError:
        pass
    return info


def time_median(fn, repeats: int, sync=None) -> float:
    """Median seconds of ``repeats`` calls after one warm-up call."""
    fn()
    if sync:
        sync()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _bench_cell(x, bits_list, impls, repeats, sync=None, copy_t=None):
    n, d = x.shape
    gb = x.numel() * 4 / 1e9
    rows = []
    if copy_t is None:
        y = torch.empty_like(x)
        y.copy_(x)  # touch the destination so page faults are not timed
        copy_t = time_median(lambda: y.copy_(x), repeats, sync)
        del y
    y2 = torch.empty_like(x)
    y2.zero_()
    for impl in impls:
        for bits in bits_list:
            g = torch.Generator().manual_seed(1234)
            with use_impl(impl):
                buf = torch.zeros(n * row_nbytes(d, bits), dtype=torch.uint8, device=x.device)
                q_t = time_median(lambda: quantize(x, bits, generator=g), repeats, sync)
                qo_t = time_median(lambda: quantize(x, bits, generator=g, out=buf), repeats, sync)
                q = quantize(x, bits, generator=g)
                dq_t = time_median(lambda: dequantize(q), repeats, sync)
                dqo_t = time_median(lambda: dequantize(q, out=y2), repeats, sync)
            row = {
                "impl": impl,
                "device": str(x.device),
                "n": n,
                "d": d,
                "bits": bits,
                "copy_s": copy_t,
                "quant_s": q_t,
                "quant_out_s": qo_t,
                "dequant_s": dq_t,
                "dequant_out_s": dqo_t,
                "copy_GBps": gb / copy_t,
                "quant_GBps": gb / q_t,
                "quant_out_GBps": gb / qo_t,
                "dequant_GBps": gb / dq_t,
                "dequant_out_GBps": gb / dqo_t,
                "quant_vs_copy": copy_t / q_t,
                "quant_out_vs_copy": copy_t / qo_t,
                "dequant_vs_copy": copy_t / dq_t,
                "dequant_out_vs_copy": copy_t / dqo_t,
                "wire_bytes_per_row": row_nbytes(d, bits),
            }
            rows.append(row)
            _print_row(row)
    return rows


_HDR = (
    f"{'impl':>5} {'dev':>4} {'n':>8} {'d':>4} {'bits':>4} | {'copy_':>6} | "
    f"{'quant':>6} {'x':>5} {'q(out)':>6} {'x':>5} | {'dequant':>7} {'x':>5} {'dq(out)':>7} {'x':>5}"
)


def _print_row(r: dict) -> None:
    print(
        f"{r['impl']:>5} {r['device'][:4]:>4} {r['n']:>8} {r['d']:>4} {r['bits']:>4} | "
        f"{r['copy_GBps']:6.2f} | {r['quant_GBps']:6.2f} {r['quant_vs_copy']:5.2f} "
        f"{r['quant_out_GBps']:6.2f} {r['quant_out_vs_copy']:5.2f} | "
        f"{r['dequant_GBps']:7.2f} {r['dequant_vs_copy']:5.2f} "
        f"{r['dequant_out_GBps']:7.2f} {r['dequant_out_vs_copy']:5.2f}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[100_000, 1_000_000], help="row counts")
    p.add_argument("--d", type=int, nargs="+", default=[64, 128, 256, 512], help="row widths")
    p.add_argument("--bits", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--impl", choices=["torch", "numba", "both"], default="both")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (>=3)")
    p.add_argument("--threads", type=int, default=1, help="torch/numba threads")
    p.add_argument(
        "--max-elements", type=float, default=None,
        help="skip cells with n*d above this (default: no cap; 1e6 x 512 needs ~8 GB RAM)",
    )
    p.add_argument(
        "--torch-max-elements", type=float, default=None,
        help="skip the (slow) torch impl for cells above this many elements",
    )
    p.add_argument("--quick", action="store_true", help="CI smoke: n=2e4, d in {64, 256}")
    p.add_argument("--no-cuda", action="store_true", help="skip the CUDA section")
    p.add_argument("--out", default="benchmarks/results/quant_bench.json")
    a = p.parse_args(argv)
    if a.quick:
        a.n, a.d = [20_000], [64, 256]
    a.repeats = max(3, a.repeats)

    torch.set_num_threads(a.threads)
    impls = ["torch", "numba"] if a.impl == "both" else [a.impl]
    if "numba" in impls and not numba_available():
        print("numba not importable: benchmarking the torch path only", file=sys.stderr)
        impls = [i for i in impls if i != "numba"]
    if numba_available():
        import numba

        # The codec kernels are serial anyway (no prange); pin numba's pool too.
        numba.set_num_threads(max(1, min(a.threads, numba.config.NUMBA_NUM_THREADS)))
    info = _machine_info(a.threads)
    print(json.dumps(info))
    print("GB/s of fp32 input bytes; x = ratio to copy_ (same run); q(out)/dq(out): pre-allocated output")
    print(_HDR)

    results = []
    gen = torch.Generator().manual_seed(0)
    for n in a.n:
        for d in a.d:
            if a.max_elements is not None and n * d > a.max_elements:
                print(f"skip n={n} d={d} (> --max-elements)")
                continue
            x = torch.randn(n, d, generator=gen)
            # Some per-row structure: shifted, scaled rows like real activations.
            x.mul_(torch.rand(n, 1, generator=gen) * 4).add_(torch.randn(n, 1, generator=gen))
            cell_impls = [
                i for i in impls
                if not (i == "torch" and a.torch_max_elements is not None and n * d > a.torch_max_elements)
            ]
            results += _bench_cell(x, a.bits, cell_impls, a.repeats)
            del x

    if torch.cuda.is_available() and not a.no_cuda:
        dev = torch.device("cuda")
        sync = torch.cuda.synchronize
        for n in a.n:
            for d in a.d:
                x = torch.randn(n, d, device=dev)
                y = torch.empty_like(x)
                y.copy_(x)
                copy_t = time_median(lambda: y.copy_(x), a.repeats, sync)
                del y
                rows = _bench_cell(x, a.bits, ["auto"], a.repeats, sync, copy_t)
                for r in rows:
                    # copy_ of n*d*4 bytes reads + writes 2x that: device memory bandwidth.
                    r["device_copy_bandwidth_GBps"] = 2 * n * d * 4 / 1e9 / copy_t
                results += rows
                del x

    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "machine": info,
        "args": vars(a),
        "notes": "GB/s of fp32 input bytes (n*d*4/t); *_vs_copy = t_copy / t_op in the same run; "
        "median of repeats after one warm-up",
        "results": results,
    }
    out.write_text(json.dumps(payload, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
