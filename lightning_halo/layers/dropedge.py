r"""DropEdge that every rank draws alike: edges dropped by a keyed hash of their global identity.

PyG's :func:`torch_geometric.utils.dropout_edge` draws one random number per edge of the
tensor it is given; on a partition those are the rank's in-edges, drawn from a generator
whose state differs between ranks and from a single-process run. :func:`dropout_edge` decides
instead by hashing what an edge *is* in the whole graph: its source and target global ids,
its occurrence among repeated edges (a partition keeps the graph's edge order, so the
:math:`k`-th :math:`u \to v` edge is the same one everywhere), and a key made of the seed and
the number of drawing calls so far. Every rank thus drops exactly the edges a single-process
run of the same code drops (`DropEdge <https://arxiv.org/abs/1907.10903>`_).

The edges it returns on a partition are remembered as *the partition's in-edges restricted
to a mask* (:func:`kept_subset`), so the strategy's hooks recognise them: layers run on the
kept in-edges with the partition's halo, and normalisations (GCN's degrees) are computed over
the kept edges of the whole graph, as one process would.
"""

from __future__ import annotations

import threading
from typing import Optional

import torch
from torch import Tensor

from lightning_halo.memo import TensorMemo

_MASK31 = (1 << 31) - 1
_PRIME = (1 << 31) - 1  # 2^31 - 1: every product below stays under 2^62 (exact in int64)
_MULT = 0x45D9F3B

#: A partition's ``edge_index`` -> the global id of each of its local nodes (registered when bound).
_GLOBAL_IDS = TensorMemo(limit=16)
#: Edges returned by :func:`dropout_edge` -> ``(edge_index they were taken from, kept mask)``.
_KEPT = TensorMemo(limit=64)
#: Drawing calls so far in this thread, by seed (the key of the next draw). Per thread, so that
#: ranks played by threads (:mod:`lightning_halo.testing`) count like processes.
_LOCAL = threading.local()


def _calls() -> dict[int, int]:
    if not hasattr(_LOCAL, "calls"):
        _LOCAL.calls = {}
    return _LOCAL.calls


def register_partition_edges(edge_index: Tensor, global_id: Tensor) -> None:
    """Say that ``edge_index`` holds local ids whose global ids are ``global_id`` (a bound partition)."""
    _GLOBAL_IDS.put("gid", (edge_index,), global_id)


def kept_subset(edges: Tensor) -> Optional[tuple[Tensor, Tensor]]:
    """``(source edge_index, kept mask)`` if ``edges`` came from :func:`dropout_edge` (unchanged), else ``None``."""
    return _KEPT.get("kept", (edges,))


def reset_dropout_edge() -> None:
    """Start counting drawing calls from 0 again (e.g. before a single-process reference run in the same process)."""
    _calls().clear()


def _mix(h: Tensor) -> Tensor:
    """A nonlinear mix of 31-bit integers (xor-shift, multiply modulo a prime), exact on every device."""
    for _ in range(2):
        h = h ^ (h >> 16)
        h = (h * _MULT) % _PRIME
    return h ^ (h >> 16)


def _absorb(h: Tensor, c: Tensor) -> Tensor:
    """``h`` mixed with a non-negative int64 ``c`` (its low and high 31 bits)."""
    h = _mix(h ^ (c & _MASK31))
    return _mix(h ^ ((c >> 31) & _MASK31))


def occurrence(src: Tensor, dst: Tensor) -> Tensor:
    """For each edge, how many earlier edges have the same source and target (0 for the first)."""
    order = torch.argsort(dst, stable=True)
    order = order[torch.argsort(src[order], stable=True)]  # by (src, dst), ties in edge order
    s, d = src[order], dst[order]
    first = torch.ones_like(s, dtype=torch.bool)
    first[1:] = (s[1:] != s[:-1]) | (d[1:] != d[:-1])
    pos = torch.arange(s.numel(), device=s.device)
    start = torch.cummax(torch.where(first, pos, torch.zeros_like(pos)), 0).values
    k = torch.empty_like(pos)
    k[order] = pos - start
    return k


def edge_uniforms(src: Tensor, dst: Tensor, key: int, undirected: bool = False) -> Tensor:
    """One number in :math:`[0, 1)` per edge, a hash of ``(src, dst, occurrence, key)`` (global ids).

    With ``undirected`` the pair is unordered: :math:`u \\to v` and :math:`v \\to u` (the
    :math:`k`-th of each) get the same number.
    """
    src, dst = src.long(), dst.long()
    k = occurrence(src, dst)
    a, b = (torch.minimum(src, dst), torch.maximum(src, dst)) if undirected else (src, dst)
    h = _mix(torch.full_like(src, key & _MASK31))
    h = _absorb(_absorb(_absorb(_absorb(h, torch.full_like(src, key >> 31)), a), b), k)
    return h.double() / float(1 << 31)


def _next_key(seed: Optional[int]) -> int:
    seed = (torch.initial_seed() if seed is None else int(seed)) % (1 << 61)
    counts = _calls()
    calls = counts.get(seed, 0)
    counts[seed] = calls + 1
    return (seed * 1_000_003 + calls) % (1 << 62)


def dropout_edge(
    edge_index: Tensor,
    p: float = 0.5,
    force_undirected: bool = False,
    training: bool = True,
    *,
    seed: Optional[int] = None,
) -> tuple[Tensor, Tensor]:
    r"""Randomly drops edges, as :func:`torch_geometric.utils.dropout_edge`, alike on every rank.

    From the `"DropEdge: Towards Deep Graph Convolutional Networks on Node Classification"
    <https://arxiv.org/abs/1907.10903>`_ paper. Each edge is kept with probability
    :math:`1 - p`, decided by a hash of its global source and target ids, its occurrence
    among repeated edges, the seed and the number of drawing calls made so far with that seed.
    So a run on partitions (under :class:`~lightning_halo.HaloQuantStrategy`) drops exactly
    the edges that a single-process run of the same code with the same seed drops, and the
    layers given the result run exactly on the kept edges (normalisations included).

    Args:
        edge_index (LongTensor): the edge indices: a partition's ``batch.edge_index`` or a
            whole graph's.
        p (float, optional): dropout probability. (default: ``0.5``)
        force_undirected (bool, optional): drop :math:`u \to v` and :math:`v \to u` together
            (the graph must hold both directions; the edges keep their order, unlike PyG's
            result). (default: ``False``)
        training (bool, optional): if ``False``, nothing is dropped. (default: ``True``)
        seed (int, optional): the key's seed. (default: ``torch.initial_seed()``, the same on
            every rank after ``lightning.seed_everything``)

    Returns:
        ``(edge_index, edge_mask)``: the kept edges ``[2, E']`` and the bool mask ``[E]`` of
        the kept ones among the given edges.

    Shapes:
        - **input:** ``[2, E]``
        - **output:** ``[2, E']``, ``[E]``

    Example:
        >>> ei = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
        >>> kept, mask = dropout_edge(ei, p=0.5, seed=0)
        >>> kept.size(1) == int(mask.sum())
        True
    """
    if p < 0.0 or p >= 1.0:
        raise ValueError(f"Dropout probability has to be between 0 and 1 (got {p})")
    if not training or p == 0.0:
        return edge_index, edge_index.new_ones(edge_index.size(1), dtype=torch.bool)
    gid = _GLOBAL_IDS.get("gid", (edge_index,))
    src, dst = (edge_index[0], edge_index[1]) if gid is None else (gid[edge_index[0]], gid[edge_index[1]])
    mask = edge_uniforms(src, dst, _next_key(seed), force_undirected) >= p
    kept = edge_index[:, mask]
    _KEPT.put("kept", (kept,), (edge_index, mask))
    return kept, mask
