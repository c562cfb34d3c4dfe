"""The local multi-process launcher of the tests (it lives in :mod:`benchmarks.launch`, shared with the harness).

The tests fork their ranks from a server that imported these modules once (see
:func:`benchmarks.launch.run_workers`); ``LIGHTNING_HALO_FRESH_WORKERS=1`` starts fresh
interpreters instead. Every launch is recorded (:mod:`tests.support.launches`): a whole run of
the suite must launch every configuration listed in ``tests/launches.json``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence

from benchmarks import launch
from benchmarks.launch import REPO, check, free_port, run_forked
from benchmarks.launch import run_workers as _run_workers
from tests.support.device import ON_CUDA
from tests.support.launches import record

#: The ranks' imports, the tests' trainer helpers, and the command's (``tools/gen_docs.py``'s commands fork from it).
#: None on CUDA: the server's imports touch CUDA (``tests.support.device`` asks for it), and a process forked
#: after that cannot initialise CUDA ("CUDA error: initialization error", found on the GPU check): fresh ones.
PRELOAD = () if ON_CUDA else (*launch.PRELOAD, "tests.support.trainer", "lightning_halo.cli", "lightning_halo.planner")


def run_workers(args: Sequence[str], world_size: int, **kwargs) -> list[subprocess.CompletedProcess]:
    """:func:`benchmarks.launch.run_workers` from the preloaded server, recorded."""
    record(list(args), world_size)
    return _run_workers(list(args), world_size, preload=PRELOAD, **kwargs)


def run_module(module: str, args: list[str], env: Mapping[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m module *args`` in the repository with exactly ``env``, forked from the same server as the ranks.

    For the benchmark commands the tests run: what a fresh interpreter prints, without its imports. Their
    local ranks fork from a preloaded server of the command's own (``$LIGHTNING_HALO_BENCH_PRELOAD``).
    """
    env = {**env, launch.PRELOAD_ENV: "1"}
    return run_forked(["-m", module, *args], env, REPO, PRELOAD, timeout)


__all__ = ["PRELOAD", "REPO", "check", "free_port", "run_module", "run_workers"]
