"""HaloSchedule: sync, pipelined (bounded staleness) and periodic halo exchange, per epoch."""

from __future__ import annotations

from typing import Any, Literal, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_halo.callbacks.reduced import log_reduced
from lightning_halo.exchange import StepMode, check_smoothing

Mode = Literal["sync", "pipelined", "periodic"]
_MODE_CODE = {"sync": 0, "stale": 1, "reuse": 2}


class HaloSchedule(Callback):
    r"""Chooses, every epoch, how training halos travel (validation and test are always fresh).

    * ``mode="sync"``: fresh halo rows for every layer, every epoch (exact at ``bits=32``).
    * ``mode="pipelined"``: each layer uses the halo rows received during the previous epoch
      while this epoch's boundary rows travel asynchronously, overlapped with the computation
      that follows; halo gradients computed in this epoch's backward are applied by their
      owners in the next epoch's backward (`PipeGCN <https://arxiv.org/abs/2203.10428>`_,
      Sylvie's asynchronous mode). ``sync_every=k`` makes every k-th epoch fully synchronous
      (Sylvie's bounded-staleness adaptor) to stop stale errors from accumulating.
    * ``mode="periodic"``: a synchronous refresh every ``refresh_every`` epochs; in between,
      layers reuse the refreshed rows with no traffic at all and no gradient crosses
      partitions (`DIGEST <https://arxiv.org/abs/2206.00057>`_-style stale representations).

    The first epoch and ``warmup_epochs`` are synchronous. ``smoothing=m`` replaces received
    stale rows and gradients by the moving average :math:`m\,\text{old} + (1-m)\,\text{new}`
    (PipeGCN's smoothing). The decision depends on the epoch number only, so every rank issues
    the same collectives. Logged each epoch: ``halo/mode`` (0 sync, 1 pipelined, 2 reuse),
    ``halo/staleness`` (largest, also on the progress bar) and ``halo/staleness/<layer>``.

    Args:
        mode (str, optional): ``"sync"``, ``"pipelined"`` or ``"periodic"``. (default: ``"sync"``)
        sync_every (int, optional): pipelined only: every k-th epoch is synchronous.
            (default: ``None``, never)
        refresh_every (int, optional): periodic only: epochs between refreshes. (default: ``10``)
        smoothing (float, optional): moving-average factor in ``[0, 1)`` for stale rows and
            gradients; ``0`` is off. (default: ``0.0``)
        warmup_epochs (int, optional): synchronous epochs before the mode starts. (default: ``0``)

    Example:
        >>> trainer = L.Trainer(strategy=HaloQuantStrategy(bits=1), devices=2,
        ...                     callbacks=[HaloSchedule(mode="pipelined", sync_every=5)])
    """

    def __init__(
        self,
        mode: Mode = "sync",
        sync_every: Optional[int] = None,
        refresh_every: int = 10,
        smoothing: float = 0.0,
        warmup_epochs: int = 0,
    ) -> None:
        if mode not in ("sync", "pipelined", "periodic"):
            raise ValueError(f"unknown mode {mode!r}; choose 'sync', 'pipelined' or 'periodic'")
        if sync_every is not None and (not isinstance(sync_every, int) or sync_every < 1):
            raise ValueError(f"sync_every must be a positive integer or None, got {sync_every!r}")
        if not isinstance(refresh_every, int) or refresh_every < 1:
            raise ValueError(f"refresh_every must be a positive integer, got {refresh_every!r}")
        check_smoothing(smoothing)
        if not isinstance(warmup_epochs, int) or warmup_epochs < 0:
            raise ValueError(f"warmup_epochs must be a non-negative integer, got {warmup_epochs!r}")
        if sync_every is not None and mode != "pipelined":
            raise ValueError("sync_every applies to mode='pipelined' only")
        self.mode = mode
        self.sync_every = sync_every
        self.refresh_every = refresh_every
        self.smoothing = smoothing
        self.warmup_epochs = warmup_epochs

    def step_mode(self, epoch: int) -> StepMode:
        """What a training epoch does with halos (a pure function of the epoch number).

        Example:
            >>> tuple(HaloSchedule("pipelined", sync_every=3).step_mode(e) for e in range(5))
            ('sync', 'stale', 'stale', 'sync', 'stale')
        """
        start = max(1, self.warmup_epochs)
        if self.mode == "sync" or epoch < start:
            return "sync"
        if self.mode == "pipelined":
            return "sync" if self.sync_every is not None and epoch % self.sync_every == 0 else "stale"
        return "sync" if (epoch - start) % self.refresh_every == 0 else "reuse"

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if getattr(trainer.strategy, "exchanger", None) is None:
            raise TypeError(
                f"HaloSchedule needs strategy=HaloQuantStrategy(...), got {type(trainer.strategy).__name__}"
            )

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        ex = trainer.strategy.exchanger  # type: ignore[attr-defined]
        stale = ex.staleness()
        # The same on every rank (decided by the epoch number): nothing to reduce across ranks.
        log_reduced(pl_module, {"halo/mode": _MODE_CODE[ex.mode]}, reduce_fx="max")
        log_reduced(pl_module, {"halo/staleness": max(stale, default=0)}, reduce_fx="max", prog_bar=True)
        log_reduced(pl_module, {f"halo/staleness/{layer}": v for layer, v in zip(ex.slot_layers(), stale)}, reduce_fx="max")

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "sync_every": self.sync_every,
            "refresh_every": self.refresh_every,
            "smoothing": self.smoothing,
            "warmup_epochs": self.warmup_epochs,
        }
