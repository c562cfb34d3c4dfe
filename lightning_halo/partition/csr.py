r"""The CSR adjacency a partition carries, and its transpose: built once when partitioning.

Layers that aggregate with a fused sparse-dense product (``GCNConv``, ``SAGEConv``, ``GINConv``,
...) need the partition's in-edges as a CSR matrix :math:`[n_{in}, n_{src}]` and, for their
backward, its transpose. Building both on every rank at the first step costs a few times
their size in temporaries (sorting ``int64`` keys of every edge) and reads the whole
``edge_index``; so the partition step builds them once, and a rank memory-maps them.

The pattern holds every distinct in-edge ``(target, source)`` of the inner nodes **and** every
inner diagonal ``(i, i)`` (value 0 where the graph has no self-loop), so that one pattern
serves the layers that add self-loops (GCN) and those that do not. Per-layer values are
vectors over the entries: ``edge_slot`` maps each edge of ``edge_index`` to its entry (repeated
edges share one), ``diag_slot`` each inner node to its diagonal entry, and the transpose's
values are the CSR values permuted by ``t_perm``.

=========================  =================  ==================================================
key                        shape              meaning
=========================  =================  ==================================================
``adj_crow``               ``[n_in + 1]``     row offsets (targets)
``adj_col``                ``[nnz]``          source of each entry; rows sorted by source
``adj_edge_slot``          ``[E]``            entry of every edge of ``edge_index``
``adj_diag_slot``          ``[n_in]``         entry of ``(i, i)``
``adj_t_crow``             ``[n_src + 1]``    row offsets of the transpose (sources)
``adj_t_col``              ``[nnz]``          target of each transposed entry, sorted
``adj_t_perm``             ``[nnz]``          CSR entry of each transposed entry
=========================  =================  ==================================================

All are ``int32`` when ``n_src``, ``nnz`` and ``E`` fit (half the bytes), else ``int64``; a row
pointer and its column ids share a dtype, as ``torch.sparse_csr_tensor`` requires.

:func:`partition_csr` builds them in memory; :class:`BlockedCSR` builds the same arrays in
blocks of rows, reading the edges a window at a time, so that the partition step never holds
more than one block's keys (the partition directory writer uses it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Optional

import torch
from torch import Tensor

#: The keys :func:`partition_csr` returns, in storage order.
CSR_KEYS = ("adj_crow", "adj_col", "adj_edge_slot", "adj_diag_slot", "adj_t_crow", "adj_t_col", "adj_t_perm")

#: ``(start, src, dst)`` windows of a part's local edges, in edge order.
EdgeWindows = Callable[[], Iterator[tuple[int, Tensor, Tensor]]]


def index_dtype(n_src: int, nnz: int, num_edges: int) -> torch.dtype:
    """``int32`` when every id and offset fits, else ``int64``.

    Example:
        >>> index_dtype(10, 20, 30), index_dtype(10, 2**31, 30)
        (torch.int32, torch.int64)
    """
    return torch.int32 if max(n_src, nnz, num_edges) < 2**31 - 1 else torch.int64


def _offsets(counts: Tensor, dtype: torch.dtype) -> Tensor:
    out = torch.zeros(counts.numel() + 1, dtype=torch.long)
    torch.cumsum(counts, 0, out=out[1:])
    return out.to(dtype)


def partition_csr(edge_index: Tensor, n_inner: int, n_src: int) -> dict[str, Tensor]:
    r"""The stored CSR of a partition's in-edges (see the module docstring), in memory.

    Args:
        edge_index (Tensor): ``[2, E]`` local edges, sources in :math:`[0, n_{src})`, targets in
            :math:`[0, n_{in})`.
        n_inner (int): inner nodes (rows).
        n_src (int): inner + halo nodes (columns).

    Example:
        >>> csr = partition_csr(torch.tensor([[1, 1, 0], [0, 0, 1]]), 2, 3)  # a repeated edge 1 -> 0
        >>> csr["adj_crow"].tolist(), csr["adj_col"].tolist(), csr["adj_edge_slot"].tolist()
        ([0, 2, 4], [0, 1, 0, 1], [1, 1, 2])
        >>> csr["adj_t_crow"].tolist(), csr["adj_t_col"].tolist(), csr["adj_t_perm"].tolist()
        ([0, 2, 4, 4], [0, 1, 0, 1], [0, 2, 1, 3])
    """
    dst, src = edge_index[1].long(), edge_index[0].long()
    diag = torch.arange(n_inner, dtype=torch.long)
    edge_key = dst * n_src + src
    diag_key = diag * (n_src + 1)
    keys = torch.unique(torch.cat([edge_key, diag_key]))  # sorted by (target, source)
    row = torch.div(keys, n_src, rounding_mode="floor")
    col = keys - row * n_src
    dtype = index_dtype(n_src, keys.numel(), edge_key.numel())
    t_perm = torch.argsort(col * n_inner + row)  # keys are unique: no ties
    return {
        "adj_crow": _offsets(torch.bincount(row, minlength=n_inner), dtype),
        "adj_col": col.to(dtype),
        "adj_edge_slot": torch.searchsorted(keys, edge_key).to(dtype),
        "adj_diag_slot": torch.searchsorted(keys, diag_key).to(dtype),
        "adj_t_crow": _offsets(torch.bincount(col, minlength=n_src), dtype),
        "adj_t_col": row[t_perm].to(dtype),
        "adj_t_perm": t_perm.to(dtype),
    }


def _blocks(weights: Tensor, budget: int) -> list[tuple[int, int]]:
    """Consecutive ``[a, b)`` ranges whose summed weights stay within ``budget`` (a range holds at least one item)."""
    if weights.numel() == 0:
        return []
    ends = torch.cumsum(weights, 0)
    out, a = [], 0
    n = weights.numel()
    while a < n:
        base = int(ends[a - 1]) if a else 0
        b = int(torch.searchsorted(ends, torch.tensor(base + budget), right=True))
        b = min(n, max(a + 1, b))
        out.append((a, b))
        a = b
    return out


class BlockedCSR:
    r"""The arrays of :func:`partition_csr`, built in row blocks of at most ``max_entries`` keys.

    Three passes, each reading the part's edges (``edges()``) once per block: counts (the
    sizes, which the caller needs to lay out its file), then the CSR (:meth:`csr_blocks`),
    then the transpose (:meth:`transpose_blocks`, reading the CSR back). Memory: one block's
    ``int64`` keys and their sort, plus ``O(n_{src})`` counts.

    Args:
        edges (callable): returns a fresh iterator of ``(start, src, dst)`` windows.
        n_inner (int): inner nodes.
        n_src (int): inner + halo nodes.
        num_edges (int): :math:`E`.
        max_entries (int, optional): keys per block. (default: 4M)
    """

    def __init__(self, edges: EdgeWindows, n_inner: int, n_src: int, num_edges: int, max_entries: int = 1 << 22) -> None:
        self.edges, self.n_inner, self.n_src, self.num_edges = edges, n_inner, n_src, num_edges
        self.max_entries = max(1, int(max_entries))
        indeg = torch.ones(n_inner, dtype=torch.long)  # the diagonal entry
        for _, _, dst in edges():
            indeg += torch.bincount(dst, minlength=n_inner)
        self.row_blocks = _blocks(indeg, self.max_entries)
        rows = torch.zeros(n_inner, dtype=torch.long)
        cols = torch.zeros(n_src, dtype=torch.long)
        for a, b, keys, _, _ in self._keys():
            r = torch.div(keys, n_src, rounding_mode="floor")
            rows[a:b] += torch.bincount(r - a, minlength=b - a)
            cols += torch.bincount(keys - r * n_src, minlength=n_src)
        self.nnz = int(rows.sum())
        self.dtype = index_dtype(n_src, self.nnz, num_edges)
        self.crow = _offsets(rows, self.dtype)
        self.t_crow = _offsets(cols, self.dtype)

    def _keys(self) -> Iterator[tuple[int, int, Tensor, list[tuple[Tensor, Tensor]], Tensor]]:
        """Per row block: ``(a, b, sorted unique keys, [(edge positions, edge keys)], diagonal keys)``."""
        n_src = self.n_src
        for a, b in self.row_blocks:
            found, edges = [], []
            for start, src, dst in self.edges():
                sel = torch.nonzero((dst >= a) & (dst < b)).view(-1)
                if sel.numel():
                    key = dst[sel] * n_src + src[sel]
                    found.append(key)
                    edges.append((sel + start, key))
            diag = torch.arange(a, b, dtype=torch.long) * (n_src + 1)
            yield a, b, torch.unique(torch.cat([*found, diag])), edges, diag

    def csr_blocks(self) -> Iterator[tuple[int, Tensor, list[tuple[Tensor, Tensor]], tuple[int, Tensor]]]:
        """Per row block: ``(first entry, adj_col values, [(edge positions, adj_edge_slot values)], (first row, adj_diag_slot values))``."""
        first = 0
        for a, _, keys, edges, diag in self._keys():
            col = keys - torch.div(keys, self.n_src, rounding_mode="floor") * self.n_src
            slots = [(pos, (first + torch.searchsorted(keys, key)).to(self.dtype)) for pos, key in edges]
            yield first, col.to(self.dtype), slots, (a, (first + torch.searchsorted(keys, diag)).to(self.dtype))
            first += keys.numel()

    def transpose_blocks(self, col_of: Callable[[int, int], Tensor]) -> Iterator[tuple[int, Tensor, Tensor]]:
        """Per block of sources: ``(first transposed entry, adj_t_col values, adj_t_perm values)``.

        ``col_of(lo, hi)`` reads back ``adj_col[lo:hi]`` (as written by the caller).
        """
        row_of_entry = self.crow.long()
        entry_windows = [(lo, min(self.nnz, lo + self.max_entries)) for lo in range(0, self.nnz, self.max_entries)]
        t_counts = self.t_crow.long()[1:] - self.t_crow.long()[:-1]
        for c0, c1 in _blocks(t_counts, self.max_entries):
            keys, perms = [], []
            for lo, hi in entry_windows:
                col = col_of(lo, hi).long()
                sel = torch.nonzero((col >= c0) & (col < c1)).view(-1)
                if sel.numel():
                    entry = sel + lo
                    row = torch.searchsorted(row_of_entry, entry, right=True) - 1
                    keys.append(col[sel] * self.n_inner + row)
                    perms.append(entry)
            if not keys:
                continue
            key, entry = torch.cat(keys), torch.cat(perms)
            order = torch.argsort(key)
            first = int(self.t_crow[c0])
            row = key[order] - torch.div(key[order], self.n_inner, rounding_mode="floor") * self.n_inner
            yield first, row.to(self.dtype), entry[order].to(self.dtype)


def csr_from_windows(edges: EdgeWindows, n_inner: int, n_src: int, num_edges: int, max_entries: int = 1 << 22) -> dict[str, Tensor]:
    """:class:`BlockedCSR` assembled in memory (what the writer streams to a file): equals :func:`partition_csr`."""
    b = BlockedCSR(edges, n_inner, n_src, num_edges, max_entries)
    col = torch.empty(b.nnz, dtype=b.dtype)
    slot = torch.empty(num_edges, dtype=b.dtype)
    diag = torch.empty(n_inner, dtype=b.dtype)
    for first, c, slots, (a, d) in b.csr_blocks():
        col[first : first + c.numel()] = c
        for pos, s in slots:
            slot[pos] = s
        diag[a : a + d.numel()] = d
    t_col = torch.empty(b.nnz, dtype=b.dtype)
    t_perm = torch.empty(b.nnz, dtype=b.dtype)
    for first, tc, tp in b.transpose_blocks(lambda lo, hi: col[lo:hi]):
        t_col[first : first + tc.numel()] = tc
        t_perm[first : first + tp.numel()] = tp
    return dict(zip(CSR_KEYS, (b.crow, col, slot, diag, b.t_crow, t_col, t_perm)))


def sizes(n_inner: int, n_src: int, nnz: int, num_edges: int) -> dict[str, int]:
    """The length of every array of :data:`CSR_KEYS`.

    Example:
        >>> sizes(2, 3, 4, 3)["adj_t_crow"]
        4
    """
    return dict(zip(CSR_KEYS, (n_inner + 1, nnz, num_edges, n_inner, n_src + 1, nnz, nnz)))


def stored_csr_bytes(csr: dict[str, Tensor], keys: Optional[tuple[str, ...]] = None) -> int:
    """Bytes of the stored arrays (all of :data:`CSR_KEYS`, or ``keys``)."""
    return sum(csr[k].numel() * csr[k].element_size() for k in (keys or CSR_KEYS))
