r"""What the propagate pre-hook does: count propagations, and fetch each step's halo.

A layer may call ``propagate`` as often as its kind declares (:mod:`~lightning_halo.layers.registry`);
one more would read halo rows computed by an earlier propagation, which no peer updated, and is
refused (:func:`count_propagation`). A ``"steps"`` layer (APPNP, SGConv, ChebConv, ...) is fed
its inner rows; before *every* propagation the halo rows of everything the step reads at edge
sources are fetched from their owners (:func:`step_inputs`), as if the steps were stacked layers.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor
from torch.nn import Module

from lightning_halo._compat.pyg import source_arguments
from lightning_halo.layers.call import LayerCall
from lightning_halo.layers.registry import UnsupportedLayerError

#: ``fetch(rows, step_name)``: the halo rows ``[n_halo, ...]`` of ``rows`` ``[n_inner, ...]``.
StepFetch = Callable[[Tensor, str], Tensor]


def count_propagation(call: LayerCall, kind: str, count: int) -> None:
    """Refuse the ``count``-th propagation of one forward if the layer's kind allows fewer."""
    limit = call.max_propagations
    if limit is not None and count > limit:
        raise UnsupportedLayerError(
            f"layer '{call.layer}' ({call.cls}) called propagate {count} times in one forward, but it is "
            f"registered as '{kind}' with {limit} propagation(s): a later propagation would read halo "
            "rows computed by an earlier one, which no peer updated. If the layer propagates several times, each "
            f"step reading the previous one's output, register it as such: lightning_halo.register_layer("
            f"{call.cls}, 'steps')."
        )


def with_halo_along(t: Tensor, node_dim: int, fetch: Callable[[Tensor], Tensor]) -> Tensor:
    """``t`` (inner rows along ``node_dim``) with its halo rows appended along that dimension."""
    dim = node_dim % t.dim()
    moved = t.movedim(dim, 0)
    return torch.cat([moved, fetch(moved)], dim=0).movedim(0, dim)


def _source_pair(value: Any) -> Optional[tuple[Tensor, Any]]:
    """``(sources, targets)`` of a propagated value: a tensor is both; a pair is split; else None."""
    if isinstance(value, Tensor):
        return value, value
    if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], Tensor):
        return value[0], value[1]
    return None


def step_inputs(
    call: LayerCall, module: Module, step: str, edge_index: Any, kwargs: dict, fetch: StepFetch
) -> tuple[Any, Optional[tuple[int, int]], dict]:
    """``propagate``'s ``(edge_index, size, kwargs)`` with the halo appended to what it reads at sources."""
    fused = call.aggregation.fused and isinstance(edge_index, Tensor) and edge_index.layout != torch.strided
    return halo_step_inputs(module, edge_index, kwargs, n_inner=call.n_inner, n_src=call.edges.n_src, fused=fused,
                            flipped=call.flipped, layer=call.layer, cls=call.cls, fetch=lambda rows: fetch(rows, step))  # fmt: skip


def halo_step_inputs(
    module: Module, edge_index: Any, kwargs: dict, *, n_inner: int, n_src: int, fused: bool, flipped: bool, layer: str,
    cls: str, fetch: Callable[[Tensor], Tensor],
) -> tuple[Any, Optional[tuple[int, int]], dict]:  # fmt: skip
    """One propagation of a ``"steps"`` layer: every value it reads at sources (``n_inner`` rows) with its halo rows
    appended (``fetch``), and the ``(n_src, n_inner)`` size; a fused adjacency reads ``x`` only.

    Raises:
        ValueError: a propagated value of another row count than the inner nodes.
        UnsupportedLayerError: a propagated pair under ``flow="target_to_source"``.
    """
    node_dim = getattr(module, "node_dim", -2)
    kwargs = dict(kwargs)
    for name in ["x"] if fused else source_arguments(module):
        pair = _source_pair(kwargs.get(name))
        if pair is None:
            continue
        src, dst = pair
        if src.size(node_dim) != n_inner:
            raise ValueError(
                f"layer '{layer}' propagated `{name}` with {src.size(node_dim)} rows, but this rank owns "
                f"{n_inner} nodes; a 'steps' layer must propagate tensors of its inner nodes."
            )
        if flipped and kwargs[name] is not src:
            # PyG's generated propagate reads a pair as (sources, targets) and sizes its output by
            # the pair's first entry whatever the flow: a partition's pair cannot satisfy both.
            raise UnsupportedLayerError(
                f"layer '{layer}' ({cls}) propagates the pair `{name}` with flow='target_to_source', "
                "which PyG cannot size on a partition; use the default flow (e.g. on edge_index.flip(0))."
            )
        full = with_halo_along(src, node_dim, fetch)
        # under target_to_source the explicit size below sets the output rows
        kwargs[name] = full if fused or flipped else (full, dst)
    size = (n_inner, n_src) if flipped else (n_src, n_inner)
    return edge_index, None if fused else size, kwargs
