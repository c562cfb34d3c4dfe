r"""KaMinPar: a shared-memory multilevel partitioner whose memory stays close to the graph's.

METIS (pymetis) holds about 13 times the symmetric CSR it is given while it runs, which sets
the largest graph one machine can partition. `KaMinPar <https://github.com/KaHIP/KaMinPar>`_
(MIT; `TeraPart <https://arxiv.org/abs/2410.19119>`_ partitions a trillion edges on one
machine) reads the graph from a file and, with ``compress=True``, keeps it compressed in
memory. The Python binding reads graphs only from files, so the CSR is written as a ParHIP
binary file first (:func:`write_parhip`) and handed over by path.

ParHIP binary layout, as KaMinPar 3.x reads it (``kaminpar-io/parhip_parser.cc``)::

    uint64 version   bit flags, 0 = present: 0 edge weights, 1 node weights, 2 64-bit edge
                     ids, 3 64-bit node ids, 4 64-bit node weights, 5 64-bit edge weights
    uint64 n, m      nodes, directed adjacency entries (both directions of every edge)
    uint64 [n + 1]   byte offset of each node's first neighbour in the file
    uint32 [m]       neighbour ids (32-bit: half the bytes of METIS' int64 input)
    int64  [n]       node weights, if any

Determinism: single-threaded, KaMinPar returns the same partition for the same seed (tested).
With several threads its parallel label propagation depends on thread timing, so the result
varies from run to run (measured: three runs, three cuts). That is harmless when one process
writes a partition directory that every rank reads, and fatal when each node of a multi-node
job partitions into its own cache; so one thread is the default everywhere and more are only
offered where one writer serves all ranks (``lightning-halo partition --threads``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from lightning_halo.partition.options import check_num_parts, check_threads

#: KaMinPar's imbalance tolerance: every part holds at most ``(1 + EPS)`` times the average
#: node weight (its own default; METIS' is about the same).
EPS = 0.03

_HEADER = 3 * 8


class KaMinParUnavailableError(ImportError):
    """The ``kaminpar`` package cannot be imported; the message names ``partitioner="metis"``."""


def import_kaminpar():  # noqa: ANN201 - the module
    """The ``kaminpar`` module, or an error that says what to do instead."""
    try:
        import kaminpar
    except ImportError as err:
        raise KaMinParUnavailableError(
            f"partitioner='kaminpar' needs the kaminpar package, which cannot be imported here ({err}). Install it "
            "(`pip install kaminpar`: wheels for Linux and macOS) or use partitioner='metis'."
        ) from err
    return kaminpar


def parhip_version(node_weights: bool) -> int:
    """The ParHIP version flags of what :func:`write_parhip` writes (see the module docstring).

    Example:
        >>> parhip_version(False), parhip_version(True)
        (11, 9)
    """
    flags = 1  # no edge weights
    flags |= 0 if node_weights else 2
    flags |= 8  # 32-bit node ids (64-bit edge offsets, 64-bit node weights)
    return flags


def write_parhip(
    path: str | os.PathLike, xadj: Tensor, adjncy: Tensor, node_weights: Optional[Tensor] = None, window: int = 1 << 22
) -> int:
    r"""Write a symmetric, loop-free CSR as a ParHIP binary file; returns its size in bytes.

    Args:
        path (str): the file to (over)write.
        xadj (Tensor): ``[N + 1]`` row offsets (int64).
        adjncy (Tensor): ``[nnz]`` neighbour ids, ``< 2^32`` (int32 or int64).
        node_weights (Tensor, optional): ``[N]`` positive integer weights.
        window (int, optional): entries converted per write. (default: 4M)

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "g.parhip")
        >>> write_parhip(p, torch.tensor([0, 1, 2]), torch.tensor([1, 0]))
        56
    """
    n = int(xadj.numel()) - 1
    m = int(xadj[-1])
    if adjncy.numel() != m:
        raise ValueError(f"adjncy has {adjncy.numel()} entries but xadj ends at {m}")
    if n >= 1 << 32:
        raise ValueError(f"{n} nodes do not fit 32-bit node ids; KaMinPar's ParHIP input needs fewer than 2^32")
    base = _HEADER + 8 * (n + 1)
    with open(path, "wb") as f:
        np.array([parhip_version(node_weights is not None), n, m], dtype=np.uint64).tofile(f)
        for start in range(0, n + 1, window):  # byte offsets of the rows' first neighbours
            (base + 4 * xadj[start : start + window].numpy().astype(np.uint64)).astype(np.uint64).tofile(f)
        for start in range(0, m, window):
            adjncy[start : start + window].numpy().astype(np.uint32, copy=False).tofile(f)
        if node_weights is not None:
            if node_weights.numel() != n:
                raise ValueError(f"node_weights has {node_weights.numel()} entries, the graph {n} nodes")
            node_weights.to(torch.int64).numpy().tofile(f)
        return f.tell()


def parhip_num_nodes(path: str | os.PathLike) -> int:
    """The number of nodes a ParHIP binary file declares (its header).

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "g.parhip")
        >>> _ = write_parhip(p, torch.tensor([0, 1, 2]), torch.tensor([1, 0]))
        >>> parhip_num_nodes(p)
        2
    """
    header = np.fromfile(path, dtype=np.uint64, count=3)
    if header.size != 3:
        raise ValueError(f"{path} is not a ParHIP binary file (shorter than its {_HEADER}-byte header)")
    return int(header[1])


def run_kaminpar(path: str | os.PathLike, num_parts: int, *, seed: int = 0, threads: int = 1, compress: bool = True) -> Tensor:
    r"""Partition the ParHIP file ``path`` into ``num_parts`` blocks with KaMinPar (imbalance :data:`EPS`).

    Args:
        path (str): a file written by :func:`write_parhip`.
        num_parts (int): :math:`P`, from 1 to the number of nodes.
        seed (int, optional): KaMinPar's seed. (default: ``0``)
        threads (int, optional): threads; ``1`` is deterministic for a seed, more are not.
            (default: ``1``)
        compress (bool, optional): keep the graph compressed in memory while partitioning
            (less memory, somewhat slower). (default: ``True``)

    Returns:
        ``int64`` tensor ``[N]`` with values in ``[0, P)`` (a part may be empty on tiny graphs).

    Raises:
        ValueError: if ``num_parts`` is not an integer in ``[1, N]`` (checked before KaMinPar starts).
    """
    check_num_parts(num_parts, parhip_num_nodes(path))
    check_threads(threads)
    kaminpar = import_kaminpar()
    kaminpar.reseed(int(seed))
    graph = kaminpar.load_graph(str(path), kaminpar.GraphFileFormat.PARHIP, compress=compress)
    blocks = kaminpar.KaMinPar(threads, kaminpar.default_context()).compute_partition(graph, num_parts, EPS)
    del graph
    # The binding returns a Python list; one numpy pass turns it into a compact array.
    return torch.from_numpy(np.fromiter(blocks, dtype=np.int64, count=len(blocks)))

