"""Lightning callbacks: the halo schedule, traffic logging and checkpoint state."""

from lightning_halo.callbacks.schedule import HaloSchedule
from lightning_halo.callbacks.state import HaloStateCallback
from lightning_halo.callbacks.traffic import HaloTrafficLogger

__all__ = ["HaloSchedule", "HaloStateCallback", "HaloTrafficLogger"]
