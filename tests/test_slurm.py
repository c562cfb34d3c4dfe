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

from benchmarks.shared import find_shared

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


_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK")


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
    local_env = dict(os.environ, LIGHTNING_HALO_CACHE=str(cache), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for key in ("SLURM_NTASKS", "SLURM_JOB_NAME", *_RENDEZVOUS):
        local_env.pop(key, None)
    local = subprocess.run(
        [str(exe), *_fit_args(tmp_path / "local"), "--trainer.devices", "2"],
        cwd=ROOT, env=local_env, capture_output=True, text=True, timeout=900,
    )
    assert local.returncode == 0, local.stdout[-4000:] + local.stderr[-4000:]
    a, b = _weights(tmp_path / "slurm" / "ckpt" / "last.ckpt"), _weights(tmp_path / "local" / "ckpt" / "last.ckpt")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=lambda m: f"{name}: {m}")
