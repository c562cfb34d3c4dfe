"""HaloLinkDataModule: every pair scored once over the ranks, no leakage into message passing, per-epoch negatives."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from lightning_halo.data.link_datamodule import HaloLinkDataModule
from lightning_halo.link.negatives import negative_sampling
from tests.support.trainer import FakeTrainer


def _ranks(dm: HaloLinkDataModule, world: int) -> list[HaloLinkDataModule]:
    """One set-up data module per rank, built with ``dm``'s arguments (each loads its own part)."""
    out = []
    for r in range(world):
        rank_dm = HaloLinkDataModule(*_ARGS[id(dm)])
        rank_dm.trainer = FakeTrainer(world, r)  # type: ignore[assignment]
        rank_dm.prepare_data()
        rank_dm.setup("fit")
        rank_dm.setup("test")
        out.append(rank_dm)
    return out


_ARGS: dict[int, tuple] = {}  # the arguments each test's data module was built with, by id


def _make(tmp_path, data="cora", num_val=0.1, num_test=0.1, neg_ratio=1.0) -> HaloLinkDataModule:
    args = (data, num_val, num_test, neg_ratio, None, 0, None, "metis", "nodes", str(tmp_path / "cache"))
    dm = HaloLinkDataModule(*args)
    _ARGS[id(dm)] = args
    return dm


def _cols(ei: torch.Tensor) -> list[tuple[int, int]]:
    return list(map(tuple, ei.t().tolist()))


@pytest.mark.parametrize("world", [2, 3])
def test_every_pair_once_and_owned_by_its_source(tmp_path, world) -> None:
    dm = _make(tmp_path, num_val=0.1, num_test=0.05, neg_ratio=2.0)
    ranks = _ranks(dm, world)
    for stage, epoch in (("train", 0), ("train", 3), ("val", 0), ("test", 0)):
        got, labels = [], []
        for r, rdm in enumerate(ranks):
            index, label = rdm.pairs(stage, epoch)
            owned = rdm.batch(stage).n_id  # the nodes of this rank in the stage's partitioning
            assert bool(torch.isin(index[0], owned).all()), f"rank {r} scores a pair it does not own"
            got += _cols(index)
            labels.append(label)
        if stage == "train":
            want = torch.cat([dm.split.train_pos, dm.negatives(epoch)], 1)
        else:
            want = dm.split.labelled(stage)[0]
        assert sorted(got) == sorted(_cols(want)), f"{stage}: the ranks' pairs are not exactly the split's"
        assert int(torch.cat(labels).sum()) == {"train": dm.split.train_pos, "val": dm.split.val_pos,
                                                "test": dm.split.test_pos}[stage].size(1)  # fmt: skip


def _both_ways(ei: torch.Tensor) -> set:
    return set(_cols(ei)) | set(_cols(ei.flip(0)))


def _global_edges(part) -> set:
    gid = part.global_id
    return set(_cols(torch.stack([gid[part.edge_index[0]], gid[part.edge_index[1]]])))


def test_message_passing_excludes_held_out_edges(tmp_path) -> None:
    dm = _make(tmp_path)
    val, test = _both_ways(dm.split.val_pos), _both_ways(dm.split.test_pos)
    train_graph, test_graph = set(), set()
    for rdm in _ranks(dm, 2):
        train_graph |= _global_edges(rdm.batch("train"))
        test_graph |= _global_edges(rdm.batch("test"))
    assert not (train_graph & (val | test)), "a validation/test edge (either direction) is in training's message passing"
    assert train_graph == _both_ways(dm.split.train_pos)
    assert test_graph == train_graph | val, "the test stage passes messages over training + validation edges"


def test_negatives_new_each_epoch_and_reproducible_single_process(tmp_path) -> None:
    dm = _make(tmp_path, neg_ratio=1.0)
    n0, n1 = dm.negatives(0), dm.negatives(1)
    assert n0.size(1) == dm.split.train_pos.size(1) == dm.num_train_negatives
    assert not torch.equal(n0, n1)
    same = negative_sampling(dm.split.edge_index, dm.num_nodes, dm.num_train_negatives, seed=0, epoch=1)
    assert torch.equal(same, n1), "a single-process negative_sampling call draws what the ranks get"


def test_one_partitioning_without_validation_edges_in_test(tmp_path) -> None:
    dm = HaloLinkDataModule("cora", cache_dir=str(tmp_path / "cache"), test_with_val_edges=False)
    dm.trainer = FakeTrainer(1, 0)  # type: ignore[assignment]
    dm.setup("test")
    assert dm.test_data is None and dm.batch("test") is dm.partition


def test_batch_carries_the_stage_pairs(tmp_path) -> None:
    (rdm,) = _ranks(_make(tmp_path), 1)
    part = rdm.batch("val")
    index, label = rdm.pairs("val")
    assert torch.equal(part.edge_label_index, index) and torch.equal(part.edge_label, label)
    assert next(iter(rdm.train_dataloader())).edge_label_index.size(1) == 2 * rdm.split.train_pos.size(1)


def test_graph_without_labels_and_bad_input(tmp_path) -> None:
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 50, (2, 200), generator=g)
    data = Data(x=torch.randn(50, 4, generator=g), edge_index=ei)
    dm = _make(tmp_path, data=data, num_val=5, num_test=5)
    assert not dm.split.undirected and dm.split.val_pos.size(1) == 5
    (rdm,) = _ranks(dm, 1)
    assert rdm.pairs("train")[0].size(1) > 0
    with pytest.raises(RuntimeError, match="setup"):
        _make(tmp_path, data=data, num_val=5, num_test=5).pairs("val")
    with pytest.raises(ValueError, match="edge_index"):
        HaloLinkDataModule(Data(x=data.x, edge_index=torch.tensor([[0], [50]])), cache_dir=str(tmp_path))
    int32 = _make(tmp_path, data=Data(x=data.x, edge_index=ei.int()), num_val=5, num_test=5)
    assert torch.equal(int32.split.val_pos, dm.split.val_pos)
