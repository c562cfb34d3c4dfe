"""Whole-graph negatives: determinism from (edge set, seed, epoch), validity, PyG's conventions."""

from __future__ import annotations

import pytest
import torch

from lightning_halo.data.datasets import load_bundled
from lightning_halo.link.negatives import NegativeSampler, negative_sampling


@pytest.fixture(scope="module")
def cora():
    return load_bundled("cora")


def _pairs(ei):
    return set(map(tuple, ei.t().tolist()))


def test_same_draw_for_the_same_edge_set_in_any_order(cora) -> None:
    ei = cora.edge_index
    shuffled = torch.cat([ei[:, torch.randperm(ei.size(1))], ei[:, :50]], 1)  # other order, repeated edges
    a = negative_sampling(ei, cora.num_nodes, 500, seed=3, epoch=7)
    b = negative_sampling(shuffled, cora.num_nodes, 500, seed=3, epoch=7)
    assert torch.equal(a, b)


def test_draw_changes_with_epoch_seed_and_edges(cora) -> None:
    ei, n = cora.edge_index, cora.num_nodes
    base = negative_sampling(ei, n, 500, seed=0, epoch=0)
    assert not torch.equal(base, negative_sampling(ei, n, 500, seed=0, epoch=1))
    assert not torch.equal(base, negative_sampling(ei, n, 500, seed=1, epoch=0))
    assert not torch.equal(base, negative_sampling(ei[:, 2:], n, 500, seed=0, epoch=0))


def test_negatives_are_valid_non_edges(cora) -> None:
    ei, n = cora.edge_index, cora.num_nodes
    neg = negative_sampling(ei, n, 5000, seed=0, epoch=2)
    assert neg.shape == (2, 5000) and neg.dtype == torch.long
    assert not (neg[0] == neg[1]).any(), "no self-loops (PyG's convention)"
    assert not (_pairs(neg) & _pairs(ei)), "no edge of the graph"
    assert len(_pairs(neg)) == 5000, "no repeats"
    assert int(neg.min()) >= 0 and int(neg.max()) < n


def test_pyg_defaults_and_force_undirected(cora) -> None:
    ei, n = cora.edge_index, cora.num_nodes
    assert negative_sampling(ei, n).size(1) == ei.size(1)  # default: E pairs, as PyG
    assert negative_sampling(ei, n, 0.5).size(1) == ei.size(1) // 2
    und = negative_sampling(ei, n, 100, force_undirected=True)
    assert und.size(1) == 100 and _pairs(und) == _pairs(und.flip(0))


def test_nearly_complete_graph_returns_what_exists() -> None:
    n = 5
    full = torch.tensor([(i, j) for i in range(n) for j in range(n) if i != j and (i, j) != (0, 1)]).t()
    neg = NegativeSampler(full, n).sample(10)
    assert neg.tolist() == [[0], [1]]
    empty = NegativeSampler(torch.cat([full, torch.tensor([[0], [1]])], 1), n).sample(3)
    assert empty.shape == (2, 0)


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="outside"):
        NegativeSampler(torch.tensor([[0], [9]]), 4)
    with pytest.raises(ValueError, match="method"):
        negative_sampling(torch.tensor([[0], [1]]), 4, method="fast")


def test_bipartite_pairs_of_two_node_types() -> None:
    """A tuple num_nodes (PyG's bipartite size): sources in [0, N_src), targets in [0, N_dst), (i, i) allowed."""
    g = torch.Generator().manual_seed(0)
    n_src, n_dst = 30, 7
    ei = torch.stack([torch.randint(0, n_src, (60,), generator=g), torch.randint(0, n_dst, (60,), generator=g)])
    neg = negative_sampling(ei, (n_src, n_dst), 120, seed=1, epoch=4)
    assert neg.shape == (2, 120)
    assert int(neg[0].max()) < n_src and int(neg[1].max()) < n_dst and int(neg.min()) >= 0
    assert not (_pairs(neg) & _pairs(ei)) and len(_pairs(neg)) == 120
    assert (neg[0] == neg[1]).any(), "a pair (i, i) of two types is no self-loop"
    assert int(neg[0].max()) >= n_dst, "sources come from the whole source type"
    assert torch.equal(neg, negative_sampling(ei.flip(1), (n_src, n_dst), 120, seed=1, epoch=4))
    # all but one pair taken: exactly the free one comes back
    full = torch.tensor([(i, j) for i in range(3) for j in range(2) if (i, j) != (2, 0)]).t()
    assert NegativeSampler(full, (3, 2)).sample(5).tolist() == [[2], [0]]
    with pytest.raises(ValueError, match="outside \\[0, 2\\).*num_dst_nodes"):
        NegativeSampler(torch.tensor([[0], [2]]), (3, 2))
    with pytest.raises(ValueError, match="force_undirected"):
        NegativeSampler(full, (3, 2), force_undirected=True)
