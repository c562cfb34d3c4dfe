r"""Fewer rows on the wire: which halo rows to fetch, and which contributions to add up at their owner.

For a cut edge :math:`u \to v` (:math:`u` owned by rank :math:`a`, :math:`v` by rank :math:`b`),
rank :math:`b` can fetch :math:`u`'s row, or rank :math:`a` can add up all its contributions to
:math:`v` and send one *partial sum* for :math:`v`. For a linear aggregation both give the same
result. Choosing, per edge, which side crosses so that the fewest rows do is a minimum vertex
cover of the bipartite graph of the pair's cut edges (sources of :math:`a` on one side, targets
of :math:`b` on the other); by König's theorem its size is that of a maximum matching
(`SuperGCN <https://arxiv.org/abs/2411.16025>`_'s pre/post-aggregation, made optimal).

:func:`halo_cover` computes it for one receiving part from its own in-edges alone: all the
cut edges into a part are among them, so every rank can decide its own pairs, and the same
function gives the figures of ``lightning-halo partition``. It is deterministic (scipy's
Hopcroft–Karp matching and a breadth-first search on fixed input order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order, maximum_bipartite_matching
from torch import Tensor

from lightning_halo.errors import internal_error
from lightning_halo.partition.chunks import iter_edges


@dataclass(frozen=True)
class HaloCover:
    r"""A receiving part's choice: the halo rows it still fetches, and the partial sums it receives.

    Attributes:
        keep (Tensor): ``[n_halo]`` bool: halo row :math:`h` is fetched as a row (it covers its
            edges); the edges of the other halo rows are folded into partial sums.
        partial_owner (Tensor): ``[n_partials]`` the rank that sends each partial sum.
        partial_target (Tensor): ``[n_partials]`` the inner node each partial sum is for;
            sorted by ``(owner, target)``.

    Example:
        >>> # halo rows 0, 1 (owner 1) both point at inner nodes 0 and 1: fetch the two rows
        >>> cover = halo_cover(torch.tensor([[2, 3, 2, 3], [0, 0, 1, 1]]), 2, 2, [0, 2])
        >>> cover.rows, cover.keep.tolist()
        (2, [True, True])
        >>> # halo rows 0, 1, 2 (owner 1) all point at inner node 0 only: one partial sum
        >>> cover = halo_cover(torch.tensor([[1, 2, 3], [0, 0, 0]]), 1, 3, [0, 3])
        >>> cover.rows, cover.partial_target.tolist()
        (1, [0])
    """

    keep: Tensor
    partial_owner: Tensor
    partial_target: Tensor

    @property
    def n_partials(self) -> int:
        return int(self.partial_target.numel())

    @property
    def rows(self) -> int:
        """Rows one exchange brings in: fetched halo rows plus partial sums (the cover's size)."""
        return int(self.keep.sum()) + self.n_partials

    def rows_per_owner(self, halo_owner: Tensor, world_size: int) -> list[int]:
        """Rows received from each rank: its fetched halo rows, then its partial sums."""
        kept = torch.bincount(halo_owner[self.keep], minlength=world_size)
        partial = torch.bincount(self.partial_owner, minlength=world_size)
        return (kept + partial).tolist()


def halo_owners(recv_counts: Sequence[int]) -> Tensor:
    """The owner of every halo row, from the rows received from each rank (halo rows are grouped by owner)."""
    counts = torch.as_tensor(list(recv_counts), dtype=torch.long)
    return torch.repeat_interleave(torch.arange(counts.numel()), counts)


def cut_edges(edge_index: Tensor, n_inner: int) -> tuple[Tensor, Tensor]:
    """``(halo row, inner target)`` of every in-edge from the halo, read a window at a time
    (a memory-mapped ``edge_index`` is never held whole)."""
    hs, vs = [], []
    for _, src, dst in iter_edges(edge_index):
        cut = src >= n_inner
        hs.append(src[cut] - n_inner)
        vs.append(dst[cut])
    empty = torch.empty(0, dtype=torch.long)
    return (torch.cat(hs), torch.cat(vs)) if hs else (empty, empty)


def cut_pairs(edge_index: Tensor, n_inner: int, owner: Tensor) -> tuple[Tensor, Tensor]:
    """Distinct ``(halo row, right node)`` pairs of the cut in-edges, and the right nodes' keys.

    A right node is a pair (owner, inner target): partial sums are per sender and target. Its
    key is ``owner * n_inner + target``; the keys are sorted, so right node ``i`` is ``keys[i]``.
    """
    h, v = cut_edges(edge_index, n_inner)
    return _pairs(h, v, n_inner, owner)


def _pairs(h: Tensor, v: Tensor, n_targets: int, owner: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`cut_pairs` of cut edges ``(halo row h, target v)``, targets in ``[0, n_targets)``."""
    right_key = owner[h] * n_targets + v
    keys, right = torch.unique(right_key, return_inverse=True)
    pair = torch.unique(h * keys.numel() + right)  # distinct edges (multi-edges count once)
    return torch.stack([pair // max(keys.numel(), 1), pair % max(keys.numel(), 1)]), keys


def minimum_vertex_cover(left: Tensor, right: Tensor, n_left: int, n_right: int) -> tuple[np.ndarray, np.ndarray]:
    r"""A minimum vertex cover of a bipartite graph (König's construction from a maximum matching).

    Args:
        left (Tensor): ``[E]`` left end of every edge, in ``[0, n_left)``.
        right (Tensor): ``[E]`` right end, in ``[0, n_right)``.

    Returns:
        ``(left_in_cover, right_in_cover)``, boolean arrays: every edge has an end in the cover,
        and no smaller set has that property.

    Example:
        >>> lc, rc = minimum_vertex_cover(torch.tensor([0, 1, 2]), torch.tensor([0, 0, 0]), 3, 1)
        >>> lc.tolist(), rc.tolist()
        ([False, False, False], [True])
    """
    e = int(left.numel())
    graph = csr_matrix((np.ones(e, dtype=np.int8), (left.numpy(), right.numpy())), shape=(n_left, n_right))
    match = maximum_bipartite_matching(graph, perm_type="column")  # right node matched to each left, or -1
    # Alternating search from the unmatched left nodes: left -> right along any edge, right -> left
    # along the matching. Cover = left nodes not reached + right nodes reached (König).
    src_node = n_left + n_right
    matched = np.flatnonzero(match >= 0)
    unmatched = np.flatnonzero(match < 0)
    rows = np.concatenate([left.numpy(), n_left + match[matched], np.full(unmatched.size, src_node)])
    cols = np.concatenate([n_left + right.numpy(), matched, unmatched])
    walk = csr_matrix((np.ones(rows.size, dtype=np.int8), (rows, cols)), shape=(src_node + 1, src_node + 1))
    reached = np.zeros(src_node + 1, dtype=bool)
    reached[breadth_first_order(walk, src_node, directed=True, return_predecessors=False)] = True
    return ~reached[:n_left], reached[n_left:src_node]


def halo_cover(edge_index: Tensor, n_inner: int, n_halo: int, recv_counts: Sequence[int]) -> HaloCover:
    r"""The minimum number of rows a part must receive per exchange, and how.

    Args:
        edge_index (Tensor): ``[2, E]`` the part's in-edges in local ids (halo rows are
            ``n_inner + h``), as a :class:`~lightning_halo.partition.HaloPartition` holds them.
        n_inner (int): its inner nodes.
        n_halo (int): its halo rows.
        recv_counts (list[int]): halo rows owned by each rank (the halo is grouped by owner).

    Returns:
        The :class:`HaloCover`; ``cover.rows`` never exceeds ``n_halo``.
    """
    owner = _owners(recv_counts, n_halo)
    h, v = cut_edges(edge_index.cpu(), n_inner)
    return _cover(h, v, n_inner, owner, torch.zeros(n_halo, dtype=torch.bool), empty_keeps_all=True)


def _owners(recv_counts: Sequence[int], n_halo: int) -> Tensor:
    owner = halo_owners(recv_counts)
    if owner.numel() != n_halo:
        raise ValueError(f"recv_counts sum to {owner.numel()} rows, but the part has {n_halo} halo rows")
    return owner


def _cover(h: Tensor, v: Tensor, n_targets: int, owner: Tensor, forced: Tensor, empty_keeps_all: bool = False) -> HaloCover:
    """The minimum cover of the cut edges ``(h, v)`` with the halo rows ``forced`` fetched whatever it costs."""
    n_halo = int(owner.numel())
    free = ~forced[h]
    pairs, keys = _pairs(h[free], v[free], n_targets, owner)
    if not pairs.size(1):
        empty = torch.empty(0, dtype=torch.long)
        return HaloCover(torch.ones(n_halo, dtype=torch.bool) if empty_keeps_all else forced.clone(), empty, empty)
    left_c, right_c = minimum_vertex_cover(pairs[0], pairs[1], n_halo, int(keys.numel()))
    keep = torch.from_numpy(left_c.copy()) | forced
    # partial sums: right nodes with an edge from a halo row that is not fetched (a minimum cover
    # has no others, but this holds for any cover)
    folded = ~keep[pairs[0]]
    used = torch.unique(pairs[1][folded])
    if not bool(torch.from_numpy(right_c)[used].all()):  # else contributions would be dropped silently
        raise internal_error("the halo cover is not a vertex cover (an edge has neither end in it)")
    chosen = keys[used]
    return HaloCover(keep, chosen // max(n_targets, 1), chosen % max(n_targets, 1))


@dataclass(frozen=True)
class RelationCut:
    """The cut edges of one relation that reads a source type's halo.

    Attributes:
        halo (Tensor): ``[E]`` the halo row (of the source type) of each cut edge.
        target (Tensor): ``[E]`` its inner target (of the relation's target type).
        n_targets (int): inner nodes of the target type.
        folds (bool): the relation may receive partial sums; else every halo row it reads is fetched.
    """

    halo: Tensor
    target: Tensor
    n_targets: int
    folds: bool


def relation_cover(cuts: Sequence[RelationCut], n_halo: int, recv_counts: Sequence[int]) -> tuple[HaloCover, list[int]]:
    r"""One cover for every relation of a layer that reads a source type: one exchange, however many read it.

    The right nodes are ``(relation, owner, target)``: relation :math:`r`'s targets are numbered
    from ``offsets[r]`` on, so a partial sum is for one relation and target, while a fetched halo
    row serves every relation that reads it. Halo rows of relations that cannot fold (``folds``
    false) are fetched; the rest is a minimum vertex cover as in :func:`halo_cover`, so the
    exchange never brings more rows than the rows these relations read. Halo rows no relation
    reads are not fetched.

    Returns:
        ``(cover, offsets)``: the :class:`HaloCover` (``partial_target`` in the joint numbering)
        and each relation's first target number.

    Example:
        >>> # halo rows 0, 1 (owner 1) feed targets 0, 1 of relation A and target 0 of relation B: two
        >>> # fetched rows serve both (three partial sums would not); relation C cannot fold and reads row 2
        >>> cuts = [RelationCut(torch.tensor([0, 1, 0, 1]), torch.tensor([0, 0, 1, 1]), 2, True),
        ...         RelationCut(torch.tensor([0, 1]), torch.tensor([0, 0]), 1, True),
        ...         RelationCut(torch.tensor([2]), torch.tensor([0]), 1, False)]
        >>> cover, offsets = relation_cover(cuts, 4, [0, 4])
        >>> cover.keep.tolist(), cover.n_partials, offsets
        ([True, True, True, False], 0, [0, 2, 3])
        >>> # three halo rows feed target 0 of A only: one partial sum
        >>> cover, _ = relation_cover([RelationCut(torch.tensor([0, 1, 2]), torch.tensor([0, 0, 0]), 1, True)], 3, [0, 3])
        >>> cover.rows, cover.partial_target.tolist()
        (1, [0])
    """
    owner = _owners(recv_counts, n_halo)
    forced = torch.zeros(n_halo, dtype=torch.bool)
    hs, vs, offsets, at = [], [], [], 0
    for cut in cuts:
        offsets.append(at)
        if cut.folds:
            hs.append(cut.halo.long())
            vs.append(cut.target.long() + at)
        else:
            forced[cut.halo.long()] = True
        at += cut.n_targets
    empty = torch.empty(0, dtype=torch.long)
    h, v = (torch.cat(hs), torch.cat(vs)) if hs else (empty, empty)
    return _cover(h, v, max(at, 1), owner, forced), offsets

