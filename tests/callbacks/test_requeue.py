"""SLURM's requeue signal under the strategy: acted on at one step by every rank, and resumed exactly.

Local ranks that SLURM's variables describe (Lightning takes them for an ``srun`` job and
auto-requeues) with a fake ``scontrol``; the real cluster is ``tests/test_slurm.py``'s.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from lightning_halo import HaloRequeue
from tests.support.launch import check, run_workers

WORKER = "tests/workers/requeue_worker.py"


def _phase(tmp_path: Path, phase: str, *extra: str) -> list[dict]:
    check(run_workers([WORKER, "--out", str(tmp_path), "--phase", phase, *extra], 2, timeout=300))
    return [torch.load(tmp_path / phase / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", ["pipelined-1bit", "exact"])
def test_a_signal_on_one_rank_checkpoints_every_rank_at_the_same_step_and_the_requeued_run_is_bitwise(
    mode: str, tmp_path
) -> None:
    """Rank 1 alone gets SIGUSR1 in epoch 2's step: both ranks finish that step, write the HPC checkpoint,
    rank 0 requeues the job once and the job stops; the requeued job resumes from the checkpoint by
    itself and ends bitwise equal to an uninterrupted run (pipelined 1-bit: the halo state is restored;
    32-bit sync)."""
    extra = ["--exact"] if mode == "exact" else []
    full = _phase(tmp_path, "full", *extra)
    signalled = _phase(tmp_path, "signalled", "--signal-epoch", "2", "--signal-rank", "1", *extra)
    for rec in signalled:
        assert rec["epochs"] == [0, 1, 2] and rec["global_step"] == 3, rec["epochs"]
    assert sorted(p.name for p in (tmp_path / "run").glob("hpc_ckpt_*.ckpt")) == ["hpc_ckpt_1.ckpt"]
    assert (tmp_path / "scontrol.txt").read_text().split("\n")[:-1] == ["requeue 4242"], "rank 0 requeues, once"
    ckpt = torch.load(tmp_path / "run" / "hpc_ckpt_1.ckpt", weights_only=False)
    assert ckpt["global_step"] == 3 and len(ckpt["callbacks"]["HaloStateCallback"]["ranks"]) == 2

    requeued = _phase(tmp_path, "requeued", *extra)
    for rec, ref in zip(requeued, full):
        assert rec["epochs"] == [3, 4, 5] and rec["global_step"] == ref["global_step"] == 6, rec["epochs"]
        assert rec["params"].keys() == ref["params"].keys()
        for name, value in ref["params"].items():
            assert torch.equal(rec["params"][name], value), name


def test_at_the_end_of_a_step_the_recorded_signal_runs_lightnings_handler_once_and_stops() -> None:
    """One process (no group to agree with): the step's end runs the handler it deferred, once, and stops the run."""
    calls = []

    class Env:
        requeue_signal = signal.SIGUSR2

    class Strategy:
        cluster_environment = Env()
        root_device = torch.device("cpu")

    class Trainer:
        strategy = Strategy()
        global_step = 7
        should_stop = False

    trainer = Trainer()
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    try:
        cb = HaloRequeue()
        cb.on_train_start(trainer, None)
        cb.on_train_batch_end(trainer, None, None, None, 0)
        assert calls == [] and not trainer.should_stop, "no signal: nothing happens"
        signal.raise_signal(signal.SIGUSR2)
        cb.on_train_batch_end(trainer, None, None, None, 0)
        assert calls == [signal.SIGUSR2] and trainer.should_stop and not cb.pending
        cb.on_train_batch_end(trainer, None, None, None, 0)
        assert calls == [signal.SIGUSR2], "acted on once"
        cb.teardown(trainer, None, "fit")
        assert signal.getsignal(signal.SIGUSR2) is not None and signal.getsignal(signal.SIGUSR2) != cb._record
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_the_callback_records_the_signal_and_gives_the_handler_back() -> None:
    """While training, the signal is only recorded; afterwards the handler it replaced is back."""
    calls = []

    def lightning_handler(signum, frame):  # stands in for Lightning's checkpoint-and-requeue
        calls.append(signum)

    class Env:
        requeue_signal = signal.SIGUSR2

    class Strategy:
        cluster_environment = Env()

    class Trainer:
        strategy = Strategy()

    previous = signal.signal(signal.SIGUSR2, lightning_handler)
    try:
        cb = HaloRequeue()
        cb.on_train_start(Trainer(), None)
        signal.raise_signal(signal.SIGUSR2)
        assert cb.pending and calls == [], "deferred: Lightning's handler has not run"
        cb.on_train_end(Trainer(), None)
        assert signal.getsignal(signal.SIGUSR2) is lightning_handler
        signal.raise_signal(signal.SIGUSR2)
        assert calls == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, previous)
