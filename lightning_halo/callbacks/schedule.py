"""HaloSchedule: sync, pipelined (bounded staleness), periodic and adaptive halo exchange, per epoch."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_halo.callbacks.reduced import log_reduced
from lightning_halo.exchange.policy import MODES, SYNC, HaloPolicy, Mode

#: Where checkpoints keep a schedule's options (fixed, so that a subclass finds them too).
STATE_KEY = "HaloSchedule"


def _described(policy: Optional[HaloPolicy]) -> str:
    """``HaloSchedule(mode='pipelined', sync_every=2)``: the options that differ from the defaults."""
    if policy is None:
        return "no HaloSchedule (every epoch sync)"
    default = HaloPolicy()
    args = [f"mode={policy.mode!r}"] + [
        f"{f.name}={getattr(policy, f.name)!r}"
        for f in dataclasses.fields(policy)
        if f.name != "mode" and getattr(policy, f.name) != getattr(default, f.name)
    ]
    return f"HaloSchedule({', '.join(args)})"


def check_resume(saved: Optional[HaloPolicy], current: Optional[HaloPolicy]) -> None:
    """Refuse to continue training from a checkpoint written under schedule ``saved`` with ``current``.

    ``None`` stands for no :class:`HaloSchedule` (every epoch ``"sync"``). Any option that
    differs is refused: each one changes which rows and gradients an epoch uses, so the resumed
    run would not continue the checkpointed one (and a checkpoint's stale rows and pending
    gradients are those of its schedule). The message names every difference and both ways on.

    Example:
        >>> check_resume(HaloPolicy("pipelined", sync_every=2), HaloPolicy("pipelined", sync_every=2))
        >>> check_resume(None, SYNC)  # no schedule is every epoch sync
    """
    old, new = saved or SYNC, current or SYNC
    changes = [
        f"{f.name}: {getattr(old, f.name)!r} -> {getattr(new, f.name)!r}"
        for f in dataclasses.fields(old)
        if getattr(old, f.name) != getattr(new, f.name)
    ]
    if not changes:
        return
    written = "without a HaloSchedule (every epoch sync)" if saved is None else f"with {_described(saved)}"
    raise ValueError(
        f"cannot resume: the checkpoint was written {written}, but this run has {_described(current)} "
        f"({'; '.join(changes)}). A resumed run continues the checkpointed one (stale rows, pending gradients and "
        f"all) only with the same schedule: pass {_described(saved) if saved is not None else 'no HaloSchedule'}. "
        "To train on with the new schedule on purpose (e.g. in sync after a pipelined run diverged), pass "
        "HaloSchedule(..., allow_resume_change=True): the restored rows and gradients are then used as the new "
        "schedule finds them (a sync epoch replaces them, as a sync_every epoch does)."
    )


class HaloSchedule(Callback):
    r"""Chooses, every epoch, how training halos travel (validation and test are always fresh).

    The modes (``"sync"``, ``"pipelined"``, ``"periodic"``, ``"adaptive"``) and what each one's
    forward uses, backward applies, sends and guarantees are defined once, in
    :data:`~lightning_halo.exchange.policy.MODE_TABLE` (the table of the docs' "Choosing a halo
    mode" page is generated from it). The first epoch and ``warmup_epochs`` are synchronous. The
    decision depends on the epoch number only, so every rank issues the same collectives. The
    options are checked once, here, into a :class:`~lightning_halo.exchange.policy.HaloPolicy`
    that the schedule hands to the strategy at setup. Logged each epoch: ``halo/mode`` (0 sync,
    1 pipelined, 2 periodic, 3 adaptive), ``halo/staleness`` (largest, also on the progress bar)
    and ``halo/staleness/<layer>``; in an adaptive run also ``halo/stale_layers`` and
    ``halo/sync_layers`` (this epoch's decisions), ``halo/drift/<layer>`` (the agreed drift
    behind each) and ``halo/wait/<layer>`` (the agreed share of the step its synchronous exchanges
    waited, with ``wait_threshold > 0``).

    Checkpoints record the schedule. Training resumed from one (``ckpt_path``) must use the same
    schedule, or, if the checkpoint was written without one, none (or ``mode="sync"``): any other
    is refused with the differences, unless ``allow_resume_change=True``. Validation, test and
    prediction from a checkpoint do not train and accept any schedule.

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
        wait_threshold (float, optional): adaptive only: a layer runs stale only where its last
            synchronous exchanges waited at least this share of the training step on every rank (what a
            stale exchange can save); ``0``: the drift alone decides, and the decisions do not depend on
            measured times (a resumed run then decides bitwise as the uninterrupted one); ``None`` is
            :data:`~lightning_halo.exchange.policy.WAIT_THRESHOLD` (0.1).
        allow_resume_change (bool, optional): continue training from a checkpoint written with
            another schedule (the restored stale rows and gradients are used as this schedule
            finds them) instead of refusing. Not recorded. (default: ``False``)

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
        allow_resume_change: bool = False,
        wait_threshold: Optional[float] = None,
    ) -> None:
        #: The schedule's options, checked.
        self.policy = HaloPolicy(mode, sync_every, refresh_every, smoothing, warmup_epochs, drift_threshold, wait_threshold)
        self.allow_resume_change = bool(allow_resume_change)
        self._fitting = False

    @property
    @override
    def state_key(self) -> str:
        return STATE_KEY

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
        self._fitting = stage == "fit"  # only training resumed from a checkpoint is held to its schedule

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
            if self.policy.wait_bound:
                waits = trainer.strategy.halo_waits()  # type: ignore[attr-defined]
                log_reduced(pl_module, {f"halo/wait/{layer}": v for layer, v in waits.items()}, reduce_fx="max")

    @override
    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.policy)

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Training resumed from a checkpoint continues with its schedule: another is refused (:func:`check_resume`).

        (A checkpoint written without a schedule, or a run without one, is checked by
        :class:`~lightning_halo.HaloStateCallback`, which every halo run has.)
        """
        if self._fitting and not self.allow_resume_change:
            check_resume(HaloPolicy(**state_dict), self.policy)
