"""Preemption and a lost node on the SLURM testbed: batch jobs that are signalled, requeued, killed and restarted.

    python -m benchmarks.recovery            # brings the 2-node testbed up, runs both scenarios, takes it down

Two scenarios, each a real ``sbatch`` job on ``../shared/testbed/cluster.sh`` (2 nodes, one rank each):

- **requeue** (:func:`requeue`): pipelined 1-bit GCN on Cora for 10 epochs with ``--requeue``;
  ``scancel --signal=USR1`` at a random point of epoch 3's step (what ``#SBATCH
  --signal=SIGUSR1@90`` sends before the time limit). :class:`~lightning_halo.HaloRequeue` has
  every rank checkpoint after that step, rank 0 requeues, SLURM starts the job again and
  Lightning resumes it from ``hpc_ckpt_1.ckpt``. Compared with an uninterrupted job.
- **lost node** (:func:`lost_node`): 32-bit sync GCN on Cora for 10 epochs with
  ``ModelCheckpoint(save_last=True)``; the rank on the second node is killed (``SIGKILL``) in
  epoch 4. The job fails; a job on the surviving node resumes ``--ckpt_path last`` at one process
  (a resize, docs/modes.md). Measured: the seconds from the kill to the failed job's end and to
  the first training step of the new job.

``tests/test_slurm.py`` runs both and checks the results; this module's ``main`` writes
``benchmarks/results/recovery.json`` (the times are this machine's: one core per node).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "recovery.json"
EPOCHS = 10
#: The launcher's rendezvous variables: a value left in the submitting shell would reach the job.
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK")
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def job_script(out: Path, cache: Path, config: str, nodes: int, extra: list[str], requeue: bool) -> str:
    """A batch script: ``lightning-halo fit`` of ``config`` on ``nodes`` nodes (one task each), marked steps, last.ckpt.

    Writes the tasks' command to ``out/task.sh``.
    """
    out.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).with_name("lightning-halo")
    fit = [
        str(exe), "fit", "--config", str(ROOT / "examples" / "configs" / config), "--trainer.max_epochs", str(EPOCHS),
        "--trainer.enable_progress_bar", "false", "--trainer.devices", "1", "--trainer.num_nodes", str(nodes),
        "--trainer.enable_checkpointing", "true",
        "--trainer.default_root_dir", str(out / "run"),
        "--trainer.callbacks+=tests.support.slurm.SlowSteps", "--trainer.callbacks.marker_dir", str(out / "markers"),
        "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.save_last=true",
        "--trainer.callbacks.dirpath", str(out / "ckpt"), *extra,
    ]  # fmt: skip
    # Each task finds its own node's NIC (the batch script runs on the first node only).
    (out / "task.sh").write_text("export GLOO_SOCKET_IFNAME=$(ip -o link | grep -o 'hn[0-9]*' | head -1)\n"
                                 "exec " + " ".join(fit) + "\n")  # fmt: skip
    return "\n".join([
        "#!/bin/bash", "#SBATCH -J halo-recovery", f"#SBATCH -N{nodes}", "#SBATCH --ntasks-per-node=1",
        *(["#SBATCH --requeue"] if requeue else ["#SBATCH --no-requeue"]),
        "#SBATCH --open-mode=append", f"#SBATCH -o {out / 'job.log'}", "#SBATCH --time=15",
        "unset " + " ".join(RENDEZVOUS),
        f"export LIGHTNING_HALO_CACHE={cache} PYTHONPATH={ROOT} OMP_NUM_THREADS=1",
        f"cd {ROOT}", 'echo "job start, restart ${SLURM_RESTART_COUNT:-0}"', f"srun --kill-on-bad-exit=1 bash {out / 'task.sh'}", "",
    ])  # fmt: skip


def submit(cluster: str, out: Path, script: str) -> str:
    """``sbatch`` the script (kept as ``out/job.sbatch``); the job id."""
    (out / "job.sbatch").write_text(script)
    sub = subprocess.run([cluster, "exec", "--", "sbatch", "--parsable", str(out / "job.sbatch")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    if sub.returncode != 0:
        raise RuntimeError(f"sbatch failed: {sub.stdout}{sub.stderr}")
    return sub.stdout.strip().split(";")[0]


def cancel(cluster: str, *job_ids: str) -> None:
    """``scancel`` the jobs (a scenario that failed leaves nothing running on the testbed)."""
    subprocess.run([cluster, "exec", "--", "scancel", *job_ids], capture_output=True, text=True)


def job(cluster: str, job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields (``JobState``, ``Restarts``, ...)."""
    show = subprocess.run([cluster, "exec", "--", "scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    return dict(kv.split("=", 1) for kv in show.stdout.split() if "=" in kv)


def wait_until(what: str, check: Callable[[], bool], timeout: float, log: Path) -> float:
    """Poll ``check`` every 0.1 s; the time it held (``time.time()``). Raises ``TimeoutError`` with the job's log."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            tail = log.read_text()[-4000:] if log.exists() else "(no log)"
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}; job log:\n{tail}")
        time.sleep(0.1)
    return time.time()


def _in_state(cluster: str, job_id: str, states: tuple[str, ...], restarts: str) -> Callable[[], bool]:
    """Whether the job is in one of ``states`` after ``restarts`` requeues."""

    def check() -> bool:
        info = job(cluster, job_id)
        return info.get("JobState") in states and info.get("Restarts", "0") == restarts

    return check


def _finished(cluster: str, job_id: str, restarts: str = "0") -> Callable[[], bool]:
    return _in_state(cluster, job_id, FINAL, restarts)


def _when(stamp: str) -> float:
    """Seconds since the epoch of a ``scontrol`` time stamp (``2026-12-04T06:34:35``, local time)."""
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def _marker(out: Path, epoch: int, rank: int = 0) -> Path:
    return out / "markers" / f"epoch{epoch}.rank{rank}"


def _reached(cluster: str, job_id: str, marker: Path) -> Callable[[], bool]:
    """``marker`` exists; raises at once if the job ended without writing it."""

    def check() -> bool:
        if marker.exists():
            return True
        state = job(cluster, job_id).get("JobState")
        if state in FINAL:
            raise RuntimeError(f"job {job_id} ended ({state}) before {marker.name}; see {marker.parent.parent / 'job.log'}")
        return False

    return check


def _completed(cluster: str, job_id: str, out: Path) -> None:
    state = job(cluster, job_id).get("JobState")
    if state != "COMPLETED":
        log = (out / "job.log").read_text()[-4000:] if (out / "job.log").exists() else ""
        raise RuntimeError(f"job {job_id} ended {state}:\n{log}")


def requeue(cluster: str, work: Path, cache: Path, signal_epoch: int = 3, expedite: bool = True) -> dict[str, Any]:
    """The requeue scenario (module docstring): an uninterrupted job, then one signalled in ``signal_epoch``'s step.

    SLURM holds a requeued batch job for about two minutes before it may start again (its
    ``EligibleTime``; recorded as ``requeue_hold_s``); ``expedite`` releases it at once
    (``scontrol update StartTime=now``), as an administrator could.
    """
    jobs: list[str] = []
    try:
        return _requeue(cluster, work, cache, signal_epoch, jobs, expedite)
    except BaseException:
        cancel(cluster, *jobs)
        raise


def _requeue(cluster: str, work: Path, cache: Path, signal_epoch: int, jobs: list[str], expedite: bool) -> dict[str, Any]:
    config = "gcn_1bit_pipelined.yaml"
    ref = work / "uninterrupted"
    ref_job = submit(cluster, ref, job_script(ref, cache, config, 2, [], requeue=True))
    jobs.append(ref_job)
    wait_until("the uninterrupted job", _finished(cluster, ref_job), 300, ref / "job.log")
    _completed(cluster, ref_job, ref)
    out = work / "requeued"
    job_id = submit(cluster, out, job_script(out, cache, config, 2, [], requeue=True))
    jobs.append(job_id)
    wait_until(f"epoch {signal_epoch}'s step", _reached(cluster, job_id, _marker(out, signal_epoch)), 300, out / "job.log")
    time.sleep(random.uniform(0.0, 0.8))  # somewhere in the marked 1 s step
    sent = time.time()
    sig = subprocess.run([cluster, "exec", "--", "scancel", "--signal=USR1", job_id], capture_output=True, text=True)
    if sig.returncode != 0:
        raise RuntimeError(f"scancel failed: {sig.stderr}")
    wait_until("the job to be requeued", _in_state(cluster, job_id, ("PENDING",), "1"), 300, out / "job.log")
    held = job(cluster, job_id)
    hold = (_when(held["EligibleTime"]) - _when(held["SubmitTime"])) if held.get("EligibleTime", "Unknown") != "Unknown" else None
    if expedite:
        subprocess.run([cluster, "exec", "--", "scontrol", "update", f"JobId={job_id}", "StartTime=now"], capture_output=True)
    wait_until("the requeued job's first step", _marker(out, signal_epoch + 1).exists, 300, out / "job.log")
    training_again = os.path.getmtime(_marker(out, signal_epoch + 1))
    wait_until("the requeued job to finish", _finished(cluster, job_id, "1"), 300, out / "job.log")
    return {"scenario": "requeue", "config": config, "signal_epoch": signal_epoch, "job": job(cluster, job_id),
            "reference_job": job(cluster, ref_job), "dir": str(out), "reference_dir": str(ref),
            "signal_to_training_s": round(training_again - sent, 2), "requeue_hold_s": hold, "expedited": expedite}  # fmt: skip


def lost_node(cluster: str, work: Path, cache: Path, kill_epoch: int = 4) -> dict[str, Any]:
    """The lost-node scenario (module docstring): rank 1's process killed in ``kill_epoch``; one node resumes."""
    jobs: list[str] = []
    try:
        return _lost_node(cluster, work, cache, kill_epoch, jobs)
    except BaseException:
        cancel(cluster, *jobs)
        raise


def _lost_node(cluster: str, work: Path, cache: Path, kill_epoch: int, jobs: list[str]) -> dict[str, Any]:
    config = "gcn.yaml"
    out = work / "lost-node"
    job_id = submit(cluster, out, job_script(out, cache, config, 2, [], requeue=False))
    jobs.append(job_id)
    wait_until(f"epoch {kill_epoch}'s step", _reached(cluster, job_id, _marker(out, kill_epoch, rank=1)), 300, out / "job.log")
    pid = int(_marker(out, kill_epoch, rank=1).read_text().split()[-1].split(":")[1])
    killed = time.time()
    os.kill(pid, signal.SIGKILL)  # the node's rank dies: the process, as an OOM kill or a node's loss ends it
    ended = wait_until("the failed job's end", _finished(cluster, job_id), 300, out / "job.log")
    failed = job(cluster, job_id)
    # Restart on the surviving node from the last checkpoint: a resize from 2 processes to 1.
    again = work / "restarted"
    (again / "markers").mkdir(parents=True, exist_ok=True)
    script = job_script(again, cache, config, 1, ["--ckpt_path", str(out / "ckpt" / "last.ckpt")], requeue=False)
    new_job = submit(cluster, again, script)
    jobs.append(new_job)
    wait_until("the restarted job's first step", lambda: any((again / "markers").glob("epoch*.rank0")), 300, again / "job.log")
    training_again = min(os.path.getmtime(p) for p in (again / "markers").glob("epoch*.rank0"))
    wait_until("the restarted job to finish", _finished(cluster, new_job), 300, again / "job.log")
    return {"scenario": "lost node", "config": config, "kill_epoch": kill_epoch, "failed_job": failed,
            "job": job(cluster, new_job), "dir": str(again), "failed_dir": str(out),
            "failure_to_job_end_s": round(ended - killed, 2), "failure_to_training_s": round(training_again - killed, 2)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    from benchmarks.harness import testbed

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=RESULT)
    a = p.parse_args(argv)
    script = str(testbed())
    up = subprocess.run([script, "up", "--nodes", "2", "--rate", "1gbit"], capture_output=True, text=True, timeout=900)
    if up.returncode != 0:
        raise SystemExit(f"testbed did not start:\n{up.stdout}\n{up.stderr}")
    try:
        with tempfile.TemporaryDirectory(prefix="halo-recovery-") as tmp:
            cache = Path(tmp) / "cache"
            results = [requeue(script, Path(tmp), cache, expedite=False), lost_node(script, Path(tmp), cache)]
    finally:
        subprocess.run([script, "down"], capture_output=True, text=True, timeout=300)
    for r in results:
        r.pop("dir"), r.pop("reference_dir", None), r.pop("failed_dir", None)
        for key in ("job", "reference_job", "failed_job"):
            if key in r:
                r[key] = {k: r[key].get(k) for k in ("JobState", "Restarts", "ExitCode", "NumNodes")}
    a.out.write_text(json.dumps({"testbed": "2 nodes, 1 core each, 1 Gbit/s", "results": results}, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
