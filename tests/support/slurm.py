"""Callbacks for the SLURM testbed's jobs (they import this module through ``PYTHONPATH``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import lightning.pytorch as pl


class SlowSteps(pl.Callback):
    """Marks the start of every training step in ``marker_dir`` (``epoch<E>.rank<R>``, appending
    ``<the job's restart count>:<pid>``), then sleeps ``seconds``: a test can aim a signal at a step."""

    def __init__(self, marker_dir: str, seconds: float = 1.0) -> None:
        self.marker_dir, self.seconds = Path(marker_dir), seconds

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        with open(self.marker_dir / f"epoch{trainer.current_epoch}.rank{trainer.global_rank}", "a") as f:
            f.write(f"{os.environ.get('SLURM_RESTART_COUNT', '0')}:{os.getpid()}\n")
        time.sleep(self.seconds)
