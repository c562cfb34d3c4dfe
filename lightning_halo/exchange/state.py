r"""The state of a rank's exchange that checkpoints: what a resumed run needs to continue bitwise.

Stale rows and pending gradients (the slots), the stochastic-rounding generators and the
traffic totals differ per rank and live across epochs. :class:`ExchangeState` owns the
generators, and writes and restores all of it; the plans' shapes are recorded so that a
checkpoint of another partitioning is refused instead of silently misread.
:class:`~lightning_halo.HaloStateCallback` puts every rank's state into Lightning's
checkpoints.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from lightning_halo.exchange.meter import TrafficMeter
from lightning_halo.exchange.plan import Direction, ExchangePlan
from lightning_halo.exchange.slots import SlotTable
from lightning_halo.exchange.wire import HaloExchangeError

Plans = Mapping[Direction, ExchangePlan]


def _seed(base: int) -> int:
    return base & 0x7FFF_FFFF_FFFF_FFFF


def _foreign_checkpoint(want: tuple[int, int], plan: ExchangePlan) -> HaloExchangeError:
    return HaloExchangeError(
        f"rank {plan.rank}: the checkpoint's halo state belongs to a different partition "
        f"({want[0]} halo rows, {want[1]} sent rows; this partition has {plan.n_halo} and "
        f"{plan.num_send}). Resume with the same graph, partitioner settings and number of processes."
    )


class ExchangeState:
    r"""A rank's checkpointed exchange state: generators, slots, traffic totals, plan shapes.

    The generators are seeded from ``seed`` and the rank at the first bind (training and
    evaluation draw from separate streams, so how often you validate does not change the
    training codes). A restored state waits for the partition: it is applied at the next
    :meth:`bound` (or at once, if a partition is bound), and a plan built later (the reversed
    edges') is checked when it is :meth:`added`.

    Args:
        seed (int): the base seed of the stochastic rounding.
        slots (SlotTable): the training slots.
        meter (TrafficMeter): the traffic meter (its totals are restored).
    """

    def __init__(self, seed: int, slots: SlotTable, meter: TrafficMeter) -> None:
        self.seed = seed
        self.slots, self.meter = slots, meter
        self.train_generator = torch.Generator()
        self.eval_generator = torch.Generator()
        self._seeded = False
        self._plans: Optional[Plans] = None
        self._restored: Optional[dict[str, Any]] = None
        self._restored_shapes: dict[str, tuple[int, int]] = {}

    def _seed_eval(self, rank: int) -> None:
        self.eval_generator.manual_seed(_seed(self.seed * 1_000_003 + rank + 7919))

    def bound(self, plans: Plans) -> None:
        """A partition was bound: seed the generators (once) and apply a restored state."""
        self._plans = plans
        if not self._seeded:  # once per exchange (or never, when restored from a checkpoint)
            rank = plans["in"].rank
            self.train_generator.manual_seed(_seed(self.seed * 1_000_003 + rank))
            self._seed_eval(rank)
            self._seeded = True
        self._apply()

    def added(self, direction: Direction, plan: ExchangePlan) -> None:
        """A further plan of the bound partition was built: it must match the restored one's shape."""
        want = self._restored_shapes.pop(direction, None)
        if want is not None and want != (plan.n_halo, plan.num_send):
            raise _foreign_checkpoint(want, plan)

    def state_dict(self) -> dict[str, Any]:
        """This rank's state on CPU, after waiting for every exchange in flight (the end of the epoch)."""
        self.slots.flush()
        plans = self._plans or {}
        plan = plans.get("in")
        return {
            "generator": self.train_generator.get_state(),
            "slots": self.slots.state_dict(),
            "plateau": self.slots.plateau_state(),
            "meter_total": dict(self.meter.total),
            "meter_total_fp32": dict(self.meter.total_fp32),
            "rank": None if plan is None else plan.rank,
            "n_halo": None if plan is None else plan.n_halo,
            "num_send": None if plan is None else plan.num_send,
            "plans": {k: (p.n_halo, p.num_send) for k, p in plans.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the slots follow at the next :meth:`bound` (on its device)."""
        self._restored = state
        if not self._seeded:
            self._seed_eval(int(state.get("rank") or 0))
        self.train_generator.set_state(state["generator"])
        self._seeded = True
        self.meter.restore_totals(state.get("meter_total", {}), state.get("meter_total_fp32", {}))
        if self._plans is not None:
            self._apply()

    def _apply(self) -> None:
        state, self._restored = self._restored, None
        if state is None or self._plans is None:
            return
        plan = self._plans["in"]
        if state.get("n_halo") is not None and (state["n_halo"], state["num_send"]) != (plan.n_halo, plan.num_send):
            raise _foreign_checkpoint((state["n_halo"], state["num_send"]), plan)
        self._restored_shapes = {k: (int(v[0]), int(v[1])) for k, v in state.get("plans", {}).items() if k != "in"}
        for direction, built in self._plans.items():
            if direction != "in":
                self.added(direction, built)
        self.slots.load_state_dict(state["slots"], plan.send_index.device)
        self.slots.restore_plateau(state.get("plateau", {}))
