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

:func:`partition_csr` builds them in memory; :class:`BlockedCSR` builds the same arrays a
block of rows at a time through temporary files, reading the edges a window at a time, so that
the partition step never holds more than one block (the partition directory writer uses it).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from lightning_halo.partition.chunks import trim_heap
from lightning_halo.partition.sorting import sorted_unique, stable_argsort

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
    keys = sorted_unique(torch.cat([edge_key, diag_key]))  # sorted by (target, source)
    row = torch.div(keys, n_src, rounding_mode="floor")
    col = keys - row * n_src
    dtype = index_dtype(n_src, keys.numel(), edge_key.numel())
    t_perm = stable_argsort(col, n_src)  # entries are in (row, source) order: stable by source is (source, row)
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


def _block_of(blocks: list[tuple[int, int]], n: int) -> Tensor:
    """``[n]``: the block of every row."""
    out = torch.empty(n, dtype=torch.int32)
    for i, (a, b) in enumerate(blocks):
        out[a:b] = i
    return out


class _Buckets:
    """One append-only temporary file of ``int64`` records (``width`` per record) per block."""

    def __init__(self, directory: Path, name: str, count: int, width: int) -> None:
        self.paths = [directory / f"{name}-{i}.bin" for i in range(count)]
        self.files = [open(path, "wb") for path in self.paths]  # noqa: SIM115 - closed in close()
        self.width = width

    def add(self, block: Tensor, count: int, *columns: Tensor) -> None:
        """Append the records ``columns`` (one row each), grouped by their ``block``."""
        order = stable_argsort(block.long(), count)
        records = torch.stack([c[order] for c in columns], dim=1).numpy()
        sizes = torch.bincount(block.long(), minlength=count).tolist()
        at = 0
        for i, n in enumerate(sizes):
            if n:
                records[at : at + n].tofile(self.files[i])
                at += n

    def close(self) -> None:
        for f in self.files:
            f.close()

    def read(self, i: int) -> Tensor:
        """Block ``i``'s records, ``[n, width]``, in the order they were added; the file is removed."""
        rec = np.fromfile(self.paths[i], dtype=np.int64).reshape(-1, self.width)
        self.paths[i].unlink()
        return torch.from_numpy(rec)


def _first_of_runs(sorted_keys: Tensor) -> Tensor:
    keep = torch.ones(sorted_keys.numel(), dtype=torch.bool)
    if sorted_keys.numel() > 1:
        torch.ne(sorted_keys[1:], sorted_keys[:-1], out=keep[1:])
    return keep


class BlockedCSR:
    r"""The arrays of :func:`partition_csr`, built a block of rows at a time through temporary files.

    Bounded memory for a part of any size: one scan counts the in-degrees (which set blocks of
    at most ``max_entries`` edges), a second scan appends every edge's ``(position, key)`` to
    its row block's file; each block is then sorted on its own (its distinct keys are the CSR
    entries, its sort's runs the edges' slots). The transpose (:meth:`transpose`) reads the
    written CSR back once, appends every entry to its source block's file, and orders each
    block by source, stably. Memory: one block and one window of edges; disk: 16 bytes per
    edge and 24 per entry, temporarily, in ``workdir``.

    Args:
        edges (callable): returns a fresh iterator of ``(start, src, dst)`` windows.
        n_inner (int): inner nodes.
        n_src (int): inner + halo nodes.
        num_edges (int): :math:`E`.
        workdir (Path): an empty directory for the temporary files.
        max_entries (int, optional): edges (or entries) per block. (default: 2M)
    """

    def __init__(self, edges: EdgeWindows, n_inner: int, n_src: int, num_edges: int, workdir: Path,
                 max_entries: int = 1 << 21) -> None:  # fmt: skip
        self.n_inner, self.n_src, self.num_edges, self.workdir = n_inner, n_src, num_edges, Path(workdir)
        self.max_entries = max(1, int(max_entries), num_edges // 256)  # at most a few hundred files
        indeg = torch.ones(n_inner, dtype=torch.long)  # the diagonal entry
        for _, _, dst in edges():
            indeg += torch.bincount(dst, minlength=n_inner)
        blocks = _blocks(indeg, self.max_entries)
        buckets = _Buckets(self.workdir, "rows", len(blocks), 2)
        block_of = _block_of(blocks, n_inner)
        for start, src, dst in edges():
            pos = torch.arange(start, start + src.numel(), dtype=torch.long)
            buckets.add(block_of[dst], len(blocks), pos, dst * n_src + src)
        buckets.close()
        self.dtype = index_dtype(n_src, int(indeg.sum()), num_edges)
        self._col = open(self.workdir / "col.bin", "wb")  # noqa: SIM115
        self._slot = np.lib.format.open_memmap(self.workdir / "slot.npy", "w+", _np(self.dtype), (num_edges,))
        self._diag = torch.empty(n_inner, dtype=self.dtype)
        rows = torch.zeros(n_inner, dtype=torch.long)
        cols = torch.zeros(n_src, dtype=torch.long)
        first = 0
        for i, (a, b) in enumerate(blocks):
            first += self._row_block(buckets.read(i), a, b, first, rows, cols)
            trim_heap()  # the block's freed temporaries go back to the system before the next one
        self._col.close()
        self._slot.flush()
        self.nnz = first
        self.crow = _offsets(rows, self.dtype)
        self.t_crow = _offsets(cols, self.dtype)

    def _row_block(self, rec: Tensor, a: int, b: int, first: int, rows: Tensor, cols: Tensor) -> int:
        """Entries of rows ``[a, b)``: their sources appended, the edges' and diagonal's slots set; returns their count."""
        n_src, n_edges = self.n_src, rec.size(0)
        diag = torch.arange(a, b, dtype=torch.long) * (n_src + 1)
        keys = torch.cat([rec[:, 1], diag])
        order = stable_argsort(keys - a * n_src, (b - a) * n_src)
        runs = _first_of_runs(keys[order])
        uniq = keys[order][runs]
        slot = torch.empty_like(order)
        slot[order] = first + torch.cumsum(runs, 0) - 1
        if n_edges:
            self._slot[rec[:, 0].numpy()] = slot[:n_edges].to(self.dtype).numpy()
        self._diag[a:b] = slot[n_edges:].to(self.dtype)
        row = torch.div(uniq, n_src, rounding_mode="floor")
        col = uniq - row * n_src
        col.to(self.dtype).numpy().tofile(self._col)
        rows[a:b] += torch.bincount(row - a, minlength=b - a)
        cols += torch.bincount(col, minlength=n_src)
        return int(uniq.numel())

    def copy_csr(self, write: Callable[[str, Tensor, int], None], window: int = 1 << 22) -> None:
        """Hand ``adj_col``, ``adj_edge_slot`` and ``adj_diag_slot`` to ``write(key, values, first)``, a window at a time."""
        col = np.memmap(self.workdir / "col.bin", dtype=_np(self.dtype), mode="r", shape=(self.nnz,)) if self.nnz else None
        for key, array, n in (("adj_col", col, self.nnz), ("adj_edge_slot", self._slot, self.num_edges)):
            for lo in range(0, n, window):
                write(key, torch.from_numpy(np.array(array[lo : lo + window])), lo)  # type: ignore[index]
        write("adj_diag_slot", self._diag, 0)
        del col, self._slot

    def transpose(self, col_of: Callable[[int, int], Tensor], write: Callable[[str, Tensor, int], None]) -> None:
        """Hand ``adj_t_col`` and ``adj_t_perm`` to ``write``; ``col_of(lo, hi)`` reads back ``adj_col[lo:hi]``."""
        t_counts = self.t_crow.long()[1:] - self.t_crow.long()[:-1]
        blocks = _blocks(t_counts, self.max_entries)
        buckets = _Buckets(self.workdir, "cols", len(blocks), 3)
        block_of = _block_of(blocks, self.n_src)
        crow = self.crow.long()
        for lo in range(0, self.nnz, self.max_entries):
            hi = min(self.nnz, lo + self.max_entries)
            col = col_of(lo, hi).long()
            r0 = int(torch.searchsorted(crow, torch.tensor(lo), right=True)) - 1
            r1 = int(torch.searchsorted(crow, torch.tensor(hi), right=False))
            per_row = (crow[r0 + 1 : r1 + 1].clamp(lo, hi) - crow[r0:r1].clamp(lo, hi))
            row = torch.repeat_interleave(torch.arange(r0, r1), per_row)
            buckets.add(block_of[col], len(blocks), col, row, torch.arange(lo, hi))
        buckets.close()
        for i, (c0, c1) in enumerate(blocks):
            rec = buckets.read(i)  # in entry order, i.e. by (row, source): stable by source is (source, row)
            order = stable_argsort(rec[:, 0] - c0, c1 - c0)
            first = int(self.t_crow[c0])
            write("adj_t_col", rec[order, 1].to(self.dtype), first)
            write("adj_t_perm", rec[order, 2].to(self.dtype), first)
            trim_heap()


def _np(dtype: torch.dtype) -> type:
    return np.int32 if dtype == torch.int32 else np.int64


def csr_from_windows(edges: EdgeWindows, n_inner: int, n_src: int, num_edges: int, max_entries: int = 1 << 21) -> dict[str, Tensor]:
    """:class:`BlockedCSR` assembled in memory (what the writer streams to a file): equals :func:`partition_csr`."""
    with tempfile.TemporaryDirectory(prefix="lightning-halo-csr-") as tmp:
        b = BlockedCSR(edges, n_inner, n_src, num_edges, Path(tmp), max_entries)
        out = {key: torch.empty(size, dtype=b.dtype) for key, size in sizes(n_inner, n_src, b.nnz, num_edges).items()}
        out["adj_crow"], out["adj_t_crow"] = b.crow, b.t_crow

        def write(key: str, values: Tensor, first: int) -> None:
            out[key][first : first + values.numel()] = values

        b.copy_csr(write, window=max(1, max_entries))
        b.transpose(lambda lo, hi: out["adj_col"][lo:hi], write)
    return {key: out[key] for key in CSR_KEYS}


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
