"""Lightning callbacks: traffic logging (added by the strategy) and the halo schedule."""

from lightning_halo.callbacks.traffic import HaloTrafficLogger

__all__ = ["HaloTrafficLogger"]
