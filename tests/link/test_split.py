"""The link split: RandomLinkSplit's positives for the same seed, no leakage, every edge once."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.transforms import RandomLinkSplit

from lightning_halo.data.datasets import load_bundled
from lightning_halo.link.split import link_split


def _set(ei):
    return set(map(tuple, ei.t().tolist()))


def _undirected(ei):
    return {tuple(sorted(p)) for p in ei.t().tolist()}


@pytest.fixture(scope="module")
def cora():
    return load_bundled("cora")


def test_positives_equal_random_link_split(cora) -> None:
    s = link_split(cora.edge_index, cora.num_nodes, 0.1, 0.2, seed=5)
    torch.manual_seed(5)
    train, val, test = RandomLinkSplit(0.1, 0.2, is_undirected=True, add_negative_train_samples=False)(
        Data(edge_index=cora.edge_index, num_nodes=cora.num_nodes)
    )
    assert _set(s.edge_index) == _set(train.edge_index)  # message passing: training edges, both directions
    assert _set(s.edge_index) == _set(val.edge_index)
    assert _set(s.test_edge_index) == _set(test.edge_index)  # the test stage: training and validation edges
    assert _set(s.train_pos) == _set(train.edge_label_index)
    assert torch.equal(s.val_pos, val.edge_label_index[:, val.edge_label == 1])
    assert torch.equal(s.test_pos, test.edge_label_index[:, test.edge_label == 1])


def test_no_leakage_and_every_edge_once(cora) -> None:
    s = link_split(cora.edge_index, cora.num_nodes, 0.1, 0.1, neg_ratio=2.0, seed=0)
    mp, val, test = _undirected(s.edge_index), _undirected(s.val_pos), _undirected(s.test_pos)
    assert not (mp & val) and not (mp & test) and not (val & test), "held out in both directions"
    assert _undirected(s.test_edge_index) == mp | val and _set(s.test_edge_index) == {(j, i) for i, j in _set(s.test_edge_index)}
    assert mp | val | test == _undirected(cora.edge_index), "every undirected edge in exactly one split"
    assert s.train_pos.size(1) + s.val_pos.size(1) + s.test_pos.size(1) == len(_undirected(cora.edge_index))
    graph = _set(cora.edge_index)
    for neg in (s.val_neg, s.test_neg):
        assert not (_set(neg) & graph), "negatives are non-edges of the whole graph"
    assert s.val_neg.size(1) == 2 * s.val_pos.size(1) and not (_set(s.val_neg) & _set(s.test_neg))
    idx, label = s.labelled("val")
    assert idx.size(1) == label.numel() and int(label.sum()) == s.val_pos.size(1)


def test_directed_graph_holds_out_one_direction() -> None:
    ei = torch.tensor([[0, 1, 2, 3, 4, 0, 2], [1, 2, 3, 4, 0, 2, 0]])
    s = link_split(ei, 5, num_val=2, num_test=1, seed=0)
    assert not s.undirected and s.val_pos.size(1) == 2 and s.test_pos.size(1) == 1
    assert _set(s.edge_index) | _set(s.val_pos) | _set(s.test_pos) == _set(ei)
    assert not (_set(s.edge_index) & (_set(s.val_pos) | _set(s.test_pos)))


def test_deterministic_and_seeded(cora) -> None:
    a, b = link_split(cora.edge_index, cora.num_nodes, seed=1), link_split(cora.edge_index, cora.num_nodes, seed=1)
    assert torch.equal(a.val_pos, b.val_pos) and torch.equal(a.val_neg, b.val_neg)
    assert not torch.equal(a.val_pos, link_split(cora.edge_index, cora.num_nodes, seed=2).val_pos)


def test_bad_arguments_are_named(cora) -> None:
    with pytest.raises(ValueError, match="no training edge"):
        link_split(cora.edge_index, cora.num_nodes, 0.6, 0.5)
    with pytest.raises(ValueError, match="not symmetric"):
        link_split(torch.tensor([[0], [1]]), 2, num_val=0, num_test=0, undirected=True)
    with pytest.raises(ValueError, match="fraction"):
        link_split(cora.edge_index, cora.num_nodes, num_val=1.5)
