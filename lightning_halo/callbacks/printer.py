"""EpochPrinter: one line per training epoch on rank 0, for runs without a progress bar."""

from __future__ import annotations

import math
import time

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override


def format_epoch_line(epoch: int, seconds: float, metrics: dict[str, float]) -> str:
    """The line :class:`EpochPrinter` prints: epoch, wall time, then each metric as ``name value``.

    Example:
        >>> format_epoch_line(3, 0.52, {"train_loss": 0.81234, "val_acc": 0.7, "halo/MB": 0.14})
        'epoch 3  0.52 s  train_loss 0.8123  val_acc 0.7000  halo/MB 0.1400'
    """
    parts = [f"epoch {epoch}", f"{seconds:.2f} s"]
    for name, value in metrics.items():
        parts.append(f"{name} {value:.4f}" if math.isfinite(value) and abs(value) < 1e4 else f"{name} {value:.4g}")
    return "  ".join(parts)


class EpochPrinter(Callback):
    r"""Prints one line per training epoch on rank 0 when the Trainer has no progress bar.

    The line holds the epoch, its wall time (training and validation) and the metrics the
    progress bar would show (those logged with ``prog_bar=True``: ``train_loss``, ``val_acc``,
    ``halo/MB``, ``halo/staleness``, ...). With a progress bar it prints nothing, so it can stay
    in every configuration; the ``lightning-halo`` command adds it itself. Lines go through
    Lightning's ``rank_zero_info``, like the traffic summary.

    Args:
        always (bool, optional): print even when there is a progress bar. (default: ``False``)

    Example:
        >>> trainer = L.Trainer(strategy=HaloQuantStrategy(bits=32), devices=2,
        ...                     enable_progress_bar=False, callbacks=[EpochPrinter()])
        >>> trainer.fit(model, datamodule=dm)  # doctest: +SKIP
        epoch 0  1.93 s  train_loss 1.9460  val_acc 0.3160  halo/MB 0.1399
    """

    def __init__(self, always: bool = False) -> None:
        self.always = always
        self._start = 0.0

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.perf_counter()

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.progress_bar_callback is not None and not self.always:
            return
        # Read the metrics on every rank: computing epoch values may sync them (sync_dist, Metric
        # objects), a collective that all ranks must enter, not only the one that prints.
        metrics = {name: float(value) for name, value in trainer.progress_bar_metrics.items() if name != "v_num"}
        rank_zero_info(format_epoch_line(trainer.current_epoch, time.perf_counter() - self._start, metrics))
