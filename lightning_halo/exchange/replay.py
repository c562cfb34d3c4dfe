"""Halo rows kept for recomputation in backward (activation checkpointing, reversible layers).

``torch.utils.checkpoint`` runs a segment's forward again during backward to rebuild what it did not
keep, and :class:`torch_geometric.nn.GroupAddRev` calls its layers again to invert them. A layer's
halo rows are then fetched again: a second exchange whose rows differ from the first at ``bits < 32``
(a new stochastic rounding; in ``"pipelined"`` epochs other rows altogether), so the gradient would
be computed through other halo rows than the loss, and every such call would cross the wire twice.

A fetch made where a recomputation can follow is kept here for the step: one made inside
``checkpoint(..., use_reentrant=False)`` (under its saved-tensor hooks) or without
gradient in a training step (``use_reentrant=True`` and :class:`~torch_geometric.nn.GroupAddRev` run
their forward so). A fetch made *during* backward is a recomputation and gets the kept rows: no
traffic, bitwise the rows the loss saw.

Pure bookkeeping, no communication; the exchanger decides when to keep and when to replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_halo._compat.torch import checkpoint_hooks_active, in_backward


def recomputing() -> bool:
    """Whether this call runs inside a backward pass (autograd's graph task), where a forward call is a
    recomputation (checkpointed segment, reversible layer)."""
    return in_backward()


def may_recompute() -> bool:
    """Whether a fetch made now may be recomputed in backward: inside a non-reentrant checkpointed segment (its
    saved-tensor hooks are active; ``save_on_cpu``'s are not a reason to keep rows) or with gradients off (reentrant
    checkpointing and reversible layers run their forward without them)."""
    return not torch.is_grad_enabled() or checkpoint_hooks_active()


def fingerprint(x_inner: Tensor) -> Tensor:
    """A column sum of the fetched rows, in float64: tells apart the calls of one layer with other inputs."""
    return x_inner.detach().sum(0, dtype=torch.float64).flatten()


@dataclass(frozen=True)
class Kept:
    """One kept fetch: its input's fingerprint, the halo rows (or partial-sum block) it returned, and how it was
    fetched (the exchanger's ``Fetch``: its backward, if the recomputed graph is the one differentiated)."""

    signature: Tensor
    rows: Tensor
    fetch: Any


class Replays:
    """The step's kept fetches, by (layer, direction, partial sums or not).

    Example:
        >>> r = Replays()
        >>> x, halo = torch.ones(3, 2), torch.zeros(1, 2)
        >>> r.keep(("conv1", "in", False), x, halo, fetch=None)
        >>> torch.equal(r.find(("conv1", "in", False), x).rows, halo)
        True
        >>> r.find(("conv2", "in", False), x) is None
        True
    """

    def __init__(self) -> None:
        self._kept: dict[tuple[str, str, bool], list[Kept]] = {}

    def keep(self, key: tuple[str, str, bool], x_inner: Tensor, rows: Tensor, fetch: Any) -> None:
        self._kept.setdefault(key, []).append(Kept(fingerprint(x_inner), rows.detach(), fetch))

    def find(self, key: tuple[str, str, bool], x_inner: Tensor) -> Optional[Kept]:
        """The kept fetch a recomputed call of ``key`` on ``x_inner`` repeats: the only one of its layer, else the
        one whose input is nearest (a recomputation reproduces its input, up to rounding where it is rebuilt by
        inversion). ``None`` if the layer kept none this step."""
        kept = self._kept.get(key)
        if not kept:
            return None
        if len(kept) == 1:
            return kept[0]
        now = fingerprint(x_inner)

        def distance(k: Kept) -> float:
            return float((k.signature - now).abs().max()) if k.signature.shape == now.shape else float("inf")

        return min(kept, key=distance)  # equal inputs (a tie): their rows differ only by rounding noise; the first

    def clear(self) -> None:
        self._kept.clear()

    def __len__(self) -> int:
        return sum(len(v) for v in self._kept.values())
