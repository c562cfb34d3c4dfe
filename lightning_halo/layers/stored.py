r"""Fused adjacencies from the CSR a partition stores: no sort and no transpose at run time.

A partition carries the CSR of its in-edges and its transpose, built once when partitioning
(:mod:`lightning_halo.partition.csr`; every distinct edge plus the inner diagonal). A layer's
fused adjacency then only needs its *values*, a vector over the stored entries, computed from
per-edge weights by one ``index_add`` through ``adj_edge_slot``; the transpose's values are the
same vector permuted by ``adj_t_perm``. The result equals
:meth:`~lightning_halo.layers.fused.FusedAdjacency.build` on the partition's edges (tested):
entries without an edge hold an exact ``0``, which adds nothing to a sum, and torch's ``mean``
(divide by the stored entries of the row) is compensated in the values as there.

``max`` and ``min`` aggregations would see the zero entries, so they (and the edge sets built
at run time: reversed edges, a user's sparse adjacency) keep the build path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from lightning_halo.layers.fused import FusedAdjacency
from lightning_halo.partition.csr import CSR_KEYS
from lightning_halo.partition.halo_partition import HaloPartition


@dataclass(frozen=True)
class StoredCSR:
    """The stored CSR of a partition's in-edges (the arrays of :data:`~lightning_halo.partition.csr.CSR_KEYS`).

    Args:
        crow, col, edge_slot, diag_slot, t_crow, t_col, t_perm: the stored arrays.
        n_inner: inner nodes (rows).
        n_src: inner + halo nodes (columns).
    """

    crow: Tensor
    col: Tensor
    edge_slot: Tensor
    diag_slot: Tensor
    t_crow: Tensor
    t_col: Tensor
    t_perm: Tensor
    n_inner: int
    n_src: int

    @staticmethod
    def of(part: HaloPartition) -> Optional[StoredCSR]:
        """The partition's stored CSR, or ``None`` if it carries none (or not for its current edges)."""
        arrays = [part.get(key) for key in CSR_KEYS]
        if not all(isinstance(a, Tensor) for a in arrays):
            return None
        n_inner = int(part.n_inner)
        stored = StoredCSR(*arrays, n_inner=n_inner, n_src=n_inner + int(part.n_halo))  # type: ignore[arg-type]
        if stored.edge_slot.numel() != part.edge_index.size(1) or stored.crow.numel() != n_inner + 1:
            return None
        return stored

    @property
    def nnz(self) -> int:
        return int(self.col.numel())

    def entry_sums(self, weight: Optional[Tensor], dtype: torch.dtype, slots: Optional[Tensor] = None) -> Tensor:
        """Per entry, the summed weights of its edges (their count without ``weight``); ``[nnz]``."""
        slots = self.edge_slot if slots is None else slots
        device = self.col.device
        values = torch.ones(slots.numel(), dtype=dtype, device=device) if weight is None else weight.to(dtype)
        return torch.zeros(self.nnz, dtype=dtype, device=device).index_add_(0, slots.long(), values)

    def raw(self, weight: Optional[Tensor], reduce: str, n_dst: int, dtype: torch.dtype) -> Optional[FusedAdjacency]:
        """The adjacency of the edges with ``weight`` for ``reduce`` (``"sum"`` or ``"mean"``), else ``None``."""
        if reduce not in ("sum", "mean"):
            return None
        values = self.entry_sums(weight, dtype)
        if reduce == "mean":  # PyG divides by the in-edges of the row, torch by its stored entries
            per_row = self.crow.long()[1:] - self.crow.long()[:-1]
            counts = self.entry_sums(None, dtype) if weight is not None else values
            row = torch.repeat_interleave(torch.arange(self.n_inner, device=values.device), per_row)
            deg = torch.zeros(self.n_inner, dtype=dtype, device=values.device).index_add_(0, row, counts).clamp(min=1)
            values = values * (per_row.to(dtype) / deg)[row]
        return self.adjacency(values, n_dst)

    def normalized(
        self, edge_index: Tensor, ei: Tensor, weight: Tensor, n_dst: int, self_loops: bool
    ) -> Optional[FusedAdjacency]:
        """The adjacency of GCN-normalised edges ``(ei, weight)`` computed from ``edge_index``.

        :func:`~lightning_halo.layers.normalize.gcn_weights` returns ``edge_index`` itself
        without self-loops, and with them PyG's ``add_remaining_self_loops`` layout: the
        non-loop edges in order, then one loop per inner node. Anything else: ``None``.
        """
        if not self_loops:
            if ei is not edge_index and not torch.equal(ei, edge_index):
                return None
            return self.adjacency(self.entry_sums(weight, weight.dtype), n_dst)
        keep = edge_index[0] != edge_index[1]
        kept = int(keep.sum())
        loops = torch.arange(self.n_inner, device=ei.device)
        if ei.size(1) != kept + self.n_inner or not torch.equal(ei[:, kept:], torch.stack([loops, loops])):
            return None
        if not torch.equal(ei[:, :kept], edge_index[:, keep]):  # O(E), still far cheaper than a sort
            return None
        slots = torch.cat([self.edge_slot[keep], self.diag_slot])
        return self.adjacency(self.entry_sums(weight, weight.dtype, slots), n_dst)

    def adjacency(self, values: Tensor, n_dst: int) -> FusedAdjacency:
        """The ``[n_dst, n_src]`` adjacency with these entry values (rows past the inner nodes are empty)."""
        crow = self.crow
        if n_dst > self.n_inner:
            crow = torch.cat([crow, crow[-1:].expand(n_dst - self.n_inner)])
        return FusedAdjacency.from_csr(crow, self.col, values, (n_dst, self.n_src), (self.t_crow, self.t_col, self.t_perm))
