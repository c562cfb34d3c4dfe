"""Node-to-part assignment: METIS (pymetis), KaMinPar, a memory-aware choice between them, or a seeded random baseline."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from lightning_halo.partition.chunks import CHUNK_BYTES, iter_edges, trim_heap
from lightning_halo.partition.kaminpar import EPS, run_kaminpar, write_parhip
from lightning_halo.partition.metis_constraints import metis_available, part_graph_constraints
from lightning_halo.partition.options import (
    Balance,
    Partitioner,
    check_balance,
    check_num_parts,
    check_partitioner,
    check_threads,
)
from lightning_halo.partition.sorting import sorted_unique, stable_argsort


def symmetric_csr(
    edge_index: Tensor, num_nodes: int, chunk_edges: Optional[int] = None, index_dtype: torch.dtype = torch.int64
) -> tuple[np.ndarray, np.ndarray]:
    r"""CSR adjacency of the symmetrised graph without self-loops or duplicate edges.

    METIS requires exactly this input (an asymmetric adjacency or a self-loop can crash it),
    and a directed GNN edge set still needs both endpoints in one part to avoid traffic.

    Built in bounded memory, so that partitioning needs the structure and nothing more: the
    edges are read in windows (a memory-mapped ``edge_index`` is never held whole), a
    counting pass sizes the rows, a second pass places both directions of every edge, and
    each block of rows is then sorted and de-duplicated in place. Peak: ``32 N + s 2E``
    bytes (``s`` = 8 for int64 neighbour ids, 4 for int32: the rows with their duplicates)
    plus the temporaries of one window (about ten times the window).

    Args:
        edge_index (Tensor): ``[2, E]`` integer edge list (any direction, duplicates allowed;
            may be memory-mapped).
        num_nodes (int): number of nodes :math:`N`.
        chunk_edges (int, optional): edges per window. (default: 1M)
        index_dtype (torch.dtype, optional): dtype of the neighbour ids: ``torch.int64`` (what
            METIS takes) or ``torch.int32`` (half the memory, for KaMinPar; needs
            :math:`N < 2^{31}`). (default: ``torch.int64``)

    Returns:
        ``(xadj, adjncy)`` as contiguous numpy arrays of lengths ``N + 1`` (``int64``) and
        ``2 * |E_undirected|`` (``index_dtype``); every row sorted.

    Example:
        >>> xadj, adjncy = symmetric_csr(torch.tensor([[0, 1], [1, 2]]), 3)
        >>> xadj.tolist(), adjncy.tolist()
        ([0, 1, 3, 4], [1, 0, 2, 1])
    """
    step = chunk_edges or CHUNK_BYTES // 16
    if index_dtype not in (torch.int64, torch.int32):
        raise ValueError(f"index_dtype must be torch.int64 or torch.int32, got {index_dtype}")
    if index_dtype == torch.int32 and num_nodes >= 1 << 31:
        raise ValueError(f"{num_nodes} nodes do not fit int32 neighbour ids; use index_dtype=torch.int64")

    def both_directions():
        for _, src, dst in iter_edges(edge_index, step):
            keep = src != dst
            src, dst = src[keep], dst[keep]
            yield torch.cat([src, dst]), torch.cat([dst, src])

    deg = torch.zeros(num_nodes, dtype=torch.long)
    for rows, _ in both_directions():
        deg += torch.bincount(rows, minlength=num_nodes)
    ptr = torch.zeros(num_nodes + 1, dtype=torch.long)
    torch.cumsum(deg, 0, out=ptr[1:])
    buf = np.empty(int(ptr[-1]), dtype=np.int64 if index_dtype == torch.int64 else np.int32)  # duplicates still in
    adj = torch.from_numpy(buf)
    fill = ptr[:-1].clone()
    for rows, cols in both_directions():
        order = stable_argsort(rows, num_nodes)
        rows = rows[order]
        uniq, counts = torch.unique_consecutive(rows, return_counts=True)
        first = torch.cumsum(counts, 0) - counts
        within = torch.arange(rows.numel()) - torch.repeat_interleave(first, counts)
        adj[fill[rows] + within] = cols[order].to(adj.dtype)
        fill[uniq] += counts
    del fill
    # Sort and de-duplicate block after block of rows, compacting to the left in place
    # (a block's output never reaches past its input, which was copied out first).
    xadj = torch.zeros(num_nodes + 1, dtype=torch.long)
    write, a = 0, 0
    while a < num_nodes:
        b = max(a + 1, int(torch.searchsorted(ptr, ptr[a] + 2 * step, right=True)) - 1)
        b = min(b, num_nodes)
        seg = adj[int(ptr[a]) : int(ptr[b])]
        row = torch.repeat_interleave(torch.arange(a, b), deg[a:b])
        key = sorted_unique(row * num_nodes + seg)
        row = torch.div(key, num_nodes, rounding_mode="floor")
        adj[write : write + key.numel()] = key - row * num_nodes
        xadj[a + 1 : b + 1] = write + torch.cumsum(torch.bincount(row - a, minlength=b - a), 0)
        write += key.numel()
        a = b
    del adj, seg
    try:  # give the duplicates' tail back (realloc shrinks in place)
        buf.resize(write)
    except ValueError:  # still referenced elsewhere: copy instead
        buf = buf[:write].copy()
    return np.ascontiguousarray(xadj.numpy()), buf


#: METIS' working set as a multiple of the int64 CSR it is given, measured with pymetis'
#: 64-bit METIS on generated community graphs: 13.5x (4M nodes / 64M edges) and 14.6x (1M / 24M)
#: above the CSR (docs/benchmarks.md#memory-per-rank); rounded up for the prediction.
METIS_FACTOR = 15


def csr_bytes(num_nodes: int, nnz: int) -> int:
    """Bytes of the int64 CSR METIS takes: ``8 (N + 1) + 8 nnz``."""
    return 8 * (num_nodes + 1) + 8 * nnz


def default_memory_budget() -> int:
    """Half of this machine's physical memory (``MemTotal``), the budget ``"auto"`` compares METIS with.

    Physical memory, not what is free right now, so that every node of a homogeneous cluster
    makes the same choice whatever else runs on it.
    """
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // 2


def choose_partitioner(num_nodes: int, nnz: int, memory_budget: int) -> str:
    r"""What ``partitioner="auto"`` runs: ``"metis"`` if its predicted working set fits the budget, else ``"kaminpar"``.

    METIS is predicted to need :data:`METIS_FACTOR` times the int64 CSR of the symmetrised
    graph (``nnz`` adjacency entries, both directions of every edge).

    Example:
        >>> choose_partitioner(1_000_000, 20_000_000, 8 << 30), choose_partitioner(1_000_000, 20_000_000, 1 << 30)
        ('metis', 'kaminpar')
    """
    return "metis" if METIS_FACTOR * csr_bytes(num_nodes, nnz) <= memory_budget else "kaminpar"


@dataclass(frozen=True)
class Assignment:
    """A node assignment and how it was made (recorded in a partition directory's manifest).

    Args:
        parts: ``[N]`` part of every node.
        partitioner: what ran (``"metis"``, ``"kaminpar"`` or ``"random"``; ``"auto"`` resolved).
        details: its settings and the figures ``"auto"`` decided on.
    """

    parts: Tensor
    partitioner: str
    details: dict[str, Any] = field(default_factory=dict)


def assign_parts(
    edge_index: Tensor,
    num_nodes: int,
    num_parts: int,
    *,
    partitioner: Partitioner = "metis",
    seed: int = 0,
    balance: Balance = "nodes",
    threads: int = 1,
    memory_budget: Optional[int] = None,
    workdir: Optional[str | os.PathLike] = None,
    constraint: Optional[Tensor] = None,
) -> Assignment:
    r"""Assign every node to one of ``num_parts`` parts, and say how (see :func:`partition_graph`).

    Args:
        edge_index, num_nodes, num_parts, partitioner, seed, balance: as for
            :func:`partition_graph`.
        threads (int, optional): KaMinPar's threads (``1`` is deterministic). (default: ``1``)
        memory_budget (int, optional): bytes ``"auto"`` allows METIS. (default: half the
            physical memory, :func:`default_memory_budget`)
        workdir (str, optional): where KaMinPar's input file is written (and removed).
            (default: the system's temporary directory)
        constraint (Tensor, optional): ``[N]`` non-negative integer weights of a second balance
            constraint (e.g. ``1`` on the labelled nodes of a heterogeneous graph). METIS balances it
            together with ``balance``'s weights (:mod:`~lightning_halo.partition.metis_constraints`);
            KaMinPar and ``"random"`` balance one weight and ignore it. ``details["constraints"]`` says
            how many METIS balanced (and ``details["constraints_why"]`` why one where two were asked).
            (default: ``None``)
    """
    check_num_parts(num_parts, num_nodes)
    check_partitioner(partitioner)
    check_balance(balance)
    check_threads(threads)
    if num_parts == 1:
        return Assignment(torch.zeros(num_nodes, dtype=torch.long), partitioner if partitioner != "auto" else "metis")
    if partitioner == "random":
        gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(num_nodes, generator=gen)
        parts = torch.empty(num_nodes, dtype=torch.long)
        parts[perm] = torch.arange(num_nodes) % num_parts
        return Assignment(parts, "random")
    t0 = time.perf_counter()
    if partitioner == "metis":
        xadj, adjncy = symmetric_csr(edge_index, num_nodes)
        trim_heap()  # the CSR build's freed windows: not to be counted again while METIS runs
        details = {"csr_s": time.perf_counter() - t0}
        return _metis(xadj, adjncy, edge_index, num_nodes, num_parts, seed, balance, details, constraint)
    # KaMinPar's input (and "auto"'s measure) is the CSR with 32-bit ids: half of METIS' input.
    xadj, adjncy = symmetric_csr(edge_index, num_nodes, index_dtype=torch.int32 if num_nodes < 1 << 31 else torch.int64)
    trim_heap()
    details: dict[str, Any] = {"csr_bytes": csr_bytes(num_nodes, int(adjncy.size)), "csr_s": time.perf_counter() - t0}
    choice = partitioner
    if partitioner == "auto":
        budget = default_memory_budget() if memory_budget is None else int(memory_budget)
        choice = choose_partitioner(num_nodes, int(adjncy.size), budget)
        details.update(metis_predicted_bytes=METIS_FACTOR * details["csr_bytes"], memory_budget=budget)
        if choice == "metis":
            return _metis(xadj, adjncy.astype(np.int64), edge_index, num_nodes, num_parts, seed, balance, details, constraint)
    details.update(threads=threads, eps=EPS, compress=True)
    if adjncy.size == 0:
        return Assignment(_split_evenly(num_nodes, num_parts), "kaminpar", details)
    weights = _in_degree_weights(edge_index, num_nodes) if balance == "edges" else None
    with tempfile.TemporaryDirectory(prefix="lightning-halo-kaminpar-", dir=workdir) as tmp:
        path = os.path.join(tmp, "graph.parhip")
        details["parhip_bytes"] = write_parhip(path, torch.from_numpy(xadj), torch.from_numpy(adjncy), weights)
        del xadj, adjncy, weights  # KaMinPar reads the file: the CSR must not stay resident beside it
        trim_heap()
        t0 = time.perf_counter()
        parts = run_kaminpar(path, num_parts, seed=seed, threads=threads, compress=True)
        details["kaminpar_s"] = time.perf_counter() - t0
    return Assignment(_fill_empty_parts(parts, num_parts), "kaminpar", details)


def partition_graph(
    edge_index: Tensor,
    num_nodes: int,
    num_parts: int,
    *,
    partitioner: Partitioner = "metis",
    seed: int = 0,
    balance: Balance = "nodes",
    threads: int = 1,
) -> Tensor:
    r"""Assign every node to one of ``num_parts`` parts.

    ``"metis"`` (pymetis) minimises the edge cut of the symmetrised graph (DistDGL's choice:
    fewer cut edges mean fewer halo rows on the wire) while balancing either the node count or
    the in-edge count (``balance="edges"``, i.e. compute per part); it needs about 15 times the
    graph's int64 CSR in memory. ``"kaminpar"``
    (:mod:`~lightning_halo.partition.kaminpar`) does the same multilevel job reading a 32-bit
    CSR from a file and keeping it compressed: a quarter to a fifth of METIS' memory and 1.3–1.7
    times faster on one thread (measured on 4M nodes / 64M edges), at a cut from 24 % better to
    21 % worse than METIS' by graph, each part at most 3 % above the average. ``"auto"`` runs METIS when its predicted working set
    (:func:`choose_partitioner`) fits half of the machine's physical memory, else KaMinPar.
    ``"random"`` is the communication-heavy baseline: a seeded permutation dealt round-robin,
    perfectly balanced. All are deterministic for a given seed (KaMinPar at ``threads=1``),
    and no part is ever empty (a part left empty on a tiny graph takes one node from the
    largest part).

    Args:
        edge_index (Tensor): ``[2, E]`` edges, source to target (may be memory-mapped: it is
            read in windows).
        num_nodes (int): number of nodes :math:`N`.
        num_parts (int): number of parts :math:`P`, ``1 <= P <= N``.
        partitioner (str, optional): ``"metis"``, ``"kaminpar"``, ``"auto"`` or ``"random"``.
            (default: ``"metis"``)
        seed (int, optional): seed of the partitioner / the permutation. (default: ``0``)
        balance (str, optional): ``"nodes"`` or ``"edges"`` (vertex weight ``1 + in-degree``).
            (default: ``"nodes"``)
        threads (int, optional): KaMinPar's threads; more than one is faster but not
            deterministic. (default: ``1``)

    Returns:
        ``int64`` tensor ``[N]`` with values in ``[0, P)``.

    Example:
        >>> ei = torch.tensor([[0, 1, 2, 3], [1, 0, 3, 2]])
        >>> partition_graph(ei, 4, 2).bincount().tolist()
        [2, 2]
    """
    return assign_parts(
        edge_index, num_nodes, num_parts, partitioner=partitioner, seed=seed, balance=balance, threads=threads
    ).parts


def _metis(
    xadj: np.ndarray, adjncy: np.ndarray, edge_index: Tensor, num_nodes: int, num_parts: int, seed: int, balance: str,
    details: dict[str, Any], constraint: Optional[Tensor] = None,
) -> Assignment:  # fmt: skip
    import pymetis

    if adjncy.size == 0:  # METIS rejects a graph without edges; any balanced split has zero cut
        return Assignment(_split_evenly(num_nodes, num_parts), "metis", details)
    weights = _in_degree_weights(edge_index, num_nodes) if balance == "edges" else None
    t0 = time.perf_counter()
    details["constraints"] = 1
    if constraint is not None:
        why = _second_constraint_why(constraint, num_nodes)
        if why is None:
            base = np.ones(num_nodes, dtype=np.int64) if weights is None else weights.numpy()
            stacked = np.stack([base, constraint.to(torch.long).numpy()], axis=1)
            membership = part_graph_constraints(xadj, adjncy, stacked, num_parts, seed)
            details.update(constraints=2, metis_s=time.perf_counter() - t0)
            return Assignment(_fill_empty_parts(torch.from_numpy(membership), num_parts), "metis", details)
        details["constraints_why"] = why
    _, membership = pymetis.part_graph(
        num_parts,
        adjacency=pymetis.CSRAdjacency(xadj, adjncy),
        vweights=None if weights is None else np.ascontiguousarray(weights.numpy()),
        options=pymetis.Options(seed=seed),
    )
    details["metis_s"] = time.perf_counter() - t0
    parts = torch.as_tensor(np.asarray(membership), dtype=torch.long)
    return Assignment(_fill_empty_parts(parts, num_parts), "metis", details)


def _second_constraint_why(constraint: Tensor, num_nodes: int) -> Optional[str]:
    """Why METIS balances one constraint where a second was given (``None``: it balances both)."""
    if constraint.shape != (num_nodes,) or bool((constraint < 0).any()):
        raise ValueError(f"constraint must be [num_nodes={num_nodes}] non-negative weights, got {list(constraint.shape)}")
    if int(constraint.sum()) == 0:
        return "the second constraint weighs nothing"
    if not metis_available():
        return "this pymetis does not export METIS' C API (pymetis' part_graph passes one weight per node)"
    return None


def _in_degree_weights(edge_index: Tensor, num_nodes: int) -> Tensor:
    """Vertex weights ``1 + in-degree`` (``balance="edges"``: compute per part)."""
    indeg = torch.zeros(num_nodes, dtype=torch.long)
    for _, _, dst in iter_edges(edge_index):
        indeg += torch.bincount(dst, minlength=num_nodes)
    return 1 + indeg


def _split_evenly(num_nodes: int, num_parts: int) -> Tensor:
    return torch.arange(num_nodes, dtype=torch.long) * num_parts // num_nodes


def _fill_empty_parts(parts: Tensor, num_parts: int) -> Tensor:
    """Give every empty part one node from the currently largest part (deterministic)."""
    counts = torch.bincount(parts, minlength=num_parts)
    for p in torch.nonzero(counts == 0).flatten().tolist():
        donor = int(torch.argmax(counts))
        node = int(torch.nonzero(parts == donor).flatten()[-1])
        parts[node] = p
        counts[donor] -= 1
        counts[p] += 1
    return parts
