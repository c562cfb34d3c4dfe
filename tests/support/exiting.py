"""Ranks that end as a fresh interpreter ends, without each paying a fresh interpreter's imports.

:func:`run_exiting` starts one interpreter that imports the ranks' modules once (``python -m
tests.support.exiting SPEC``); it ``os.fork``s every rank of every run from there. A rank runs
its script as ``__main__`` and then leaves by the way a script does: up to the top level with
``SystemExit``, through the ``atexit`` handlers and the interpreter's finalisation, to its exit
status. (A rank forked by :mod:`multiprocessing`, as :mod:`tests.support.launch` forks them, ends
with ``os._exit`` and skips all of that: what a test of the process exit must not skip.)
``LIGHTNING_HALO_FRESH_WORKERS=1`` starts fresh interpreters instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.launch import REPO, free_port


def run_exiting(
    runs: Sequence[Sequence[str]], world_size: int, logs: Path, env: Mapping[str, str], timeout: float = 300
) -> list[list[subprocess.CompletedProcess]]:
    """Run ``python *args`` as ``world_size`` ranks (env rendezvous), for each ``args`` of ``runs``, one run
    after the other; every rank's output (stdout and stderr) and exit status, per run.

    ``env`` is added to this process's environment for every rank; ``timeout`` bounds each run (its ranks
    are killed then). As :func:`benchmarks.launch.run_workers`, a failed rank's peers are killed 5 s later.
    """
    from tests.support.launch import PRELOAD

    if os.environ.get("LIGHTNING_HALO_FRESH_WORKERS") == "1":
        from benchmarks.launch import run_workers

        return [run_workers(list(args), world_size, timeout=timeout, env=dict(env)) for args in runs]
    logs.mkdir(parents=True, exist_ok=True)
    spec = logs / "spec.json"
    result = logs / "exits.json"
    spec.write_text(json.dumps({"runs": [list(a) for a in runs], "world_size": world_size, "logs": str(logs),
                                "timeout": timeout, "preload": list(PRELOAD), "result": str(result)}))  # fmt: skip
    # what a rank's interpreter reads at its start (the forked ranks inherit it from this one)
    parent_env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                  "OMP_NUM_THREADS": "1", **env}  # fmt: skip
    parent_env.pop("SLURM_NTASKS", None)
    done = subprocess.run([sys.executable, "-m", "tests.support.exiting", str(spec)], cwd=REPO, env=parent_env,
                          capture_output=True, text=True, timeout=timeout * len(runs) + 120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    exits = json.loads(result.read_text())
    return [
        [subprocess.CompletedProcess([sys.executable, *args], code, _log(logs, i, rank).read_text(), "")
         for rank, code in enumerate(codes)]
        for i, (args, codes) in enumerate(zip(runs, exits))
    ]  # fmt: skip


def _log(logs: Path, run: int, rank: int) -> Path:
    return logs / f"run{run}-rank{rank}.log"


def _main(spec_path: str) -> None:
    """The forking interpreter: import, then every run's ranks; their exit statuses to ``spec["result"]``."""
    import importlib

    spec = json.loads(Path(spec_path).read_text())
    for module in spec["preload"]:
        importlib.import_module(module)
    exits = []
    for i, args in enumerate(spec["runs"]):
        port = free_port()
        pids = []
        for rank in range(spec["world_size"]):
            sys.stdout.flush(), sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _become_rank(args, rank, spec["world_size"], port, _log(Path(spec["logs"]), i, rank))
            pids.append(pid)
        exits.append(_wait(pids, spec["timeout"]))
    Path(spec["result"]).write_text(json.dumps(exits))


def _become_rank(args: list[str], rank: int, world_size: int, port: int, log: Path) -> None:
    """In the forked rank: ``python *args`` (rank variables, output to ``log``), then the interpreter's own exit."""
    import faulthandler
    import runpy

    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1), os.dup2(fd, 2)
    os.close(fd)
    if faulthandler.is_enabled():  # PYTHONFAULTHANDLER: on the rank's own output
        faulthandler.enable()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size), RANK=str(rank),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size), NODE_RANK="0", GROUP_RANK="0")  # fmt: skip
    sys.argv = list(args)
    sys.path.insert(0, str((REPO / args[0]).resolve().parent))  # as for `python script.py`
    runpy.run_path(args[0], run_name="__main__")
    # Not os._exit: up through the forking interpreter's frames (none catches it) to the top level.
    raise SystemExit(0)


def _wait(pids: list[int], timeout: float) -> list[int]:
    """Every rank's exit status (``-N``: killed by signal N, as ``Popen.returncode``); all killed at ``timeout``,
    the others 5 s after one fails."""
    codes: dict[int, int] = {}
    deadline, failed_at = time.monotonic() + timeout, None
    while len(codes) < len(pids):
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        if failed_at is None and any(codes.values()):
            failed_at = time.monotonic()
        if time.monotonic() > deadline or (failed_at is not None and time.monotonic() > failed_at + 5):
            for pid in pids:
                if pid not in codes:
                    os.kill(pid, 9)
                    codes[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        time.sleep(0.05)
    return [codes[pid] for pid in pids]


if __name__ == "__main__":
    _main(sys.argv[1])
