"""Preemption on SLURM: Lightning's checkpoint-and-requeue signal, acted on where every rank is at the same step."""

from __future__ import annotations

import signal
from typing import Any, Callable, Optional

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override

Handler = Callable[[int, Any], Any]


class HaloRequeue(Callback):
    r"""Defers SLURM's requeue signal to the end of a training step, where all ranks act on it together.

    Under SLURM, Lightning (``SLURMEnvironment(auto_requeue=True)``, its default) saves an HPC
    checkpoint and requeues the job from the handler of ``SIGUSR1`` (``#SBATCH
    --signal=SIGUSR1@90``, or ``scancel --signal=USR1``). A handler runs wherever the signal finds
    the rank. With halo exchanges, one rank may be inside a layer's exchange, waiting for a peer,
    while the peer runs the handler, whose checkpoint gathers every rank's halo state
    (:class:`HaloStateCallback`) and waits for the first rank: neither moves until the
    collective timeout. So while training runs, this callback's handler only records the signal.
    At the end of every training batch the ranks all-reduce whether any of them got it, and if
    one did, every rank runs Lightning's handler at that same point: the checkpoint holds a
    finished step and the halo state after it, rank 0 requeues the job, and this job stops at
    the end of the epoch. The requeued job resumes from the checkpoint by itself (Lightning
    picks ``hpc_ckpt_*.ckpt`` from ``default_root_dir`` when ``ckpt_path`` is not given), as
    exactly as any resume (docs/slurm.md#preemption-and-elastic-restarts).

    :class:`HaloQuantStrategy` adds this callback where Lightning auto-requeues on SLURM with
    more than one process; the all-reduce costs one scalar per step there and nothing elsewhere.

    Example:
        >>> HaloRequeue().pending
        False
    """

    def __init__(self) -> None:
        self._lightning: Optional[Handler] = None  # Lightning's handler, run at the agreed step
        self._signum: Optional[int] = None
        #: Whether this rank received the requeue signal since the last step's agreement.
        self.pending = False

    @staticmethod
    def applies(trainer: pl.Trainer) -> bool:
        """Whether Lightning requeues this run on a signal (SLURM with ``auto_requeue``) with several processes."""
        env = getattr(trainer.strategy, "cluster_environment", None)
        return isinstance(env, SLURMEnvironment) and env.auto_requeue and trainer.world_size > 1

    def _record(self, signum: int, frame: Any) -> None:
        self.pending = True

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning registered its handlers just before training; take over the requeue signal's.
        env = trainer.strategy.cluster_environment
        signum = getattr(env, "requeue_signal", None) or signal.SIGUSR1
        current = signal.getsignal(signum)
        if callable(current) and current != self._record:
            self._lightning, self._signum = current, int(signum)
            signal.signal(signum, self._record)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._lightning is None:
            return
        flag = torch.tensor([1.0 if self.pending else 0.0], device=trainer.strategy.root_device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # the default group: every rank, at this step
        if flag.item() == 0:
            return
        self.pending = False
        rank_zero_info(f"lightning-halo: requeue signal received; checkpointing after step {trainer.global_step} on every rank")
        self._lightning(self._signum, None)  # Lightning's: HPC checkpoint (all ranks), `scontrol requeue` (rank 0)
        trainer.should_stop = True  # the job is requeued: no further epoch here

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore()

    def _restore(self) -> None:
        if self._signum is not None and signal.getsignal(self._signum) == self._record:
            signal.signal(self._signum, self._lightning)
        self._lightning, self._signum = None, None
