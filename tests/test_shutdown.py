"""A clean exit: no gloo worker thread is left waiting for the GIL when the interpreter shuts down.

Such a thread (it drops its references to a finished collective's tensors, which takes the GIL)
is ended by the shutting-down interpreter with ``pthread_exit``; the unwind meets a ``noexcept``
destructor and the process aborts with ``terminate called without an active exception``
(see :mod:`lightning_halo.shutdown`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from lightning_halo.shutdown import release_process_groups

GLOO_WORKER = "pt_gloo_runloop"  # the name ProcessGroupGloo gives its worker threads
RUNS = 3


def gloo_workers() -> int:
    """This process's live gloo worker threads."""
    names = []
    for task in Path("/proc/self/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:  # ended meanwhile
            continue
    return names.count(GLOO_WORKER)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_release_joins_every_gloo_worker_thread_each_time() -> None:
    for _ in range(8):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        halo = dist.new_group(backend="gloo")
        cycle: dict = {"group": halo}
        cycle["self"] = cycle  # held only through a reference cycle, as DDP's wrapper holds the group
        for group in (None, halo):
            t = torch.ones(4)
            dist.all_reduce(t, group=group)  # a finished collective whose tensors a worker thread releases
            work = dist.all_reduce(torch.ones(2), group=group, async_op=True)
            work.wait()
        assert gloo_workers() > 0
        del halo, cycle, work, group
        release_process_groups()
        assert not dist.is_initialized()
        assert gloo_workers() == 0, "a gloo worker thread outlived release_process_groups"
    release_process_groups()  # nothing to release: no error


@pytest.mark.multiprocess
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_training_runs_exit_cleanly_every_time(tmp_path: Path) -> None:
    """Ranks that shut their interpreter down (multiprocessing's forked ranks end with os._exit, skipping
    it; these are forked from one interpreter and exit as a script does), a new partition cache each
    time: every run exits with 0 and no gloo worker thread is left at exit."""
    from tests.support.exiting import run_exiting

    outs = [tmp_path / str(attempt) for attempt in range(RUNS)]
    runs = [["tests/workers/shutdown_worker.py", "--out", str(out), "--hold-gil"] for out in outs]
    every = run_exiting(runs, 2, tmp_path / "logs", env={"PYTHONFAULTHANDLER": "1"}, timeout=300)
    for attempt, (out, results) in enumerate(zip(outs, every)):
        for rank, result in enumerate(results):
            where = f"run {attempt} rank {rank} (exit {result.returncode}):\n{result.stdout[-3000:]}"
            assert "terminate called" not in result.stdout and result.returncode == 0, where
            assert (out / f"rank{rank}.txt").read_text() == "(160, 3)", where
            assert (out / f"exit-rank{rank}.txt").read_text() == "0", "gloo worker threads alive at exit: " + where


def test_cycles_are_collected_while_the_registry_still_holds_the_groups(monkeypatch) -> None:
    """The collector runs before the groups are destroyed: a DDP reducer collected afterwards would drop a
    group's last reference inside the collector, whose destructor joins gloo's worker threads with the GIL
    held while a worker releasing a finished collective's tensors waits for it (a rank hung at exit so,
    in the error-scenario workers, once the ranks' closing collection became fast)."""
    import gc

    import lightning_halo.shutdown as shutdown

    calls = []
    monkeypatch.setattr(shutdown.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(shutdown.dist, "destroy_process_group", lambda: calls.append("destroy"))
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append("collect") or 0)
    shutdown.release_process_groups()
    assert calls == ["collect", "destroy"]
