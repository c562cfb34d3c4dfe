r"""Halo partial sums in a layer call: where they are exact, and the adjacency that reads them.

A layer that aggregates linearly on the fused path computes, for an inner node :math:`v`,
:math:`\sum_u m_{vu}\, f(x_u)` with a row-wise linear :math:`f` (GCN's ``lin`` without bias,
or nothing) and the layer's final edge values :math:`m_{vu}` (global normalisation, edge
weights and ``mean``'s :math:`1/\deg_v` included). The contributions of the halo rows a cover
folds (:mod:`lightning_halo.partition.cover`) arrive instead as one partial sum
:math:`p_v = \sum_{u \in V_a} m_{vu}\, x_u` per sender :math:`a`, computed by the owner of
the rows; the layer reads it as an extra halo row with one edge of value 1 into :math:`v`, so
its own transform and aggregation run unchanged and autograd carries the backward:
:math:`f(p_v) = \sum_u m_{vu} f(x_u)`.

:func:`choose_reduction` decides per call (and says why not); :func:`covered_adjacency` builds
the adjacency over ``[inner | block]`` and the coefficients the owners need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, get_args

import torch
from torch import Tensor
from torch.nn import Module

from lightning_halo.exchange.cover import CoverPlan
from lightning_halo.layers.fused import FusedAdjacency

#: How halo rows cross the wire: see :class:`~lightning_halo.HaloQuantStrategy`'s ``halo_reduction``.
HaloReduction = Literal["cover", "none"]
HALO_REDUCTIONS: tuple[HaloReduction, ...] = get_args(HaloReduction)
#: Why a call on the partition's input features takes every halo row: none of them crosses.
STORED_INPUT = "its input's halo is stored in the partition"


def check_halo_reduction(reduction: str) -> None:
    if reduction not in HALO_REDUCTIONS:
        raise ValueError(f"halo_reduction={reduction!r} is not supported; choose one of {HALO_REDUCTIONS}")


@dataclass(frozen=True)
class ReductionChoice:
    """Whether a call receives partial sums (``cover``), or why it fetches every halo row."""

    cover: bool
    why: str = ""


def choose_reduction(
    option: HaloReduction,
    world_size: int,
    direction: str,
    subset: bool,
    user_sparse: bool,
    reduce: Optional[str],
    linear: bool,
    stored_input: bool = False,
) -> ReductionChoice:
    """Partial sums where they are exact: a linear aggregation of the partition's own in-edges.

    Args:
        option: the strategy's ``halo_reduction``.
        world_size: processes (one: nothing crosses).
        direction: the call's edge set (``"in"`` or the reversed ``"out"``).
        subset: its edges are a subset (``dropout_edge``), which the owners do not know.
        user_sparse: it was given a user's sparse adjacency.
        reduce: its fused aggregation (``None``: it runs on ``edge_index``).
        linear: the layer transforms its rows linearly (no bias) before aggregating
            (:attr:`~lightning_halo.layers.registry.LayerSpec.partial_sums`).
        stored_input: the call reads the partition's input features at once (not per
            propagation step), whose halo rows the partition holds: nothing crosses, and the
            partial sums would only cost a local product.
    """
    if option == "none":
        return ReductionChoice(False, "halo_reduction='none'")
    why = ""
    if world_size == 1:
        why = "one process"
    elif reduce is None:
        why = "not on the fused path"
    elif reduce not in ("sum", "mean"):
        why = f"{reduce} aggregation is not linear"
    elif not linear:
        why = "its rows pass a non-linear transform before the aggregation"
    elif direction != "in":
        why = "reversed edges"
    elif subset:
        why = "edges kept by dropout_edge"
    elif user_sparse:
        why = "a user's sparse adjacency"
    elif stored_input:
        why = STORED_INPUT
    return ReductionChoice(not why, why)


def operator_entries(adj: Tensor, reduce: str, n_inner: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(row, col, value)`` of the linear operator a fused product with ``adj`` applies, inner rows only.

    ``mean`` divides by the row's stored entries, as the fused kernel does
    (:class:`~lightning_halo.layers.fused.FusedAdjacency`).
    """
    plain = adj.plain() if isinstance(adj, FusedAdjacency) else adj
    crow = plain.crow_indices()[: n_inner + 1].long()
    nnz = int(crow[-1])
    col, val = plain.col_indices()[:nnz].long(), plain.values()[:nnz]
    per_row = crow[1:] - crow[:-1]
    row = torch.repeat_interleave(torch.arange(n_inner, device=crow.device), per_row)
    if reduce == "mean":
        val = val / per_row.clamp(min=1).to(val.dtype)[row]
    return row, col, val


def covered_adjacency(
    adj: Tensor, reduce: str, plan: CoverPlan, n_dst: int, dtype: torch.dtype
) -> tuple[FusedAdjacency, Tensor]:
    r"""The adjacency over ``[inner | block]`` and the coefficients of the folded edges (plan order).

    Args:
        adj (Tensor): the call's fused adjacency over ``[inner | halo]`` (rows past the inner ones ignored).
        reduce (str): its aggregation, ``"sum"`` or ``"mean"``.
        plan (CoverPlan): the rank's cover layout.
        n_dst (int): rows of the result (``n_inner``, or ``n_inner + block`` for ``"full"`` feeds).
        dtype (torch.dtype): dtype of the values.

    Returns:
        ``(adjacency, coefficients)``: the adjacency (a linear operator, see
        :meth:`~lightning_halo.layers.fused.FusedAdjacency.as_operator`) and ``[n_folded]``
        values :math:`m_{vu}` of the folded edges.
    """
    n_inner, n_halo = plan.n_inner, plan.n_halo
    row, col, val = operator_entries(adj, reduce, n_inner)
    device = row.device
    h = col - n_inner
    pos = plan.partial_of_col().to(device)
    halo = h >= 0
    block_pos = torch.full_like(col, -1)
    block_pos[halo] = pos[h[halo]]
    folded = halo & (block_pos < 0)  # entries from halo rows that are not fetched
    new_col = torch.where(halo, n_inner + block_pos, col)
    keys, order = torch.sort(row[folded] * max(n_halo, 1) + h[folded])
    want = plan.partial_target.to(device)[plan.folded_partial.to(device)] * max(n_halo, 1) + plan.folded_col.to(device)
    at = torch.searchsorted(keys, want).clamp(max=max(keys.numel() - 1, 0))
    if keys.numel() != want.numel() or (want.numel() and not torch.equal(keys[at], want)):
        raise RuntimeError(
            f"the layer's adjacency has {keys.numel()} entries from folded halo rows, the cover plan {want.numel()}; "
            "its edges are not the partition's in-edges. Use halo_reduction='none'."
        )
    coefficients = val[folded][order][at]
    keep = ~folded
    partial_rows = plan.partial_target.to(device)
    rows = torch.cat([row[keep], partial_rows])
    cols = torch.cat([new_col[keep], n_inner + plan.partial_pos.to(device)])
    vals = torch.cat([val[keep].to(dtype), torch.ones(partial_rows.numel(), dtype=dtype, device=device)])
    return _csr(rows, cols, vals, (n_dst, n_inner + plan.block)).as_operator(), coefficients.to(dtype)


def _csr(rows: Tensor, cols: Tensor, values: Tensor, size: tuple[int, int]) -> FusedAdjacency:
    """A CSR adjacency from distinct ``(row, col)`` entries, with 32-bit indices where they fit
    (half the index memory of the adjacency and of the transpose built from it)."""
    order = torch.argsort(rows * size[1] + cols)
    index = torch.int32 if max(size[1], rows.numel()) < 2**31 - 1 else torch.int64
    crow = torch.zeros(size[0] + 1, dtype=torch.long, device=rows.device)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=size[0]), 0)
    return FusedAdjacency.from_csr(crow.to(index), cols[order].to(index), values[order], size)
