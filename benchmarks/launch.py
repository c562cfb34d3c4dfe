"""Launch local worker processes the way torchrun does (env rendezvous) and collect their exit.

Used by the benchmark harness (`--local`) and by the tests (through `tests.support.launch`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_workers(
    args: list[str],
    world_size: int,
    timeout: float = 600,
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
    kill_on_failure: bool = True,
    until_rank_exits: int | None = None,
) -> list[subprocess.CompletedProcess]:
    """Run ``python *args`` as ``world_size`` ranks of one job; kill all on timeout or first failure.

    ``kill_on_failure=False`` lets the other ranks run on after one fails (to observe how they
    stop); ``until_rank_exits=r`` kills the remaining ranks as soon as rank ``r`` has exited.

    Each rank gets MASTER_ADDR/PORT, WORLD_SIZE, RANK, LOCAL_RANK, so Lightning treats the
    processes as externally launched. Returns the completed processes (stdout/stderr text).
    """
    port = free_port()
    procs = []
    logs = []
    for rank in range(world_size):
        e = dict(os.environ)
        e.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE=str(world_size),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world_size),
            NODE_RANK="0",
            GROUP_RANK="0",
            PYTHONPATH=str(REPO) + os.pathsep + e.get("PYTHONPATH", ""),
            OMP_NUM_THREADS="1",
        )
        e.pop("SLURM_NTASKS", None)
        if env:
            e.update(env)
        out_path = (log_dir or Path(os.environ.get("TMPDIR", "/tmp"))) / f"worker-{port}-{rank}.log"
        f = open(out_path, "w+")
        logs.append(f)
        procs.append(subprocess.Popen([sys.executable, *args], env=e, stdout=f, stderr=subprocess.STDOUT, cwd=REPO))
    deadline = time.monotonic() + timeout
    failed = False
    while any(p.poll() is None for p in procs):
        failed = kill_on_failure and any(p.poll() not in (None, 0) for p in procs)
        if until_rank_exits is not None and procs[until_rank_exits].poll() is not None:
            failed = True
        if time.monotonic() > deadline or failed:
            time.sleep(0 if not failed else 5)  # let a failing rank's peers report too
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.1)
    results = []
    for p, f in zip(procs, logs):
        p.wait()
        f.seek(0)
        text = f.read()
        f.close()
        results.append(subprocess.CompletedProcess(p.args, p.returncode, text, ""))
    return results


def check(results: list[subprocess.CompletedProcess]) -> None:
    """Fail with every rank's output tail if any rank failed."""
    if all(r.returncode == 0 for r in results):
        return
    tails = "\n".join(f"--- rank {i} rc={r.returncode}\n{r.stdout[-4000:]}" for i, r in enumerate(results))
    raise AssertionError(f"worker processes failed:\n{tails}")
