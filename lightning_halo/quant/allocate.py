r"""Bit widths where they matter: the codec's variance bound per group of rows, and a greedy choice of widths.

A *group* is what one exchange sends in one direction: a layer's halo rows (forward) or their
gradients (backward). The codec rounds each element of a row stochastically on a grid of step
:math:`s = (\max - \min) / (2^b - 1)` (:mod:`lightning_halo.quant.format`): unbiased, with variance
:math:`s^2 f (1 - f) \le s^2 / 4`. Summed over a group's rows :math:`r` of width :math:`d`:

.. math::
    V(b) = \frac{R}{(2^b - 1)^2}, \qquad R = \sum_r \frac{d\,(\max_r - \min_r)^2}{4}

(AdaQP's :math:`D/6` is the same bound for a uniformly spread fraction :math:`f`: the constant
changes no choice). bfloat16 rows (``b = 16``) round each element within :math:`2^{-7}` of its
magnitude, :math:`V \le 2^{-16} E`; raw rows (``b = 32``) have none. The group's *relative*
variance :math:`V(b)/E`, with :math:`E = \sum_r \lVert x_r \rVert^2`, compares groups of any scale:
forward rows and their gradients differ by orders of magnitude, and so would their raw variances.

:func:`choose_widths` starts every group at the narrowest width and then takes, one at a time,
the upgrade (a wider width for one group) that removes the most relative variance per added
byte (an upgrade that adds none, where codes fill a byte's padding, first), while the bytes
stay within ``budget`` times the bytes at the narrowest width. The bytes of a group at width :math:`b` are exactly what the wire moves, ``n * row_nbytes(d, b)``. The same
inputs give the same widths, so ranks that agree on the inputs (one all-reduce) agree on the
widths. Wire time is proportional to bytes on one wire, so bytes rank the upgrades as time would.

*When* to spend the budget is a second question. With a monitored validation metric, every group
stays at the narrowest width while the metric improves. Once ``patience`` checks in a row fail to
improve it (the rule of ``ReduceLROnPlateau``), the budget opens on trial: if the metric beats its
best within another ``patience`` checks, the budget stays open for the rest of the run; if not,
the wider widths bought nothing and every group returns to the narrowest width for good
(:func:`plateau_step`). The rounding noise of the narrowest width matters once it, rather than
the optimisation, limits progress; where the narrowest width suffices, only the trial is spent.

Example:
    >>> noisy, quiet = GroupSignal(r=400.0, e=100.0, n=10, d=16), GroupSignal(r=1.0, e=100.0, n=10, d=16)
    >>> choose_widths([noisy, quiet], (1, 2, 4, 8), budget=1.5)  # 1.5x the bytes of both at 1 bit
    [4, 1]
    >>> choose_widths([noisy, quiet], (1, 2, 4, 8), budget=2.0)
    [4, 4]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Sequence, get_args

import torch
from torch import Tensor

from .format import SUPPORTED_BITS, check_bits, row_nbytes

#: The widths :func:`choose_widths` picks from by default: the packed ones (stochastic rounding).
BIT_CHOICES = (1, 2, 4, 8)
#: Bytes an adaptive run may move, as a multiple of the bytes at its narrowest width. Its default: at most 2x 1-bit.
BIT_BUDGET = 2.0
#: The noise the halos' rounding may add to a layer's output, relative to its energy, before a width is raised.
#: Its default, ``0``: no target, the byte budget decides. Measured, the bound does not rank graphs by what 1 bit
#: costs them (docs/quantization.md, "Adaptive widths"), so a target is the user's to set, not ours to guess.
BIT_TARGET = 0.0
#: The value of ``bits``/``grad_bits`` that asks for adaptive widths.
ADAPTIVE = "adaptive"
#: Whether a larger (``"max"``, an accuracy) or a smaller (``"min"``, a loss) value of ``bit_monitor`` is better.
MonitorMode = Literal["min", "max"]
#: Validation checks without improvement of ``bit_monitor`` before the budget opens on trial, and during the trial
#: before it closes again (:func:`plateau_step`).
BIT_PATIENCE = 3


@dataclass(frozen=True)
class GroupSignal:
    """What decides one group's width: variance numerator ``r``, energy ``e`` (sums over its rows), rows ``n``
    (summed over the ranks), row width ``d`` and the rows' element size (for ``bits=32``), and the ``weight`` with which its relative variance reaches its layer's outputs."""

    r: float
    e: float
    n: int
    d: int
    itemsize: int = 4
    #: the share of the group's relative variance that reaches the outputs of its layer (:func:`output_variance`)
    weight: float = 1.0


def check_bit_choices(choices: Sequence[int]) -> tuple[int, ...]:
    """``choices`` as a sorted tuple, if it is a non-empty set of :data:`~lightning_halo.quant.SUPPORTED_BITS`.

    Example:
        >>> check_bit_choices([4, 1])
        (1, 4)
        >>> check_bit_choices([3])
        Traceback (most recent call last):
        ...
        ValueError: bit_choices=[3] holds 3, which is not a bit width; choose from (1, 2, 4, 8, 16, 32), e.g. bit_choices=(1, 2, 4, 8).
    """
    if isinstance(choices, (str, bytes)) or not hasattr(choices, "__iter__"):
        raise ValueError(f"bit_choices must be a list of bit widths, e.g. (1, 2, 4, 8), got {choices!r}")
    items = list(choices)
    for b in items:
        if isinstance(b, bool) or not isinstance(b, int) or b not in SUPPORTED_BITS:
            raise ValueError(
                f"bit_choices={items!r} holds {b!r}, which is not a bit width; choose from {SUPPORTED_BITS}, "
                f"e.g. bit_choices={BIT_CHOICES}."
            )
    if not items:
        raise ValueError(f"bit_choices is empty; give at least one bit width, e.g. bit_choices={BIT_CHOICES}.")
    if len(set(items)) != len(items):
        raise ValueError(f"bit_choices={items!r} repeats a width; give each once.")
    return tuple(sorted(items))


def _check_finite(name: str, value: object, minimum: int) -> None:
    """``value`` is a finite real number (not a bool), else a ``ValueError`` naming ``name``."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be a finite number >= {minimum}, got {value!r}")


def check_bit_budget(budget: float) -> float:
    """A byte budget: a finite number ``>= 1`` (a multiple of the bytes at the narrowest width).

    Example:
        >>> check_bit_budget(0.5)
        Traceback (most recent call last):
        ...
        ValueError: bit_budget=0.5 is below 1: it is the bytes an adaptive run may move as a multiple of the bytes at its narrowest width (1 keeps every exchange there), e.g. bit_budget=2.0.
    """
    _check_finite("bit_budget", budget, 1)
    if budget < 1:
        raise ValueError(
            f"bit_budget={budget!r} is below 1: it is the bytes an adaptive run may move as a multiple of the bytes at "
            f"its narrowest width (1 keeps every exchange there), e.g. bit_budget={BIT_BUDGET}."
        )
    return float(budget)


def check_width(bits: object, name: str = "bits") -> int | str:
    """``bits`` if it is a bit width or ``"adaptive"``, else a ``ValueError`` naming ``name`` and the choices.

    Example:
        >>> check_width("adaptive"), check_width(4)
        ('adaptive', 4)
    """
    if is_adaptive(bits):
        return ADAPTIVE
    try:
        return check_bits(bits, name)  # type: ignore[arg-type]
    except ValueError:
        raise ValueError(
            f"{name}={bits!r} is not supported; choose one of {SUPPORTED_BITS} (32 = exact float rows) or "
            f"{ADAPTIVE!r} (a width per layer call and direction, agreed by the ranks every epoch)."
        ) from None


def is_adaptive(bits: object) -> bool:
    """Whether a ``bits``/``grad_bits`` value asks for adaptive widths."""
    return isinstance(bits, str) and bits == ADAPTIVE


def signal_terms(rows: Tensor) -> Tensor:
    r"""``[R, E, n]`` of ``rows`` ``[n, d]`` as a float64 tensor on their device: the variance numerator, the energy
    (module docstring) and the row count. No host synchronisation: an exchange adds it up, a decision reads it once."""
    x = rows.detach().flatten(1)
    if x.numel() == 0:
        return torch.tensor([0.0, 0.0, float(x.size(0))], dtype=torch.float64, device=x.device)
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()
    # amax and amin apart, and the energy as one dot product in the rows' dtype: on CPU about 6x faster than
    # aminmax and a float64 copy squared (8,000 x 256 rows: 1.0 ms instead of 6.3 ms), a signal needs no more
    r = (x.amax(1) - x.amin(1)).double().square().sum() * (x.size(1) / 4.0)
    flat = x.reshape(-1)
    n = torch.tensor(float(x.size(0)), dtype=torch.float64, device=x.device)
    return torch.stack([r, torch.dot(flat, flat).double(), n])


def signal_of(rows: Tensor) -> tuple[float, float]:
    r"""The variance numerator :math:`R` and energy :math:`E` of ``rows`` ``[n, d]`` (module docstring), in float64.

    Example:
        >>> signal_of(torch.tensor([[0.0, 2.0], [1.0, 1.0]]))
        (2.0, 6.0)
    """
    r, e, _ = signal_terms(rows).tolist()
    return r, e


def relative_variance(g: GroupSignal, bits: int) -> float:
    """The bound :math:`V(b)/E` of a group at ``bits`` (0 for a group with no energy, or at 32 bits)."""
    if g.e <= 0 or g.n == 0 or bits == 32:
        return 0.0
    if bits == 16:
        return 2.0**-16
    return g.r / ((2**bits - 1) ** 2 * g.e)


def group_bytes(g: GroupSignal, bits: int) -> int:
    """Bytes the group moves at ``bits``: ``n * row_nbytes(d, bits)``."""
    return g.n * (g.d * g.itemsize if bits == 32 else row_nbytes(g.d, bits))


def output_variance(g: GroupSignal, bits: int) -> float:
    """The noise a group at ``bits`` adds to its layer's outputs, relative to their energy: ``weight * V(b)/E``."""
    return g.weight * relative_variance(g, bits)


def halo_reach(edge_index: Tensor, n_inner: int, n_inner_src: Optional[int] = None) -> float:
    r"""How much of the halo rows' noise reaches the outputs of a mean aggregation over ``edge_index``.

    A layer's output row :math:`i` (an inner node, ``dst < n_inner``) averages its in-neighbours'
    rows, each with coefficient :math:`1/\deg_i`; a halo row :math:`j` (``src >= n_inner``) carries its
    rounding noise :math:`v_j` into every output it feeds, scaled by the square of the coefficient.
    The noise the outputs receive is then :math:`\sum_j v_j w_j` with

    .. math::
        W = \sum_j w_j = \sum_{(j, i):\, j \text{ halo}} \frac{1}{\deg_i^2}

    and, with every row's noise and energy at the group's mean, the outputs' relative noise is
    :math:`(W / N) \cdot V(b)/E` over :math:`N` outputs (an average of rows that point the same way,
    such as non-negative activations, keeps their energy). A sum aggregation scales noise and outputs
    alike, so its ratio is the same; GCN's :math:`1/\sqrt{\deg_i \deg_j}` has the same total.
    Returns :math:`W` (the caller divides by :math:`N`, summed over the ranks). ``n_inner_src``: where the
    sources' halo starts, if the sources are another id space (a heterogeneous edge type's source type).

    Example:
        >>> # inner nodes 0 and 1; node 0 has two neighbours, one of them the halo row 2; node 1 only halo row 2
        >>> halo_reach(torch.tensor([[1, 2, 2], [0, 0, 1]]), n_inner=2)
        1.25
    """
    src, dst = edge_index[0], edge_index[1]
    into = dst < n_inner
    if not bool(into.any()):
        return 0.0
    deg = torch.bincount(dst[into], minlength=n_inner).double()
    from_halo = into & (src >= (n_inner if n_inner_src is None else n_inner_src))
    return float(deg[dst[from_halo]].reciprocal().square().sum())


def check_bit_target(target: float) -> float:
    """A variance target: a finite number ``>= 0`` (``0``: no target, widen while the byte budget allows).

    Example:
        >>> check_bit_target(-1)
        Traceback (most recent call last):
        ...
        ValueError: bit_target=-1 is below 0: it is the noise the halos may add to a layer's output, relative to its energy (0: none, widen within bit_budget), e.g. bit_target=0.05.
    """
    _check_finite("bit_target", target, 0)
    if target < 0:
        raise ValueError(
            f"bit_target={target!r} is below 0: it is the noise the halos may add to a layer's output, relative to its "
            "energy (0: none, widen within bit_budget), e.g. bit_target=0.05."
        )
    return float(target)


def check_bit_monitor(monitor: Optional[str], mode: str, patience: int) -> tuple[Optional[str], MonitorMode, int]:
    """``bit_monitor`` (``None``, or the name of a logged metric), its ``bit_mode`` and ``bit_patience`` (an int ``>= 1``).

    Example:
        >>> check_bit_monitor("val_acc", "up", 3)
        Traceback (most recent call last):
        ...
        ValueError: bit_mode='up' must be 'min' (a smaller bit_monitor is better, e.g. a loss) or 'max' (e.g. an accuracy).
    """
    if monitor is not None and (not isinstance(monitor, str) or not monitor):
        raise ValueError(f"bit_monitor={monitor!r} must be the name of a metric the module logs (e.g. 'val_acc') or None.")
    if mode not in get_args(MonitorMode):
        raise ValueError(f"bit_mode={mode!r} must be 'min' (a smaller bit_monitor is better, e.g. a loss) or 'max' "
                         "(e.g. an accuracy).")  # fmt: skip
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ValueError(f"bit_patience={patience!r} must be an int >= 1: the validation checks without improvement "
                         f"of bit_monitor before the byte budget opens, e.g. bit_patience={BIT_PATIENCE}.")  # fmt: skip
    return monitor, mode, patience  # type: ignore[return-value]


#: Where a :class:`Plateau` stands: the narrowest widths while the metric improves (``"narrow"``), the budget on
#: trial after a plateau (``"trial"``), kept because the trial improved the metric (``"open"``), or given back
#: because it did not (``"closed"``: the narrowest widths for the rest of the run).
PlateauPhase = Literal["narrow", "trial", "open", "closed"]


@dataclass(frozen=True)
class Plateau:
    """Where a monitored metric stands (:func:`plateau_step`): its best value, the checks since it last improved,
    and the phase of the byte budget."""

    best: Optional[float] = None
    stale: int = 0
    phase: PlateauPhase = "narrow"

    @property
    def open(self) -> bool:
        """Whether the byte budget is spent now (on trial or kept)."""
        return self.phase in ("trial", "open")


def plateau_step(state: Plateau, value: float, mode: MonitorMode, patience: int) -> Plateau:
    """The plateau after one more validation value.

    ``patience`` checks in a row that fail to improve on the best (strictly) put the budget on trial; the first
    improvement during the trial keeps it open for the rest of the run, and ``patience`` more checks without one
    close it for the rest of the run. A NaN never improves.

    Example:
        >>> s = Plateau()
        >>> for v in (0.5, 0.6, 0.6, 0.59):
        ...     s = plateau_step(s, v, "max", 2)
        >>> s
        Plateau(best=0.6, stale=0, phase='trial')
        >>> plateau_step(plateau_step(s, 0.6, "max", 2), 0.58, "max", 2)  # the wider widths bought nothing
        Plateau(best=0.6, stale=2, phase='closed')
        >>> plateau_step(s, 0.61, "max", 2)  # they did
        Plateau(best=0.61, stale=0, phase='open')
    """
    if state.phase in ("open", "closed"):
        return state
    if value != value:  # NaN: no progress
        better = False
    else:
        better = state.best is None or (value > state.best if mode == "max" else value < state.best)
    if better:
        return Plateau(value, 0, "open" if state.phase == "trial" else "narrow")
    stale = state.stale + 1
    if stale < patience:
        return Plateau(state.best, stale, state.phase)
    return Plateau(state.best, 0, "trial") if state.phase == "narrow" else Plateau(state.best, stale, "closed")


def choose_widths(
    groups: Sequence[GroupSignal], choices: Sequence[int], budget: float, target: float = 0.0
) -> list[int]:
    """Each group's width (module docstring): greedy, the most output noise above ``target`` removed per added byte
    first.

    Args:
        groups: the groups' signals (the same on every rank).
        choices: the widths to pick from (:func:`check_bit_choices`).
        budget: the bytes allowed, as a multiple of the bytes at the narrowest width (:func:`check_bit_budget`).
        target: the output noise (:func:`output_variance`) at or below which a group is not widened
            (:func:`check_bit_target`; ``0``: widen while the budget allows). (default: ``0``)

    Returns:
        One width per group. Ties go to the earlier group, then to the narrower width.
    """
    choices = check_bit_choices(choices)
    budget = check_bit_budget(budget)
    target = check_bit_target(target)
    widths = [choices[0]] * len(groups)
    spent = sum(group_bytes(g, choices[0]) for g in groups)
    allowed = budget * spent
    while True:
        best: Optional[tuple[float, int, int, int]] = None  # (gain per byte, group, width, added bytes)
        for i, g in enumerate(groups):
            now, now_bytes = output_variance(g, widths[i]), group_bytes(g, widths[i])
            if now <= target:
                continue
            for b in choices:
                if b <= widths[i]:
                    continue
                # only the noise above the target counts: a width that reaches it gains as much as a wider one, so
                # the narrowest that does wins on bytes
                gain, extra = now - max(output_variance(g, b), target), group_bytes(g, b) - now_bytes
                if gain <= 0 or spent + extra > allowed:
                    continue
                rate = gain / extra if extra > 0 else float("inf")  # a width that costs no byte more (padding)
                if best is None or rate > best[0]:
                    best = (rate, i, b, extra)
        if best is None:
            return widths
        _, i, b, extra = best
        widths[i] = b
        spent += extra


__all__ = [
    "ADAPTIVE",
    "BIT_BUDGET",
    "BIT_CHOICES",
    "BIT_PATIENCE",
    "BIT_TARGET",
    "MonitorMode",
    "Plateau",
    "PlateauPhase",
    "GroupSignal",
    "check_bit_budget",
    "check_bit_choices",
    "check_bit_monitor",
    "check_bit_target",
    "check_width",
    "choose_widths",
    "group_bytes",
    "halo_reach",
    "is_adaptive",
    "output_variance",
    "plateau_step",
    "relative_variance",
    "signal_of",
    "signal_terms",
]
