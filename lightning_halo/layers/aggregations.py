"""PyG aggregations that need a hand on partitions.

PyG's ``QuantileAggregation`` (and ``MedianAggregation``, ``aggr="median"``) fails with
``IndexError: index out of range`` when the call's first target node receives no message:
its quantile position for that node is ``-q`` before the empty-segment mask applies. On the
whole graph that node is node 0; on a partition it is the rank's first local node, and on a
heterogeneous partition a relation can have no edges at all on a rank. So a model that trains
whole can fail on some partitions. :class:`QuantileGuard` puts two messages of its own, in a
segment of its own, before the call's first node, and drops that segment's row from the output:
every real node's quantile and the fill value of those without messages are PyG's.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor
from torch.nn import Module

from lightning_halo.layers.around import AroundForward


def find_quantile_aggregations(module: Module) -> list[Module]:
    """Every ``QuantileAggregation`` (``MedianAggregation`` included) inside ``module``."""
    from torch_geometric.nn.aggr import QuantileAggregation

    return [m for m in module.modules() if isinstance(m, QuantileAggregation)]


class QuantileGuard(AroundForward):
    """Lets one ``QuantileAggregation`` take calls whose first target node has no message, while ``active()``.

    Args:
        module (Module): the aggregation.
        active (callable): whether a partition is bound (else the call runs as PyG's).
    """

    with_kwargs = True

    def __init__(self, module: Module, active: Callable[[], bool]) -> None:
        super().__init__(module)
        self.active = active
        self._padded: list[bool] = []

    def _pre(self, module: Module, args: tuple, kwargs: dict) -> Optional[tuple[tuple, dict]]:
        x = args[0] if args else kwargs.get("x")
        index: Optional[Tensor] = kwargs.get("index", args[1] if len(args) > 1 else None)
        dim = int(kwargs.get("dim", args[4] if len(args) > 4 else -2))
        if not self.active() or x is None or index is None or x.dim() != 2 or dim not in (0, -2):
            self._padded.append(False)
            return None
        dim_size = kwargs.get("dim_size", args[3] if len(args) > 3 else None)
        dim_size = int(index.max()) + 1 if dim_size is None and index.numel() else int(dim_size or 0)
        # two rows: PyG clamps an empty segment's start to the last row, and it must be 1 or more
        pad = x.new_zeros(2, x.size(1))
        new = {"index": torch.cat([index.new_zeros(2), index + 1]), "ptr": None, "dim_size": dim_size + 1, "dim": -2}
        self._padded.append(True)
        return (torch.cat([pad, x]),), {**kwargs, **new}

    def _post(self, module: Module, args: tuple, output: Tensor) -> Optional[Tensor]:
        padded = self._padded.pop() if self._padded else False
        return output[1:] if padded else None
