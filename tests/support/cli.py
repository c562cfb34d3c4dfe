"""Running ``lightning-halo`` in tests: the installed command, two launched ranks, or ``main`` in this process.

A verb that only parses or fails early runs in this process (:func:`cli_in_process`, or the
``lightning_halo_cli`` fixture of ``tests/conftest.py``); a run on two ranks forks them from the
tests' preloaded server (:func:`cli_ranks`). The installed command (:func:`cli`) costs a fresh
interpreter (~6 s of imports) and then Lightning's launcher starts another: only where that is
what a test proves (``verify``'s own launch; torchrun's and the README's commands start theirs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.shared import find_shared
from tests.support.cache import shared_cache
from tests.support.launch import check, run_workers

ROOT = Path(__file__).resolve().parents[2]


def shared_datasets() -> Path | None:
    """The shared datasets folder, or None (:func:`benchmarks.shared.find_shared`)."""
    return find_shared("datasets", override="LIGHTNING_HALO_DATASETS")


def cli(*args: str, tmp_path: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """The installed ``lightning-halo *args`` in ``tmp_path``, with a cache of its own."""
    exe = shutil.which("lightning-halo") or str(Path(sys.executable).with_name("lightning-halo"))
    env = dict(os.environ, LIGHTNING_HALO_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.pop("SLURM_NTASKS", None)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(key, None)
    return subprocess.run([exe, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def cli_ranks(*args: str, tmp_path: Path, timeout: float = 600, cache: Path | None = None) -> str:
    """Run ``lightning-halo *args`` as two torchrun-style ranks forked from the tests' preloaded
    server (:mod:`tests.support.launch`); returns both ranks' output, rank 0 first.

    Saves the two fresh interpreters of a :func:`cli` run (about 12 s); the command's own launcher
    (Lightning's subprocess launcher) is exercised by the README test. ``cache``: a partition cache
    of the test's own (to look at what the run wrote there), instead of the session's.
    """
    # the session's partition cache (tests.support.cache): Tolokers and CiteSeer are partitioned once per run
    where = str(cache) if cache is not None else shared_cache(tmp_path / "cache")
    env = {"LIGHTNING_HALO_CACHE": where, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    results = run_workers(["-m", "lightning_halo.cli", *args], 2, timeout=timeout, env=env, cwd=tmp_path)
    check(results)
    return "".join(r.stdout for r in results)


def cli_in_process(*args: str, capsys: pytest.CaptureFixture) -> str:
    """Run a ``lightning-halo`` call that only parses (``--print_config``, ``--help``) in this process: its stdout."""
    from lightning_halo.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    assert exit_.value.code in (0, None), capsys.readouterr().err[-3000:]
    return capsys.readouterr().out
