r"""How training halos travel, epoch by epoch: the modes, their options, and the pure schedule.

One vocabulary, from the user's option to the slot that carries a halo: the modes ``"sync"``,
``"pipelined"``, ``"periodic"`` and ``"adaptive"`` (:data:`MODES`), each defined once, in
:data:`MODE_TABLE`: what its forward uses, what its backward applies, when it sends and what it
guarantees, and the method it follows. The docs' table of the modes is generated from it
(``python tools/gen_docs.py``).

:class:`HaloPolicy` holds a schedule's options, checked once when it is built, and answers
which mode an epoch runs (:meth:`HaloPolicy.mode_at`, a pure function of the epoch
number, so every rank issues the same collectives; in an ``"adaptive"`` epoch each layer's
choice is agreed by one tiny all-reduce at the epoch's start,
:meth:`~lightning_halo.exchange.slots.SlotTable.decide`). :class:`~lightning_halo.HaloSchedule`
builds one and hands it to the strategy; the exchanger applies the epoch's mode to every slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, get_args

Mode = Literal["sync", "pipelined", "periodic", "adaptive"]
#: Every mode, in the order of their codes in the logged ``halo/mode`` metric (0, 1, 2, 3).
MODES: tuple[Mode, ...] = get_args(Mode)



@dataclass(frozen=True)
class ModeRow:
    """One mode (with the option that shapes it) as :data:`MODE_TABLE` defines it."""

    mode: Mode
    option: str  # the option that shapes it ("" for none)
    forward: str  # what a layer's forward uses
    backward: str  # which halo gradients its backward applies
    traffic: str  # when rows travel
    exactness: str  # what it guarantees
    method: str  # the method it follows, with a link


#: The modes, defined once: every description of them (the docstrings, docs/modes.md's table) refers to
#: or is generated from these rows.
MODE_TABLE: tuple[ModeRow, ...] = (
    ModeRow("sync", "", "this epoch's rows", "this epoch's halo gradients", "every epoch", "exact at `bits=32`",
            "the default"),
    ModeRow("pipelined", "", "last epoch's rows (this epoch's travel meanwhile)", "last epoch's halo gradients",
            "every epoch, overlapped", "stale by one epoch",
            "[PipeGCN](https://arxiv.org/abs/2203.10428), Sylvie's asynchronous mode"),
    ModeRow("pipelined", "sync_every=k", "as above, every k-th epoch synchronous", "as above", "every epoch",
            "staleness reset every k epochs", "Sylvie's bounded-staleness adaptor"),
    ModeRow("periodic", "refresh_every=N", "the rows of the last refresh",
            "nothing crosses partitions between refreshes", "only in refresh epochs", "stale up to N−1 epochs",
            "[DIGEST](https://arxiv.org/abs/2206.00057)-style stale representations"),
    ModeRow("adaptive", "drift_threshold=δ, wait_threshold=w",
            "per layer: last epoch's rows while that layer's sent rows moved ≤ δ in the last epoch and its "
            "synchronous exchanges waited ≥ w of the step, else this epoch's",
            "as the layer's forward chose: one epoch late, or at once", "every epoch, overlapped where stale",
            "stale by at most one epoch, only where the rows barely move and the wait is worth hiding",
            "[Sancus](https://doi.org/10.24963/ijcai.2023/724)-style staleness bounded by measured change"),
)  # fmt: skip

#: ``"adaptive"``'s default bound on the relative change of a layer's sent rows between two
#: epochs, :math:`\lVert H_t - H_{t-1} \rVert_F / \lVert H_{t-1} \rVert_F`, below which that layer
#: runs stale (pipelined) in the next epoch (see docs/modes.md for how it was chosen).
DRIFT_THRESHOLD = 0.1
#: ``"adaptive"``'s default floor on the share of a training step a layer's synchronous exchanges waited
#: (the smallest over the ranks) below which it stays synchronous however little its rows move: a stale
#: exchange saves at most that wait and costs a copy and a transfer in the background, so where the wait is
#: small it only loses accuracy and time (docs/modes.md, "Adaptive").
WAIT_THRESHOLD = 0.1


def check_mode(mode: str) -> None:
    if mode not in MODES:
        choices = ", ".join(map(repr, MODES[:-1])) + f" or {MODES[-1]!r}"
        raise ValueError(f"unknown mode {mode!r}; choose {choices}")


def check_smoothing(smoothing: float) -> None:
    """PipeGCN's moving-average factor is in ``[0, 1)`` (``1`` would never take new rows)."""
    if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must be a number in [0, 1), got {smoothing!r}")


def check_drift(drift_threshold: float) -> None:
    """A relative change: a positive, finite number."""
    ok = isinstance(drift_threshold, (int, float)) and not isinstance(drift_threshold, bool)
    if not ok or not 0.0 < float(drift_threshold) < float("inf"):
        raise ValueError(f"drift_threshold must be a positive number (a relative change, e.g. 0.1), got {drift_threshold!r}")


def check_wait(wait_threshold: float) -> None:
    """A share of the training step: a number in ``[0, 1)``."""
    ok = isinstance(wait_threshold, (int, float)) and not isinstance(wait_threshold, bool)
    if not ok or not 0.0 <= float(wait_threshold) < 1.0:
        raise ValueError(
            f"wait_threshold must be a share of the training step in [0, 1) (e.g. 0.1; 0: the drift alone decides), "
            f"got {wait_threshold!r}"
        )


def check_count(name: str, value: Optional[int], minimum: int, allow_none: bool = False) -> None:
    """An epoch count option: an integer ``>= minimum`` (or ``None`` where allowed)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive integer" if minimum == 1 else "a non-negative integer"
        raise ValueError(f"{name} must be {what}{' or None' if allow_none else ''}, got {value!r}")


@dataclass(frozen=True)
class HaloPolicy:
    r"""A schedule of the modes of :data:`MODE_TABLE` over the training epochs.

    The first epoch and ``warmup_epochs`` are ``"sync"``. After them a ``"pipelined"`` or
    ``"adaptive"`` schedule makes every ``sync_every``-th epoch ``"sync"``, and a ``"periodic"``
    one refreshes (a ``"sync"`` epoch) every ``refresh_every`` epochs.

    Args:
        mode (str, optional): one of :data:`MODES`. (default: ``"sync"``)
        sync_every (int, optional): pipelined and adaptive: every k-th epoch is synchronous. (default: ``None``)
        refresh_every (int, optional): periodic only: epochs between refreshes. (default: ``10``)
        smoothing (float, optional): weight of the old rows and gradients when stale ones land,
            :math:`m\,\text{old} + (1-m)\,\text{new}`, in ``[0, 1)``. (default: ``0.0``)
        warmup_epochs (int, optional): synchronous epochs before the mode starts. (default: ``0``)
        drift_threshold (float, optional): adaptive only: the largest relative change of a layer's
            sent rows in the last epoch that lets it run stale; ``None`` is
            :data:`DRIFT_THRESHOLD` (0.1).
        wait_threshold (float, optional): adaptive only: the smallest share of the training step that a
            layer's last synchronous exchanges waited (the least over the ranks) that lets it run stale;
            ``0``: the drift alone decides (and decisions do not depend on measured times); ``None`` is
            :data:`WAIT_THRESHOLD` (0.1).

    Example:
        >>> [HaloPolicy("pipelined", sync_every=3).mode_at(e) for e in range(5)]
        ['sync', 'pipelined', 'pipelined', 'sync', 'pipelined']
    """

    mode: Mode = "sync"
    sync_every: Optional[int] = None
    refresh_every: int = 10
    smoothing: float = 0.0
    warmup_epochs: int = 0
    drift_threshold: Optional[float] = None
    wait_threshold: Optional[float] = None

    def __post_init__(self) -> None:
        check_mode(self.mode)
        check_count("sync_every", self.sync_every, 1, allow_none=True)
        check_count("refresh_every", self.refresh_every, 1)
        check_smoothing(self.smoothing)
        check_count("warmup_epochs", self.warmup_epochs, 0)
        if self.sync_every is not None and self.mode not in ("pipelined", "adaptive"):
            raise ValueError("sync_every applies to mode='pipelined' or 'adaptive' only")
        if self.drift_threshold is not None:
            check_drift(self.drift_threshold)
            if self.mode != "adaptive":
                raise ValueError("drift_threshold applies to mode='adaptive' only")
        if self.wait_threshold is not None:
            check_wait(self.wait_threshold)
            if self.mode != "adaptive":
                raise ValueError("wait_threshold applies to mode='adaptive' only")

    @property
    def drift_bound(self) -> Optional[float]:
        """The adaptive threshold in effect (``None`` unless ``mode="adaptive"``)."""
        if self.mode != "adaptive":
            return None
        return DRIFT_THRESHOLD if self.drift_threshold is None else float(self.drift_threshold)

    @property
    def wait_bound(self) -> Optional[float]:
        """The adaptive wait floor in effect (``None`` unless ``mode="adaptive"``)."""
        if self.mode != "adaptive":
            return None
        return WAIT_THRESHOLD if self.wait_threshold is None else float(self.wait_threshold)

    def mode_at(self, epoch: int) -> Mode:
        """The mode of training epoch ``epoch`` (validation and test are always ``"sync"``)."""
        start = max(1, self.warmup_epochs)
        if self.mode == "sync" or epoch < start:
            return "sync"
        if self.mode in ("pipelined", "adaptive"):
            return "sync" if self.sync_every is not None and epoch % self.sync_every == 0 else self.mode
        return "sync" if (epoch - start) % self.refresh_every == 0 else "periodic"


#: Fresh halos every epoch: what a run without a schedule does.
SYNC = HaloPolicy()
