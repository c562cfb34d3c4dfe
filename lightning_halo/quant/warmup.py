"""Compile the numba codec kernels ahead of a run, so the first quantized epoch does not.

    python -m lightning_halo.quant.warmup              # every bit width (1, 2, 4, 8, 16)
    python -m lightning_halo.quant.warmup --bits 1     # just the one a run uses

Run it as the user who trains (the cache is per user, see
:mod:`lightning_halo.quant.kernel_cache`), once per machine type; in a SLURM job, as the
job's first step: ``srun --ntasks-per-node=1 python -m lightning_halo.quant.warmup``.
Prints where the kernels are cached and what each bit width cost; exits with status 1
when the numba kernels cannot be used (the codec then runs its slower torch path).
"""

from __future__ import annotations

import argparse
import logging
import sys

import torch

from . import backend
from .format import SUPPORTED_BITS

#: Bit widths with compiled kernels (32 sends raw rows, no kernel).
KERNEL_BITS = tuple(b for b in SUPPORTED_BITS if b != 32)


def main(argv: list[str] | None = None) -> int:
    """Warm the kernel cache; returns the exit status.

    Args:
        argv: Command-line arguments (default: ``sys.argv[1:]``).

    Example:
        >>> main(["--bits", "8"])  # doctest: +SKIP
        0
    """
    parser = argparse.ArgumentParser(prog="python -m lightning_halo.quant.warmup", description=__doc__.split("\n")[0])
    parser.add_argument("--bits", type=int, nargs="+", default=list(KERNEL_BITS), choices=KERNEL_BITS)
    args = parser.parse_args(argv)
    kernels = backend.kernels_for(torch.device("cpu"))
    if not isinstance(kernels, backend.NumbaKernels):
        why = "disabled (LIGHTNING_HALO_NUMBA=0 or set_impl('torch'))" if backend.numba_available() else "not importable"
        print(f"lightning-halo: the numba codec kernels are {why}; the codec uses its torch path", file=sys.stderr)
        return 1
    backend.log.setLevel(logging.WARNING)  # this command prints its own line per bit width
    for bits in args.bits:
        done = kernels.prepare(bits)
        if done is None:  # already prepared in this process (not from this command line)
            continue
        what = "compiled" if done.compiled else "loaded from the cache"
        print(f"bits={bits:2d}: {what} in {done.seconds:.2f} s  ({done.cache_dir})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
