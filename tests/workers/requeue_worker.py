"""Worker for the requeue tests: Lightning's SLURM requeue path, on local ranks that SLURM's variables describe.

    python tests/workers/requeue_worker.py --out DIR --phase full|signalled|requeued [--signal-epoch E --signal-rank R] [--exact]

Every phase trains a dropout-free APPNP in float64, pipelined 1-bit halos with ``sync_every=3``
(stale rows, pending gradients and codec generators: the halo state a resume must restore;
``--exact``: 32-bit sync), with
``default_root_dir=DIR/run`` (``full``: ``DIR/full``). ``signalled``: rank R sends itself
SIGUSR1 at the start of epoch E's step, as ``scancel --signal=USR1`` would, and ``scontrol`` is a
fake that records its arguments in DIR/scontrol.txt. ``requeued`` is the job SLURM starts again:
the same command, ``ckpt_path`` left to Lightning. Each phase writes DIR/<phase>/rank<r>.pt
(final parameters, the epochs trained, the steps done).
"""

from __future__ import annotations

import argparse
import os
import signal
import warnings
from pathlib import Path

import lightning as L
import torch

from lightning_halo import HaloDataModule, HaloQuantStrategy, HaloSchedule
from tests.support.exit import shutdown
from tests.support.graphs import awkward_graph
from tests.support.lightning_models import APPNPNet

EPOCHS = 6


class Signal(L.Callback):
    """Rank ``rank`` sends itself the requeue signal at the start of epoch ``epoch``'s step."""

    def __init__(self, epoch: int, rank: int) -> None:
        self.epoch, self.rank = epoch, rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.current_epoch == self.epoch and trainer.global_rank == self.rank:
            os.kill(os.getpid(), signal.SIGUSR1)


class Epochs(L.Callback):
    def __init__(self) -> None:
        self.epochs: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.epochs.append(trainer.current_epoch)


def as_slurm_task(out: Path) -> None:
    """SLURM's variables for this rank (one node, ``srun --ntasks=WORLD_SIZE``), and a fake ``scontrol``."""
    rank, world = os.environ["RANK"], os.environ["WORLD_SIZE"]
    os.environ.update(SLURM_NTASKS=world, SLURM_NTASKS_PER_NODE=world, SLURM_PROCID=rank, SLURM_LOCALID=rank,
                      SLURM_NODEID="0", SLURM_JOB_ID="4242", SLURM_JOB_NAME="halo-requeue", SLURM_NODELIST="localhost")  # fmt: skip
    bin_dir = out / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    fake = bin_dir / "scontrol"
    if not fake.exists() and rank == "0":
        fake.write_text(f'#!/bin/sh\necho "$@" >> {out / "scontrol.txt"}\n')
        fake.chmod(0o755)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--phase", choices=["full", "signalled", "requeued"], required=True)
    parser.add_argument("--signal-epoch", type=int, default=2)
    parser.add_argument("--signal-rank", type=int, default=1)
    parser.add_argument("--exact", action="store_true", help="bits=32, sync (default: 1-bit pipelined, sync_every=3)")
    args = parser.parse_args()
    out = Path(args.out)
    rank = int(os.environ["RANK"])
    warnings.filterwarnings("ignore", message=".*(does not have many workers|GPU available|srun).*")
    as_slurm_task(out)
    L.seed_everything(0)
    dm = HaloDataModule(awkward_graph(1), cache_dir=str(out / "cache"))
    model = APPNPNet(dm.num_features, 16, dm.num_classes, k=2, dropout=0.0).double()
    epochs = Epochs()
    callbacks = [epochs] if args.exact else [HaloSchedule(mode="pipelined", sync_every=3), epochs]
    if args.phase == "signalled":
        callbacks.append(Signal(args.signal_epoch, args.signal_rank))
    trainer = L.Trainer(
        strategy=HaloQuantStrategy(bits=32 if args.exact else 1, seed=1), accelerator="cpu", devices=int(os.environ["WORLD_SIZE"]),
        max_epochs=EPOCHS, num_sanity_val_steps=0, limit_val_batches=0, enable_progress_bar=False,
        enable_model_summary=False, logger=False, enable_checkpointing=False, callbacks=callbacks,
        default_root_dir=str(out / ("full" if args.phase == "full" else "run")),
    )  # fmt: skip
    trainer.fit(model, datamodule=dm)
    target = out / args.phase
    target.mkdir(parents=True, exist_ok=True)
    torch.save({"params": {k: v.detach().clone() for k, v in model.state_dict().items()}, "epochs": epochs.epochs,
                "global_step": trainer.global_step}, target / f"rank{rank}.pt")  # fmt: skip


if __name__ == "__main__":
    main()
    shutdown()
