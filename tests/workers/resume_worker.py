"""Worker for resume tests: an uninterrupted run vs a run stopped and resumed from a checkpoint.

    python tests/workers/resume_worker.py --out DIR --phase full|first|second --modes sync pipelined:2 ...

Every phase runs each mode with the example GCN (dropout, bits=1) on Cora and writes
DIR/<phase>/<mode>/rank<r>.pt with the final parameters.
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
from tests.support.device import ACCELERATOR, ON_CUDA
from tests.support.exit import shutdown
from tests.support.lightning_models import MODELS
from tests.workers.parity_worker import _schedule

HALF, TOTAL = 3, 6


class Decisions(L.Callback):
    """An adaptive run's per-layer choices, epoch by epoch (``{}`` for the other modes), and with
    ``bits="adaptive"`` the widths of every epoch."""

    def __init__(self) -> None:
        self.epochs: dict[int, list[str]] = {}
        self.drifts: dict[int, list[float]] = {}
        self.widths: dict[int, dict] = {}
        self.values: dict[int, float] = {}  # val_acc after each epoch's validation, as the bit monitor reads it

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.strategy.exchanger.adaptive_bits:
            self.widths[trainer.current_epoch] = trainer.strategy.halo_widths()
        if trainer.strategy.exchanger.mode == "adaptive":
            self.epochs[trainer.current_epoch] = [d for d, _ in trainer.strategy.halo_decisions().values()]
            self.drifts[trainer.current_epoch] = [v for _, v in trainer.strategy.halo_decisions().values()]


    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and "val_acc" in trainer.callback_metrics:
            self.values[trainer.current_epoch] = float(trainer.callback_metrics["val_acc"])


def _monitor(spec: str | None) -> dict:
    if spec is None:
        return {}
    metric, mode, patience = spec.split(":")
    return {"bit_monitor": metric, "bit_mode": mode, "bit_patience": int(patience)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--phase", choices=["full", "first", "second"], required=True)
    parser.add_argument("--modes", nargs="+", required=True)
    parser.add_argument("--bits", type=lambda v: v if v == "adaptive" else int(v), default=1, help="N or adaptive")
    parser.add_argument("--model", choices=sorted(MODELS), default="gcn")
    parser.add_argument("--bit-monitor", default=None, help="METRIC:MODE:PATIENCE (bits='adaptive' widens on a plateau)")
    args = parser.parse_args()
    world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    warnings.filterwarnings("ignore")
    out = Path(args.out)
    for mode in args.modes:
        tag = mode.replace(":", "_")
        ckpt_dir = out / ("ckpt-full" if args.phase == "full" else "ckpt-split") / tag
        L.seed_everything(0)
        dm = HaloDataModule("cora", cache_dir=str(out / "cache"))
        model = MODELS[args.model](dm.num_features, 32, dm.num_classes)
        decisions = Decisions()
        trainer = L.Trainer(
            strategy=HaloQuantStrategy(bits=args.bits, seed=1, **_monitor(args.bit_monitor)),
            accelerator=ACCELERATOR,
            devices=world_size,
            deterministic=ON_CUDA or None,  # CUDA's scatter-add is atomic: order varies run to run
            max_epochs=HALF if args.phase == "first" else TOTAL,
            num_sanity_val_steps=1,
            enable_progress_bar=False,
            enable_model_summary=False,
            logger=False,
            callbacks=[*_schedule(mode), ModelCheckpoint(dirpath=ckpt_dir, save_last=True, every_n_epochs=1), decisions],
        )
        trainer.fit(model, datamodule=dm, ckpt_path="last" if args.phase == "second" else None)
        target = out / args.phase / args.model / tag
        target.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, target / f"rank{rank}.pt")
        torch.save(decisions.epochs, target / f"decisions{rank}.pt")
        torch.save(decisions.drifts, target / f"drifts{rank}.pt")
        torch.save(decisions.widths, target / f"widths{rank}.pt")
        torch.save(decisions.values, target / f"values{rank}.pt")


if __name__ == "__main__":
    main()
    shutdown()
