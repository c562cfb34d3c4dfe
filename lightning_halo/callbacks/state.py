"""Puts every rank's halo state into checkpoints, so a resumed run continues exactly."""

from __future__ import annotations

import random
from typing import Any, Optional

import lightning.pytorch as pl
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from lightning_halo.callbacks.schedule import STATE_KEY as SCHEDULE_KEY
from lightning_halo.callbacks.schedule import HaloSchedule, check_resume
from lightning_halo.exchange import ExchangeState
from lightning_halo.exchange.policy import HaloPolicy

#: Where checkpoints keep every rank's halo state.
STATE_KEY = "HaloStateCallback"


def _rng_state() -> dict[str, Any]:
    # Only tensors, ints, floats and strings: Lightning loads checkpoints with weights_only=True.
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)),
        "python": random.getstate(),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(state["python"])


class HaloStateCallback(Callback):
    r"""Saves and restores the per-rank state the halo exchange carries between epochs.

    Lightning writes checkpoints from rank 0 only, but stale halo rows, pending halo
    gradients, the stochastic-rounding generators and the RNG streams (dropout) differ per
    rank. While a checkpoint is assembled (on every rank), in-flight exchanges are completed
    and the ranks' states are gathered into it; on load each rank takes its own. Resuming
    after epoch :math:`t` with ``ckpt_path`` then continues bitwise like the uninterrupted
    run. :class:`HaloQuantStrategy` adds this callback itself.

    A checkpoint written by another number of processes resumes too: the weights, optimizer,
    schedulers, other callbacks and counters carry over (Lightning's), but the per-rank halo
    state belongs to the old partition, so it restarts as at epoch 0 (empty slots, freshly seeded
    generators) and the first resumed training epoch is sync (:attr:`sync_epoch`); one warning
    says so. A checkpoint of another graph (its fingerprint) is refused.

    It also holds a resumed run to the checkpoint's schedule where a :class:`HaloSchedule` is on
    one side only (a checkpoint of a pipelined run resumed without one, or of a run without one
    resumed with a pipelined one); where both have one, the schedule checks itself.

    Example:
        >>> trainer.fit(model, datamodule=dm, ckpt_path="last")  # doctest: +SKIP
    """

    @property
    @override
    def state_key(self) -> str:
        return STATE_KEY

    def __init__(self) -> None:
        self._state: Optional[ExchangeState] = None
        self._rank = 0
        self._world = 1
        self._graph: Optional[str] = None
        self._resized = False
        #: A training epoch that must be sync whatever the schedule (the first after a resize), or None.
        self.sync_epoch: Optional[int] = None

    def attach(self, state: ExchangeState, rank: int, world_size: int) -> None:
        """Checkpoint ``state`` (the strategy's exchange state) of rank ``rank`` of ``world_size``."""
        # No reference to the process group here: a group kept alive by a callback after the
        # strategy destroyed it would be torn down at interpreter exit, which aborts in gloo.
        self._state, self._rank, self._world = state, rank, world_size

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Before Lightning restores callback states: load_state_dict compares the graph.
        self._graph = getattr(getattr(trainer, "datamodule", None), "graph_fingerprint", None)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._resized:  # the halo state restarted: this epoch is sync, as epoch 0 of a run is
            self.sync_epoch, self._resized = trainer.current_epoch, False

    @override
    def state_dict(self) -> dict[str, Any]:
        if self._state is None:
            return {}
        mine = {"exchange": self._state.state_dict(), "rng": _rng_state()}
        states: list[Any] = [mine]
        if self._world > 1 and dist.is_available() and dist.is_initialized():
            states = [None] * self._world
            dist.all_gather_object(states, mine)  # the default group (its timeout is the strategy's `timeout`)
        return {"world_size": self._world, "ranks": states, "graph": self._graph}

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        states = checkpoint.get("callbacks") or {}
        if STATE_KEY not in states or trainer.state.fn != TrainerFn.FITTING:
            return  # not a halo run's checkpoint (nothing to continue), or nothing is trained
        saved = states.get(SCHEDULE_KEY)
        schedule = next((cb for cb in trainer.callbacks if isinstance(cb, HaloSchedule)), None)
        if saved is not None and schedule is not None:
            return  # the schedule checks itself (HaloSchedule.load_state_dict)
        if schedule is None or not schedule.allow_resume_change:
            check_resume(None if saved is None else HaloPolicy(**saved), None if schedule is None else schedule.policy)

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict or self._state is None:
            return
        saved_graph = state_dict.get("graph")
        if saved_graph is not None and self._graph is not None and saved_graph != self._graph:
            raise ValueError(
                f"the checkpoint was written for another graph (fingerprint {saved_graph}, this run's is "
                f"{self._graph}); resume with the graph it was trained on, or start a new run without ckpt_path."
            )
        saved = int(state_dict["world_size"])
        if saved != self._world:
            # The partition differs: stale rows, partial sums, drift and generator streams of the
            # old ranks mean nothing here. Restart them as at epoch 0 (a sync epoch first).
            self._resized = True
            rank_zero_warn(
                f"resuming a checkpoint written by {saved} processes with {self._world}: weights, optimizer, "
                "schedulers and counters carry over; the per-rank halo state (stale rows, partial sums, drift, "
                "quantizer and RNG streams) restarts as at epoch 0, and the first resumed epoch is sync."
            )
            return
        mine = state_dict["ranks"][self._rank]
        self._state.load_state_dict(mine["exchange"])
        _set_rng_state(mine["rng"])
