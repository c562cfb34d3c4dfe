"""Hands the monitored validation metric of ``HaloQuantStrategy(bits="adaptive", bit_monitor=...)`` to the exchange.

The strategy adds :class:`HaloBitMonitor` at the front of the Trainer's callbacks when ``bit_monitor`` is set:
its ``on_validation_end`` then runs before a ``ModelCheckpoint`` saving at the same hook, so a checkpoint
holds the value this validation gave (it is agreed over the ranks at the next epoch's start,
:meth:`~lightning_halo.exchange.slots.SlotTable.decide_widths`), and a resumed run widens when the
uninterrupted one did.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override


class HaloBitMonitor(pl.Callback):
    """After each validation of a fit: the value of ``monitor`` on this rank, to ``exchanger.observe_progress``.

    Args:
        monitor (str): the metric's name in ``trainer.callback_metrics``.
        exchanger: the strategy's :class:`~lightning_halo.exchange.exchanger.HaloExchanger`.
    """

    def __init__(self, monitor: str, exchanger: Any) -> None:
        self.monitor, self._exchanger = monitor, exchanger

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            raise ValueError(f"bit_monitor={self.monitor!r} was not logged in validation; the module logs "
                             f"{sorted(metrics)}. Log it in validation_step (self.log({self.monitor!r}, ...)) or "
                             "name one of these.")  # fmt: skip
        self._exchanger.observe_progress(float(metrics[self.monitor]))
