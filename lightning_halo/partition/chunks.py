"""Read big, possibly memory-mapped tensors one window at a time without keeping their pages.

A tensor loaded with ``torch.load(path, mmap=True)`` (or ``np.load(path, mmap_mode="r")``) costs
no memory until it is read, but every page read stays in the process's resident set while the
mapping lives. Partitioning reads each array of a graph once or twice from end to end, so
without care the partition step would end up holding the whole graph after all. Each window
read here is copied out and its pages are handed back with ``madvise(MADV_DONTNEED)`` -- only
for file mappings that cannot hold unsaved writes (read-only ones, or files this package
mapped itself for reading), never for ordinary memory. On other systems it is a no-op.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

import torch
from torch import Tensor

#: Bytes per window when streaming through an array (rows are never split).
CHUNK_BYTES = 16 << 20

_RELEASE_MIN_BYTES = 1 << 20  # smaller windows are not worth a /proc read and a syscall
_owned: set[tuple[int, int, str]] = set()  # (start, end, path) of mappings made by mapped_for_reading


@contextmanager
def mapped_for_reading(path: str | os.PathLike) -> Iterator[None]:
    """Mark the mappings of ``path`` created inside this block as read-only by contract.

    Use around ``torch.load(path, mmap=True)`` (whose private mappings are writable) when
    nothing will ever write to the tensors: their pages may then be released after reading.
    Mappings of the same file made elsewhere (e.g. by the user) are not affected.
    """
    real = os.path.realpath(path)
    before = set(_file_mappings(real))
    yield
    _owned.update(m for m in _file_mappings(real) if m not in before)


def windows(n: int, step: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` windows of at most ``step`` covering ``[0, n)``.

    Example:
        >>> list(windows(5, 2))
        [(0, 2), (2, 4), (4, 5)]
    """
    step = max(1, int(step))
    for start in range(0, n, step):
        yield start, min(n, start + step)


def rows_per_window(t: Tensor, chunk_bytes: Optional[int] = None) -> int:
    """How many rows of ``t`` fit in one window of ``chunk_bytes`` (at least one)."""
    row = t.element_size() * (t[0].numel() if t.dim() > 1 and t.size(0) else 1)
    return max(1, (chunk_bytes or CHUNK_BYTES) // max(1, row))


def read_rows(t: Tensor, start: int, stop: int) -> Tensor:
    """A private copy of ``t[start:stop]``; the window's mapped pages are released afterwards."""
    view = t[start:stop]
    out = view.clone(memory_format=torch.contiguous_format)
    release_pages(view)
    return out


def iter_rows(t: Tensor, chunk_bytes: Optional[int] = None) -> Iterator[tuple[int, Tensor]]:
    """``(start, rows)`` for consecutive windows of ``t`` (private copies, pages released)."""
    for start, stop in windows(t.size(0), rows_per_window(t, chunk_bytes)):
        yield start, read_rows(t, start, stop)


def iter_edges(edge_index: Tensor, chunk_edges: Optional[int] = None) -> Iterator[tuple[int, Tensor, Tensor]]:
    """``(start, src, dst)`` as ``int64`` for consecutive windows of a ``[2, E]`` edge list."""
    step = chunk_edges or max(1, CHUNK_BYTES // 16)
    for start, stop in windows(edge_index.size(1), step):
        yield start, read_rows(edge_index[0], start, stop).long(), read_rows(edge_index[1], start, stop).long()


def release_pages(t: Tensor) -> None:
    """Drop the resident pages of ``t``'s bytes if they belong to a releasable file mapping."""
    nbytes = t.numel() * t.element_size()
    if nbytes < _RELEASE_MIN_BYTES or t.device.type != "cpu" or not t.is_contiguous() or not sys.platform.startswith("linux"):
        return
    start = t.data_ptr()
    if not _releasable(start, start + nbytes):
        return
    page = mmap.PAGESIZE
    lo = (start + page - 1) // page * page  # whole pages inside the window only
    hi = (start + nbytes) // page * page
    if hi > lo:
        _libc().madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), mmap.MADV_DONTNEED)


def _maps() -> Iterator[tuple[int, int, str, str]]:
    """``(start, end, permissions, path)`` of every mapping of this process (Linux)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                lo, hi = (int(v, 16) for v in fields[0].split("-"))
                yield lo, hi, fields[1], fields[5].strip() if len(fields) > 5 else ""
    except OSError:
        return


def _file_mappings(path: str) -> list[tuple[int, int, str]]:
    return [(lo, hi, p) for lo, hi, _, p in _maps() if p == path]


def _releasable(start: int, stop: int) -> bool:
    for lo, hi, perms, path in _maps():
        if lo <= start and stop <= hi:
            if not path.startswith("/"):
                return False  # anonymous memory: releasing it would zero it
            return perms[1] == "-" or (lo, hi, path) in _owned  # read-only, or ours to read only
    return False


def trim_heap() -> None:
    """Return freed heap memory to the system (glibc ``malloc_trim``), e.g. before METIS allocates
    or before a training step on CPU.

    glibc keeps freed blocks below its mmap threshold (which grows to 32 MiB as windows come and
    go) in the heap; building the CSR frees a few hundred MB of them that would otherwise still
    count towards the partition step's peak while METIS runs. A no-op elsewhere.
    """
    if sys.platform.startswith("linux"):
        try:
            _libc().malloc_trim(0)
        except (OSError, AttributeError):
            pass


_LIBC: Optional[ctypes.CDLL] = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
        _LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return _LIBC
