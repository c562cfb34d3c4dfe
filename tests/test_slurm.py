"""A real 2-node SLURM job (srun) gives the same model as 2 local processes.

Uses the project's testbed script (``$LIGHTNING_HALO_TESTBED``, ``$LIGHTNING_HALO_SHARED/testbed/cluster.sh``
or ../shared/testbed/cluster.sh, see benchmarks/shared.py):
two network namespaces with their own NICs, slurmctld and one slurmd per node. It starts daemons
and network namespaces on this machine, so it runs only when asked: ``LIGHTNING_HALO_TEST_SLURM=1``
(``.ci/run`` sets it). Asked for, it fails (with the reason) where the testbed cannot start: not
root, no network namespaces, or no testbed script. The cluster is always taken down.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.recovery import RENDEZVOUS
from benchmarks.shared import find_shared
from tests.support.cli import cli_ranks

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "configs" / "gcn.yaml"


def find_testbed_script() -> Path | None:
    return find_shared("testbed/cluster.sh", override="LIGHTNING_HALO_TESTBED")


def _why_not() -> str | None:
    if find_testbed_script() is None:
        return "no testbed script (../shared/testbed/cluster.sh, $LIGHTNING_HALO_SHARED or $LIGHTNING_HALO_TESTBED)"
    if os.geteuid() != 0:
        return "the SLURM testbed needs root"
    probe = subprocess.run(["ip", "netns", "add", "halo_probe"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"network namespaces unavailable: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "halo_probe"], capture_output=True)
    return None


OPT_IN = "LIGHTNING_HALO_TEST_SLURM"


@pytest.fixture(scope="module")
def cluster():
    if os.environ.get(OPT_IN) != "1":
        pytest.skip(f"starts a SLURM cluster on this machine; run it with {OPT_IN}=1 (CI does)")
    reason = _why_not()
    if reason:
        pytest.fail(f"{OPT_IN}=1 but the SLURM testbed cannot start: {reason}")
    script = str(find_testbed_script())
    up = subprocess.run([script, "up", "--nodes", "2", "--rate", "1gbit"], capture_output=True, text=True, timeout=900)
    try:
        assert up.returncode == 0, f"testbed did not start:\n{up.stdout}\n{up.stderr}"
        yield script
    finally:
        subprocess.run([script, "down"], capture_output=True, text=True, timeout=300)


_RENDEZVOUS = RENDEZVOUS  # the launcher's variables: one list, benchmarks/recovery.py's


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


def _fit_args(out: Path) -> list[str]:
    return [
        "fit", "--config", str(CONFIG), "--trainer.max_epochs", "5", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_checkpointing", "true", "--trainer.default_root_dir", str(out),
        "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.save_last=true",
        "--trainer.callbacks.dirpath", str(out / "ckpt"),
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.multiprocess
def test_srun_two_nodes_equals_two_local_processes(cluster: str, tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("lightning-halo")
    cache = tmp_path / "cache"  # one cache on the shared file system: both nodes write it atomically
    # srun exports this shell's environment to the job: a MASTER_ADDR left here would send the
    # second node's rank to its own loopback and wait there.
    unset = "unset " + " ".join(_RENDEZVOUS) + "; "
    env = f"{unset}export LIGHTNING_HALO_CACHE={cache} PYTHONPATH={ROOT} OMP_NUM_THREADS=1; "
    nic = "export GLOO_SOCKET_IFNAME=$(ip -o link | grep -o 'hn[0-9]*' | head -1); "
    job = " ".join([str(exe), *_fit_args(tmp_path / "slurm"), "--trainer.devices", "1", "--trainer.num_nodes", "2"])
    result = subprocess.run(
        [cluster, "exec", "--", "srun", "-J", "halo-ci", "-N2", "--ntasks-per-node=1", "--time=15",
         "bash", "-c", f"cd {ROOT}; {env}{nic}{job}"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    out = result.stdout + result.stderr
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in out and "lightning-halo traffic" in out
    # The same command as two local ranks (forked from the tests' preloaded server, as torchrun starts them).
    cli_ranks(*_fit_args(tmp_path / "local"), "--trainer.devices", "2", tmp_path=tmp_path)
    a, b = _weights(tmp_path / "slurm" / "ckpt" / "last.ckpt"), _weights(tmp_path / "local" / "ckpt" / "last.ckpt")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=lambda m: f"{name}: {m}")



@pytest.mark.slow
@pytest.mark.multiprocess
def test_requeue_on_the_signal_resumes_bitwise(cluster: str, tmp_path: Path) -> None:
    """``scancel --signal=USR1`` at a random point of epoch 3's step: every rank checkpoints after that step
    (HaloRequeue), rank 0 requeues, SLURM restarts the job, Lightning resumes it from the HPC checkpoint, and
    the run ends bitwise equal to an uninterrupted one (pipelined 1-bit: stale rows and codec state restored),
    having trained each epoch once (benchmarks/recovery.py)."""
    from benchmarks.recovery import EPOCHS, requeue

    rec = requeue(cluster, tmp_path, tmp_path / "cache", signal_epoch=3)
    out, ref = Path(rec["dir"]), Path(rec["reference_dir"])
    log = (out / "job.log").read_text()
    assert rec["reference_job"]["JobState"] == "COMPLETED", (ref / "job.log").read_text()[-4000:]
    assert rec["job"]["JobState"] == "COMPLETED" and rec["job"]["Restarts"] == "1", log[-4000:]
    assert "job start, restart 0" in log and "job start, restart 1" in log
    assert "requeue signal received; checkpointing after step 4" in log, log[-4000:]
    assert "hpc_ckpt_1.ckpt" in log, "the requeued job resumes from Lightning's HPC checkpoint:\n" + log[-4000:]
    for epoch in range(EPOCHS):  # each epoch trained once: the first job up to epoch 3, the requeued one after it
        runs = [line.split(":")[0] for line in (out / "markers" / f"epoch{epoch}.rank0").read_text().split()]
        assert runs == (["0"] if epoch <= 3 else ["1"]), (epoch, runs)
    a, b = _weights(out / "ckpt" / "last.ckpt"), _weights(ref / "ckpt" / "last.ckpt")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_lost_node_ends_the_job_and_the_survivor_resumes_from_the_last_checkpoint(cluster: str, tmp_path: Path) -> None:
    """The second node's rank is killed in epoch 4: the job fails (no rank left waiting), and a job on the
    surviving node resumes ``--ckpt_path last`` at one process (a resize from 2) and trains epochs 4-9."""
    from benchmarks.recovery import EPOCHS, lost_node

    rec = lost_node(cluster, tmp_path, tmp_path / "cache", kill_epoch=4)
    again, failed = Path(rec["dir"]), Path(rec["failed_dir"])
    assert rec["failed_job"]["JobState"] == "FAILED", (failed / "job.log").read_text()[-4000:]
    log = (again / "job.log").read_text()
    assert rec["job"]["JobState"] == "COMPLETED", log[-4000:]
    assert "written by 2 processes with 1" in log, log[-4000:]
    trained = sorted(int(p.name[5:].split(".")[0]) for p in (again / "markers").glob("epoch*.rank0"))
    assert trained == list(range(4, EPOCHS)), trained
    assert torch.load(again / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"] == EPOCHS
    print(f"lost node: job ended {rec['failure_to_job_end_s']} s after the kill, training again after "
          f"{rec['failure_to_training_s']} s")
