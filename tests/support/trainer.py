"""A quiet Trainer for the worker scripts (no progress bar, logger, checkpoints or sanity check)."""

from __future__ import annotations

from typing import Any

import lightning as L

from tests.support.device import ACCELERATOR


def quiet_trainer(world_size: int, **kwargs: Any) -> L.Trainer:
    options: dict[str, Any] = dict(
        accelerator=ACCELERATOR,
        devices=world_size,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    options.update(kwargs)
    return L.Trainer(**options)


class _FakeStrategy:
    root_device = None

    def __init__(self) -> None:
        import torch

        self.root_device = torch.device("cpu")


class FakeTrainer:
    """The few attributes ``HaloDataModule`` reads from its Trainer: run it as rank ``rank`` of ``world_size``."""

    def __init__(self, world_size: int, rank: int = 0) -> None:
        self.world_size, self.global_rank = world_size, rank
        self.current_epoch = 0
        self.strategy = _FakeStrategy()
        self.logger = None
