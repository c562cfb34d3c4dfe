"""HaloSchedule: sync, pipelined (bounded staleness), periodic and adaptive halo exchange, per epoch."""

from __future__ import annotations

from typing import Any, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_halo.callbacks.reduced import log_reduced
from lightning_halo.exchange.policy import MODES, HaloPolicy, Mode


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
    * ``mode="adaptive"``: per layer and epoch, pipelined (stale by one epoch, forward and
      backward) while the rows the layer sends changed by at most ``drift_threshold`` (relative,
      Frobenius) in the previous epoch, synchronous when they drift; each rank measures its own
      sent rows before quantization and one tiny all-reduce of the per-layer maxima at the
      epoch's start makes every rank take the same decision (staleness bounded by measured
      change, as in `Sancus <https://doi.org/10.24963/ijcai.2023/724>`_). ``sync_every`` applies.

    The first epoch and ``warmup_epochs`` are synchronous. ``smoothing=m`` replaces received
    stale rows and gradients by the moving average :math:`m\,\text{old} + (1-m)\,\text{new}`
    (PipeGCN's smoothing). The decision depends on the epoch number only, so every rank issues
    the same collectives. The options are checked once, here, into a
    :class:`~lightning_halo.exchange.policy.HaloPolicy` that the schedule hands to the strategy
    at setup. Logged each epoch: ``halo/mode`` (0 sync, 1 pipelined, 2 periodic, 3 adaptive),
    ``halo/staleness`` (largest, also on the progress bar) and ``halo/staleness/<layer>``; in an
    adaptive run also ``halo/stale_layers`` and ``halo/sync_layers`` (this epoch's decisions)
    and ``halo/drift/<layer>`` (the agreed drift behind each).

    Args:
        mode (str, optional): ``"sync"``, ``"pipelined"``, ``"periodic"`` or ``"adaptive"``. (default: ``"sync"``)
        sync_every (int, optional): pipelined and adaptive: every k-th epoch is synchronous.
            (default: ``None``, never)
        refresh_every (int, optional): periodic only: epochs between refreshes. (default: ``10``)
        smoothing (float, optional): moving-average factor in ``[0, 1)`` for stale rows and
            gradients; ``0`` is off. (default: ``0.0``)
        warmup_epochs (int, optional): synchronous epochs before the mode starts. (default: ``0``)
        drift_threshold (float, optional): adaptive only: the largest relative change of a layer's
            sent rows in the last epoch that lets it run stale in the next; ``None`` is
            :data:`~lightning_halo.exchange.policy.DRIFT_THRESHOLD` (0.1).

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
        drift_threshold: Optional[float] = None,
    ) -> None:
        #: The schedule's options, checked.
        self.policy = HaloPolicy(mode, sync_every, refresh_every, smoothing, warmup_epochs, drift_threshold)

    @property
    def mode(self) -> Mode:
        return self.policy.mode

    @property
    def smoothing(self) -> float:
        return self.policy.smoothing

    def step_mode(self, epoch: int) -> Mode:
        """What a training epoch does with halos (a pure function of the epoch number).

        Example:
            >>> tuple(HaloSchedule("pipelined", sync_every=3).step_mode(e) for e in range(5))
            ('sync', 'pipelined', 'pipelined', 'sync', 'pipelined')
        """
        return self.policy.mode_at(epoch)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        use_policy = getattr(trainer.strategy, "use_policy", None)
        if use_policy is None:
            raise TypeError(
                f"HaloSchedule needs strategy=HaloQuantStrategy(...), got {type(trainer.strategy).__name__}"
            )
        use_policy(self.policy)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stale = trainer.strategy.staleness()  # type: ignore[attr-defined]
        # The same on every rank (decided by the epoch number): nothing to reduce across ranks.
        mode = self.policy.mode_at(trainer.current_epoch)
        log_reduced(pl_module, {"halo/mode": MODES.index(mode)}, reduce_fx="max")
        log_reduced(pl_module, {"halo/staleness": max(stale.values(), default=0)}, reduce_fx="max", prog_bar=True)
        log_reduced(pl_module, {f"halo/staleness/{layer}": v for layer, v in stale.items()}, reduce_fx="max")
        if mode == "adaptive":  # every rank agreed on these (SlotTable.decide): nothing to reduce either
            decided = trainer.strategy.halo_decisions()  # type: ignore[attr-defined]
            stale_layers = sum(d == "pipelined" for d, _ in decided.values())
            counts = {"halo/stale_layers": stale_layers, "halo/sync_layers": len(decided) - stale_layers}
            log_reduced(pl_module, counts, reduce_fx="max")
            log_reduced(pl_module, {f"halo/drift/{layer}": v for layer, (_, v) in decided.items()}, reduce_fx="max")

    @override
    def state_dict(self) -> dict[str, Any]:
        p = self.policy
        return {
            "mode": p.mode,
            "sync_every": p.sync_every,
            "refresh_every": p.refresh_every,
            "smoothing": p.smoothing,
            "warmup_epochs": p.warmup_epochs,
            "drift_threshold": p.drift_threshold,
        }
