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

from lightning_halo.exchange.cover import CoverPlan
from lightning_halo.layers.fused import FusedAdjacency
from lightning_halo.layers.reasons import ReductionReason

#: How halo rows cross the wire: see :class:`~lightning_halo.HaloQuantStrategy`'s ``halo_reduction``.
HaloReduction = Literal["cover", "none"]
HALO_REDUCTIONS: tuple[HaloReduction, ...] = get_args(HaloReduction)


def check_halo_reduction(reduction: str) -> None:
    if reduction not in HALO_REDUCTIONS:
        raise ValueError(f"halo_reduction={reduction!r} is not supported; choose one of {HALO_REDUCTIONS}")


@dataclass(frozen=True)
class ReductionChoice:
    """Whether a call receives partial sums (``cover``), or why it fetches every halo row (``reason``)."""

    cover: bool
    reason: Optional[ReductionReason] = None
    reduce: str = ""  # the aggregation a reason is about

    @property
    def why(self) -> str:
        """The reason in words (empty when it receives partial sums)."""
        return "" if self.reason is None else self.reason.text(self.reduce)


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
    why: Optional[ReductionReason] = None
    if option == "none":
        why = ReductionReason.OPTION
    elif world_size == 1:
        why = ReductionReason.ONE_PROCESS
    elif reduce is None:
        why = ReductionReason.NOT_FUSED
    elif reduce not in ("sum", "mean"):
        why = ReductionReason.NOT_LINEAR
    elif not linear:
        why = ReductionReason.NONLINEAR_TRANSFORM
    elif direction != "in":
        why = ReductionReason.REVERSED
    elif subset:
        why = ReductionReason.EDGE_SUBSET
    elif user_sparse:
        why = ReductionReason.USER_SPARSE
    elif stored_input:
        why = ReductionReason.STORED_INPUT
    return ReductionChoice(why is None, why, reduce or "")


def operator_entries(adj: Tensor, reduce: str, first: int, stop: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(row, col, value)`` of the linear operator a fused product with ``adj`` applies, rows ``[first, stop)``.

    ``mean`` divides by the row's stored entries, as the fused kernel does
    (:class:`~lightning_halo.layers.fused.FusedAdjacency`).
    """
    plain = adj.plain() if isinstance(adj, FusedAdjacency) else adj
    crow = plain.crow_indices()[first : stop + 1].long()
    lo, hi = int(crow[0]), int(crow[-1])
    col, val = plain.col_indices()[lo:hi].long(), plain.values()[lo:hi]
    per_row = crow[1:] - crow[:-1]
    row = torch.repeat_interleave(torch.arange(first, stop, device=crow.device), per_row)
    if reduce == "mean":
        val = val / per_row.clamp(min=1).to(val.dtype)[row - first]
    return row, col, val


def _row_windows(adj: Tensor, n_rows: int, entries: int) -> list[tuple[int, int]]:
    """Consecutive row ranges of about ``entries`` stored entries each (bounded temporaries)."""
    plain = adj.plain() if isinstance(adj, FusedAdjacency) else adj
    crow = plain.crow_indices()[: n_rows + 1].long()
    cuts = torch.searchsorted(crow, torch.arange(0, int(crow[-1]) + 1, max(entries, 1), device=crow.device)).tolist()
    bounds = sorted({0, n_rows, *(min(max(c, 0), n_rows) for c in cuts)})
    return list(zip(bounds[:-1], bounds[1:]))


@dataclass
class _Covered:
    """The covered adjacency's arrays, filled a row window at a time."""

    col: Tensor
    val: Tensor
    counts: Tensor
    folded: list[tuple[Tensor, Tensor, Tensor]]  # (row, halo row, value) of folded entries
    dest: Optional[Tensor] = None  # entry of the result each entry of ``adj`` went to (-1: folded)
    partial_dest: Optional[Tensor] = None  # entry of the result of each partial sum's edge
    at: int = 0


def _cover_window(
    adj: Tensor, reduce: str, plan: CoverPlan, rows: tuple[int, int], partials: tuple[Tensor, Tensor], out: _Covered
) -> None:
    """Rows ``[first, stop)`` of the covered adjacency: fetched halo columns remapped into the block,
    folded ones dropped (their values kept as coefficients), one entry per partial sum added."""
    first, stop = rows
    n_inner = plan.n_inner
    row, col, val = operator_entries(adj, reduce, first, stop)
    halo = col >= n_inner
    block_pos = torch.full_like(col, -1)
    block_pos[halo] = plan.partial_of_col().to(col.device)[col[halo] - n_inner]
    folded = halo & (block_pos < 0)  # entries from halo rows that are not fetched
    out.folded.append((row[folded], col[folded] - n_inner, val[folded]))
    keep = ~folded
    p_rows, p_cols = partials
    sel = (p_rows >= first) & (p_rows < stop)
    rows_all = torch.cat([row[keep], p_rows[sel]])
    cols_all = torch.cat([torch.where(halo, n_inner + block_pos, col)[keep], p_cols[sel]])
    vals_all = torch.cat([val[keep], torch.ones(int(sel.sum()), dtype=val.dtype, device=val.device)])
    order = torch.argsort(rows_all * (n_inner + plan.block) + cols_all)
    n = order.numel()
    out.col[out.at : out.at + n] = cols_all[order].to(out.col.dtype)
    out.val[out.at : out.at + n] = vals_all[order].to(out.val.dtype)
    if out.dest is not None and out.partial_dest is not None:  # where each entry went, for the transpose
        place = torch.empty_like(order)
        place[order] = torch.arange(out.at, out.at + n, device=order.device)
        window_dest = torch.full((row.numel(),), -1, dtype=out.dest.dtype, device=row.device)
        window_dest[keep] = place[: int(keep.sum())].to(out.dest.dtype)
        start = int(_entry_offset(adj, first))
        out.dest[start : start + row.numel()] = window_dest
        out.partial_dest[torch.nonzero(sel).view(-1)] = place[int(keep.sum()) :].to(out.partial_dest.dtype)
    out.counts[first:stop] = torch.bincount(rows_all - first, minlength=stop - first)
    out.at += n


def _entry_offset(adj: Tensor, row: int) -> int:
    plain = adj.plain() if isinstance(adj, FusedAdjacency) else adj
    return int(plain.crow_indices()[row])


def _segments(starts: Tensor, lengths: Tensor) -> Tensor:
    """``cat([arange(s, s + l) for s, l in zip(starts, lengths)])``, vectorized."""
    total = int(lengths.sum())
    if not total:
        return torch.empty(0, dtype=torch.long, device=starts.device)
    shift = torch.repeat_interleave(starts - (torch.cumsum(lengths, 0) - lengths), lengths)
    return shift + torch.arange(total, device=starts.device)


def _covered_transpose(
    pattern: tuple[Tensor, Tensor, Tensor], plan: CoverPlan, out: _Covered, index: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
    """The covered adjacency's transpose pattern from ``adj``'s: its rows of inner sources and of
    fetched halo rows (moved to their block positions), a one-entry row per partial sum; no sort."""
    t_crow, t_col, t_perm = pattern[0].long(), pattern[1], pattern[2]  # the big two stay as stored (no copies)
    n_inner, device = plan.n_inner, t_crow.device
    assert out.dest is not None and out.partial_dest is not None
    base_len = t_crow[1:] - t_crow[:-1]
    kept_rows = n_inner + plan.kept_cols.to(device)
    counts = torch.zeros(n_inner + plan.block, dtype=torch.long, device=device)
    counts[:n_inner] = base_len[:n_inner]
    counts[n_inner + plan.kept_pos.to(device)] = base_len[kept_rows]
    counts[n_inner + plan.partial_pos.to(device)] = 1
    crow = torch.zeros(counts.numel() + 1, dtype=torch.long, device=device)
    crow[1:] = torch.cumsum(counts, 0)
    col = torch.empty(int(crow[-1]), dtype=index, device=device)
    perm = torch.empty(int(crow[-1]), dtype=index, device=device)
    inner = int(t_crow[n_inner])
    for lo in range(0, inner, 1 << 20):  # the inner sources' rows keep their place: copied a window at a time
        hi = min(lo + (1 << 20), inner)
        col[lo:hi] = t_col[lo:hi]
        perm[lo:hi] = out.dest[t_perm[lo:hi].long()]
    src = _segments(t_crow[kept_rows], base_len[kept_rows])
    dst = _segments(crow[n_inner + plan.kept_pos.to(device)], base_len[kept_rows])
    col[dst], perm[dst] = t_col[src].to(index), out.dest[t_perm[src].long()].to(index)
    at = crow[n_inner + plan.partial_pos.to(device)]
    col[at], perm[at] = plan.partial_target.to(device).to(index), out.partial_dest.to(index)
    return crow.to(index), col, perm


def _coefficients(plan: CoverPlan, folded: list[tuple[Tensor, Tensor, Tensor]], device: torch.device) -> Tensor:
    """The folded entries' values in the plan's order (the order the owners expect them in)."""
    n_halo = max(plan.n_halo, 1)
    if not folded:  # no rows (a target type without nodes here)
        folded = [(torch.empty(0, dtype=torch.long, device=device),) * 2 + (torch.empty(0, device=device),)]
    row, h, val = (torch.cat(parts) for parts in zip(*folded))
    keys, order = torch.sort(row * n_halo + h)
    want = plan.partial_target.to(device)[plan.folded_partial.to(device)] * n_halo + plan.folded_col.to(device)
    at = torch.searchsorted(keys, want).clamp(max=max(keys.numel() - 1, 0))
    if keys.numel() != want.numel() or (want.numel() and not torch.equal(keys[at], want)):
        raise RuntimeError(
            f"the layer's adjacency has {keys.numel()} entries from folded halo rows, the cover plan {want.numel()}; "
            "its edges are not the partition's in-edges. Use halo_reduction='none'."
        )
    return val[order][at]


def covered_adjacency(
    adj: Tensor, reduce: str, plan: CoverPlan, n_dst: int, dtype: torch.dtype, window: int = 1 << 20,
    n_rows: Optional[int] = None,
) -> tuple[FusedAdjacency, Tensor]:  # fmt: skip
    r"""The adjacency over ``[inner | block]`` and the coefficients of the folded edges (plan order).

    Built a window of rows at a time into arrays of the final size (32-bit indices where they
    fit), so building it costs the result and a few windows, not several copies of the edges.

    Args:
        adj (Tensor): the call's fused adjacency over ``[inner | halo]`` (rows past the inner ones ignored).
        reduce (str): its aggregation, ``"sum"`` or ``"mean"``.
        plan (CoverPlan): the rank's cover layout.
        n_dst (int): rows of the result (``n_inner``, or ``n_inner + block`` for ``"full"`` feeds).
        dtype (torch.dtype): dtype of the values.
        window (int, optional): stored entries per window. (default: ``2**20``)
        n_rows (int, optional): the rows of ``adj`` that are inner targets: the target type's inner
            nodes for a relation between two node types (:meth:`CoverPlan.relation_view`). (default:
            ``plan.n_inner``)

    Returns:
        ``(adjacency, coefficients)``: the adjacency (a linear operator, see
        :meth:`~lightning_halo.layers.fused.FusedAdjacency.as_operator`) and ``[n_folded]``
        values :math:`m_{vu}` of the folded edges.
    """
    n_inner, size = plan.n_inner, (n_dst, plan.n_inner + plan.block)
    rows = plan.n_inner if n_rows is None else n_rows
    plain = adj.plain() if isinstance(adj, FusedAdjacency) else adj
    device = plain.values().device
    base = int(plain.crow_indices()[rows])
    nnz = base - plan.folded_col.numel() + plan.partial_target.numel()
    index = torch.int32 if max(size[1], nnz, base) < 2**31 - 1 else torch.int64
    out = _Covered(torch.empty(nnz, dtype=index, device=device), torch.empty(nnz, dtype=dtype, device=device),
                   torch.zeros(n_dst, dtype=torch.long, device=device), [])  # fmt: skip
    pattern = adj.transpose_pattern() if isinstance(adj, FusedAdjacency) else None
    if pattern is not None:  # its transpose follows from adj's: no conversion (memory)
        out.dest = torch.empty(base, dtype=index, device=device)
        out.partial_dest = torch.empty(plan.partial_target.numel(), dtype=index, device=device)
    partials = (plan.partial_target.to(device), n_inner + plan.partial_pos.to(device))
    for window_rows in _row_windows(adj, rows, window):
        _cover_window(adj, reduce, plan, window_rows, partials, out)
    if out.at != nnz:
        raise RuntimeError(f"the covered adjacency has {out.at} entries, {nnz} were expected; use halo_reduction='none'")
    crow = torch.zeros(n_dst + 1, dtype=torch.long, device=device)
    crow[1:] = torch.cumsum(out.counts, 0)
    transpose = _covered_transpose(pattern, plan, out, index) if out.dest is not None and pattern is not None else None
    out.dest = out.partial_dest = None
    covered = FusedAdjacency.from_csr(crow.to(index), out.col, out.val, size, transpose).as_operator()
    return covered, _coefficients(plan, out.folded, device).to(dtype)
