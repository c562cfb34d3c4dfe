"""Worker for resize tests: a run checkpointed at one process count and resumed at another.

    python tests/workers/resize_worker.py --out DIR --phase full|first|second [--mode pipelined:2 --bits 1]

Every phase trains a dropout-free APPNP in float64 on a small fixed graph and writes
DIR/<phase>/rank<r>.pt with the final parameters and the halo mode of each training epoch.
``first`` stops after HALF epochs (checkpoint in DIR/ckpt); ``second`` resumes it to TOTAL.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_halo import HaloDataModule, HaloQuantStrategy
from tests.support.exit import shutdown
from tests.support.graphs import awkward_graph
from tests.support.lightning_models import APPNPNet
from tests.workers.parity_worker import _schedule

HALF, TOTAL = 2, 4


class Modes(L.Callback):
    """The halo mode of each training epoch on this rank."""

    def __init__(self) -> None:
        self.epochs: dict[int, str] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.epochs[trainer.current_epoch] = trainer.strategy.exchanger.mode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--phase", choices=["full", "first", "second"], required=True)
    parser.add_argument("--mode", default="sync")
    parser.add_argument("--bits", type=int, default=32)
    args = parser.parse_args()
    world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    warnings.filterwarnings("ignore", message=".*(does not have many workers|GPU available).*")
    out = Path(args.out)
    L.seed_everything(0)
    data = awkward_graph(1)  # the same graph at every process count (world_size 1: no part-dependent mask)
    dm = HaloDataModule(data, cache_dir=str(out / "cache"))
    model = APPNPNet(dm.num_features, 16, dm.num_classes, k=2, dropout=0.0).double()
    modes = Modes()
    trainer = L.Trainer(
        strategy=HaloQuantStrategy(bits=args.bits, seed=1),
        accelerator="cpu",
        devices=world_size,
        max_epochs=HALF if args.phase == "first" else TOTAL,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        callbacks=[*_schedule(args.mode if args.mode != "sync" else ""), modes,
                   ModelCheckpoint(dirpath=out / "ckpt", save_last=True, every_n_epochs=1)],
    )  # fmt: skip
    trainer.fit(model, datamodule=dm, ckpt_path=str(out / "ckpt" / "last.ckpt") if args.phase == "second" else None)
    target = out / args.phase
    target.mkdir(parents=True, exist_ok=True)
    torch.save({"params": {k: v.detach().clone() for k, v in model.state_dict().items()}, "modes": modes.epochs},
               target / f"rank{rank}.pt")  # fmt: skip


if __name__ == "__main__":
    main()
    shutdown()
