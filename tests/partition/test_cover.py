"""The halo cover: a minimum vertex cover of every rank pair's cut edges, valid, optimal and deterministic."""

from __future__ import annotations

import itertools

import pytest
import torch

from lightning_halo.partition import build_halo_partitions, partition_graph
from lightning_halo.partition.cover import halo_cover, halo_owners, minimum_vertex_cover
from tests.support.graphs import awkward_graph


def _brute_force_cover(left: list[int], right: list[int], n_left: int, n_right: int) -> int:
    """The size of a minimum vertex cover, by trying every subset (small graphs only)."""
    edges = list(zip(left, right))
    nodes = [("l", i) for i in range(n_left)] + [("r", j) for j in range(n_right)]
    for size in range(len(nodes) + 1):
        for chosen in itertools.combinations(nodes, size):
            picked = set(chosen)
            if all(("l", u) in picked or ("r", v) in picked for u, v in edges):
                return size
    raise AssertionError("unreachable")


@pytest.mark.parametrize("seed", range(40))
def test_cover_is_minimum_against_brute_force(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n_left, n_right = int(torch.randint(1, 7, (1,), generator=g)), int(torch.randint(1, 7, (1,), generator=g))
    n_edges = int(torch.randint(1, n_left * n_right + 1, (1,), generator=g))
    left = torch.randint(0, n_left, (n_edges,), generator=g)
    right = torch.randint(0, n_right, (n_edges,), generator=g)
    lc, rc = minimum_vertex_cover(left, right, n_left, n_right)
    assert all(lc[u] or rc[v] for u, v in zip(left.tolist(), right.tolist())), "an edge is not covered"
    assert int(lc.sum() + rc.sum()) == _brute_force_cover(left.tolist(), right.tolist(), n_left, n_right)


def _check_part_cover(part) -> tuple[int, int]:
    n_inner, n_halo = int(part.n_inner), int(part.n_halo)
    cover = halo_cover(part.edge_index, n_inner, n_halo, part.recv_counts.tolist())
    owner = halo_owners(part.recv_counts.tolist())
    partial = set(zip(cover.partial_owner.tolist(), cover.partial_target.tolist()))
    src, dst = part.edge_index
    for s, t in zip(src.tolist(), dst.tolist()):
        if s >= n_inner and not cover.keep[s - n_inner]:  # folded: its target receives a partial sum from the owner
            assert (int(owner[s - n_inner]), t) in partial
    assert cover.rows <= n_halo
    assert sum(cover.rows_per_owner(owner, int(part.num_parts))) == cover.rows
    keys = cover.partial_owner * max(n_inner, 1) + cover.partial_target
    assert torch.equal(keys, torch.sort(keys).values), "partial sums are sorted by (owner, target)"
    return cover.rows, n_halo


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_cover_of_partitions_is_valid_and_never_larger(world_size: int) -> None:
    data = awkward_graph(world_size)
    parts = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, world_size), world_size)
    totals = [_check_part_cover(p) for p in parts]
    assert sum(r for r, _ in totals) < sum(h for _, h in totals)  # this graph has something to gain


def test_cover_is_deterministic_and_counts_repeated_edges_once() -> None:
    # inner nodes 0, 1; halo rows 2, 3, 4 from owner 1; 2->0 repeated
    ei = torch.tensor([[2, 2, 3, 4, 2], [0, 0, 0, 0, 1]])
    a, b = halo_cover(ei, 2, 3, [0, 3]), halo_cover(ei.clone(), 2, 3, [0, 3])
    assert torch.equal(a.keep, b.keep) and torch.equal(a.partial_target, b.partial_target)
    assert a.rows == 2  # row 2 (it reaches both targets) and one partial sum for node 0, or the reverse
    # the same edges with row 2 owned by rank 0 and rows 3, 4 by rank 1: each pair is covered on its own
    c = halo_cover(ei, 2, 3, [1, 2])
    assert halo_owners([1, 2]).tolist() == [0, 1, 1]
    assert c.keep.tolist() == [True, False, False]  # row 2 reaches both targets; rank 1 sends one partial sum
    assert list(zip(c.partial_owner.tolist(), c.partial_target.tolist())) == [(1, 0)]


def test_cover_without_cut_edges_keeps_every_row_and_checks_its_counts() -> None:
    cover = halo_cover(torch.tensor([[0, 1], [1, 0]]), 2, 0, [0, 0])
    assert cover.rows == 0 and cover.keep.numel() == 0 and cover.n_partials == 0
    with pytest.raises(ValueError, match="halo rows"):
        halo_cover(torch.tensor([[2], [0]]), 2, 1, [0, 2])


def test_cover_reaches_the_measured_reduction_on_a_star() -> None:
    """Ten halo rows of one owner all pointing at one inner node: one partial sum instead of ten rows."""
    ei = torch.stack([torch.arange(1, 11), torch.zeros(10, dtype=torch.long)])
    cover = halo_cover(ei, 1, 10, [0, 10])
    assert cover.rows == 1 and not bool(cover.keep.any()) and cover.partial_target.tolist() == [0]


def test_a_cover_that_misses_an_edge_is_an_internal_error_not_an_assert(monkeypatch) -> None:
    # an assert would vanish under `python -O` and the partition would drop contributions silently
    import numpy as np

    import lightning_halo.partition.cover as cover
    from lightning_halo.errors import InternalError

    part = build_halo_partitions(awkward_graph(2), partition_graph(awkward_graph(2).edge_index, 160, 2), 2)[0]
    n_inner, n_halo = int(part.n_inner), int(part.n_halo)
    recv = part.recv_counts.tolist()
    def nothing(left, right, n_left: int, n_right: int) -> tuple:
        return np.zeros(n_left, dtype=bool), np.zeros(n_right, dtype=bool)

    monkeypatch.setattr(cover, "minimum_vertex_cover", nothing)
    with pytest.raises(InternalError, match=r"lightning-halo internal error: .*not a vertex cover.*please report"):
        halo_cover(part.edge_index, n_inner, n_halo, recv)


# --------------------------------------------------------- several relations reading one source type
def _random_cuts(seed: int) -> tuple[list, int, list[int]]:
    from lightning_halo.partition.cover import RelationCut

    g = torch.Generator().manual_seed(seed)
    n_halo = int(torch.randint(1, 6, (1,), generator=g))
    cuts = []
    for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
        n_t = int(torch.randint(1, 3, (1,), generator=g))
        e = int(torch.randint(0, 5, (1,), generator=g))
        cuts.append(RelationCut(torch.randint(0, n_halo, (e,), generator=g), torch.randint(0, n_t, (e,), generator=g),
                                n_t, bool(torch.rand(1, generator=g) < 0.7)))  # fmt: skip
    split = int(torch.randint(0, n_halo + 1, (1,), generator=g))
    return cuts, n_halo, [split, n_halo - split]


def _brute_force_joint(cuts, n_halo: int, owner: list[int]) -> int:
    """Fewest rows (fetched halo rows + partial sums per relation, owner and target) that give every relation
    every contribution, rows of relations that cannot fold fetched: by trying every set of fetched rows."""
    forced = {int(h) for c in cuts if not c.folds for h in c.halo.tolist()}
    best = None
    for size in range(n_halo + 1):
        for kept in itertools.combinations(range(n_halo), size):
            if not forced <= set(kept):
                continue
            partials = {(r, owner[h], v) for r, c in enumerate(cuts) if c.folds
                        for h, v in zip(c.halo.tolist(), c.target.tolist()) if h not in kept}  # fmt: skip
            total = size + len(partials)
            best = total if best is None else min(best, total)
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(40))
def test_a_joint_cover_of_several_relations_is_minimum_and_serves_each(seed: int) -> None:
    from lightning_halo.partition.cover import relation_cover

    cuts, n_halo, recv = _random_cuts(seed)
    cover, offsets = relation_cover(cuts, n_halo, recv)
    owner = halo_owners(recv).tolist()
    partial = set(zip(cover.partial_owner.tolist(), cover.partial_target.tolist()))
    for r, c in enumerate(cuts):
        for h, v in zip(c.halo.tolist(), c.target.tolist()):
            if not c.folds:
                assert cover.keep[h], f"relation {r} cannot fold: its halo row {h} must be fetched"
            elif not cover.keep[h]:
                assert (owner[h], offsets[r] + v) in partial, f"relation {r} misses row {h}'s contribution to {v}"
    assert cover.rows == _brute_force_joint(cuts, n_halo, owner)
    read = {int(h) for c in cuts for h in c.halo.tolist()}
    assert cover.rows <= len(read), "never more rows than the rows the relations read"
    assert not any(cover.keep[h] for h in range(n_halo) if h not in read), "a row no relation reads is not fetched"
    assert offsets == [sum(c.n_targets for c in cuts[:r]) for r in range(len(cuts))]
