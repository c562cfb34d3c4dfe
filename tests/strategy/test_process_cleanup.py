"""A failed run leaves no process behind: rank 0 kills the ranks Lightning's launcher started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def processes_of_run(marker: str) -> list[int]:
    """Live (not zombie) processes whose environment carries ``LIGHTNING_HALO_TEST_RUN=marker``.

    Every process a run starts inherits its environment, so this finds children and grandchildren
    even after they were re-parented to init.
    """
    needle = f"LIGHTNING_HALO_TEST_RUN={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


@pytest.mark.multiprocess
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_a_frozen_rank_does_not_survive_the_failed_run(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    env = dict(os.environ, LIGHTNING_HALO_TEST_RUN=marker, LIGHTNING_HALO_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")  # fmt: skip
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_NTASKS"):
        env.pop(key, None)  # Lightning's own launcher starts rank 1
    log = tmp_path / "run.log"
    try:
        with open(log, "w") as out:  # a file, not a pipe: a surviving child would hold a pipe open
            run = subprocess.Popen([sys.executable, str(ROOT / "tests/workers/frozen_rank_worker.py"), "5"],
                                   cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
            returncode = run.wait(timeout=600)
        output = log.read_text()
        assert returncode != 0, output[-3000:]
        assert "HaloExchangeError" in output, output[-3000:]
        assert (tmp_path / "pid-1").exists(), "rank 1 never reached training_step: " + output[-3000:]
        deadline = time.monotonic() + 10  # a killed process is gone within milliseconds; a frozen one stays
        while processes_of_run(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        survivors = processes_of_run(marker)
        assert not survivors, f"processes {survivors} of the failed run are still alive (rank 1 pid {(tmp_path / 'pid-1').read_text()})"
    finally:
        for pid in processes_of_run(marker):
            os.kill(pid, signal.SIGKILL)
