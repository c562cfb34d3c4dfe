"""The local multi-process launcher of the tests (it lives in :mod:`benchmarks.launch`, shared with the harness).

The tests fork their ranks from a server that imported these modules once (see
:func:`benchmarks.launch.run_workers`); ``LIGHTNING_HALO_FRESH_WORKERS=1`` starts fresh
interpreters instead.
"""

from __future__ import annotations

import functools

from benchmarks.launch import REPO, check, free_port
from benchmarks.launch import run_workers as _run_workers

PRELOAD = ("torch", "lightning", "torch_geometric", "torch_geometric.nn", "torchmetrics", "lightning_halo.strategy",
           "lightning_halo.data.datamodule", "lightning_halo.callbacks", "lightning.pytorch.cli", "jsonargparse",
           "tests.support.trainer")  # fmt: skip

run_workers = functools.partial(_run_workers, preload=PRELOAD)

__all__ = ["PRELOAD", "REPO", "check", "free_port", "run_workers"]
