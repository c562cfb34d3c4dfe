"""Epoch metrics reduced across ranks in one collective, then logged as they are.

Lightning reduces every ``self.log(..., sync_dist=True)`` key with a collective of its own at
the end of the epoch: the traffic logger's 7 keys and the schedule's 2 + one per layer were
10 or more small collectives per epoch, each a network round trip, while a full-graph epoch
is one training step. The halo callbacks reduce all their values in one collective (or know
them to be equal on every rank) and log the result with ``sync_dist=False``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.utilities.warnings import PossibleUserWarning

# Lightning warns for epoch-level values logged without sync_dist; these are already reduced.
# Installed once here, not per log call: every filterwarnings call resets the warning caches.
warnings.filterwarnings("ignore", message=r"It is recommended to use `self\.log\('halo/", category=PossibleUserWarning)


def all_ranks(trainer: pl.Trainer, local: torch.Tensor) -> torch.Tensor:
    """Every rank's 1-d ``local``, stacked ``[world_size, n]`` on the CPU, in one collective.

    Example:
        >>> all_ranks(L.Trainer(devices=1, logger=False), torch.tensor([1.0, 2.0]))
        tensor([[1., 2.]])
    """
    if trainer.world_size == 1 or not dist.is_initialized():
        return local.reshape(1, -1)
    # torch's own all_gather: Lightning's goes through a deprecated torch function that warns
    mine = local.to(trainer.strategy.root_device)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    return torch.stack(rows).cpu()


def log_reduced(pl_module: pl.LightningModule, values: Mapping[str, float], reduce_fx: str, **kwargs: Any) -> None:
    """Log epoch-level ``halo/...`` values that are already the same on every rank.

    ``reduce_fx`` combines the steps of one epoch (one step with :class:`HaloDataModule`).
    """
    for key, value in values.items():
        pl_module.log(key, float(value), on_step=False, on_epoch=True, reduce_fx=reduce_fx, sync_dist=False,
                      batch_size=1, **kwargs)  # fmt: skip
