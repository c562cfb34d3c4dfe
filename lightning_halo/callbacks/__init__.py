"""Lightning callbacks: the halo schedule, traffic logging, checkpoint state, a per-epoch line, a prediction writer, SLURM requeue."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_halo._lazy import lazy_module_attributes

__getattr__, __dir__, __all__ = lazy_module_attributes(
    __name__,
    {
        "lightning_halo.callbacks.predictions": ["HaloPredictionWriter"],
        "lightning_halo.callbacks.printer": ["EpochPrinter"],
        "lightning_halo.callbacks.requeue": ["HaloRequeue"],
        "lightning_halo.callbacks.schedule": ["HaloSchedule"],
        "lightning_halo.callbacks.state": ["HaloStateCallback"],
        "lightning_halo.callbacks.traffic": ["HaloTrafficLogger"],
    },
)

if TYPE_CHECKING:
    from lightning_halo.callbacks.predictions import HaloPredictionWriter
    from lightning_halo.callbacks.printer import EpochPrinter
    from lightning_halo.callbacks.requeue import HaloRequeue
    from lightning_halo.callbacks.schedule import HaloSchedule
    from lightning_halo.callbacks.state import HaloStateCallback
    from lightning_halo.callbacks.traffic import HaloTrafficLogger
