"""HaloLinkDataModule: every pair scored once over the ranks, no leakage into message passing, per-epoch negatives."""

from __future__ import annotations

import pickle

import lightning as L
import pytest
import torch
from torch_geometric.data import Data

from lightning_halo.data.datasets import load_bundled
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
    assert dm.test_data is None and dm.batch("test").shares_structure(dm.partition)


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
    bad = HaloLinkDataModule(Data(x=data.x, edge_index=torch.tensor([[0], [50]])), cache_dir=str(tmp_path))
    for _ in range(2):  # at the first use, and again at the next (nothing half-built is kept)
        with pytest.raises(ValueError, match="edge_index"):
            bad.split
    int32 = _make(tmp_path, data=Data(x=data.x, edge_index=ei.int()), num_val=5, num_test=5)
    assert torch.equal(int32.split.val_pos, dm.split.val_pos)


def test_nothing_heavy_happens_in_init(tmp_path, monkeypatch) -> None:
    """Constructing (on every rank, by a CLI printing its config, ...) reads, validates and splits nothing; the
    first use does, once."""
    import lightning_halo.data.link_datamodule as module

    calls: list[str] = []
    for name in ("load_graph", "validate_graph", "link_split", "NegativeSampler"):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    dm = HaloLinkDataModule("cora", cache_dir=str(tmp_path), seed=4, partitioner="random", balance="edges")
    HaloLinkDataModule(load_bundled("cora"), cache_dir=str(tmp_path))
    assert calls == [], f"__init__ ran {calls}"
    assert pickle.loads(pickle.dumps(dm)).split.val_pos.size(1) == 527, "picklable (spawn), the split made after"
    calls.clear()
    assert dm.split.val_pos.size(1) == 527 and dm.num_features == 1433
    assert calls == ["load_graph", "validate_graph", "link_split"], "the split needs the graph, once"
    dm.negatives(0), dm.negatives(1)
    assert calls.count("NegativeSampler") == 1, "training's sampler, built at first use"
    for inner in (dm, dm.test_data):  # the options reach both partitionings
        assert (inner.partitioner, inner.balance, inner.seed, inner.cache_dir) == ("random", "edges", 4, tmp_path)


class _HoldsTheTrainBatch(L.Callback):
    """Keeps the training step's batch and reads its pairs again after the validation loop that follows."""

    def __init__(self) -> None:
        self.held, self.pairs, self.after_validation = None, None, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.held, self.pairs = batch, batch.edge_label_index.clone()

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if self.held is not None:
            self.after_validation.append(torch.equal(self.held.edge_label_index, self.pairs))


def test_each_stage_has_its_own_batch_and_shares_the_partition(tmp_path) -> None:
    """A callback holding the train batch still sees the train pairs after validation ran; the stages' batches
    are distinct objects over the same tensors (no copy of the partition)."""
    from lightning_halo.models import LinkPredictor

    dm = HaloLinkDataModule("cora", cache_dir=str(tmp_path))
    hold = _HoldsTheTrainBatch()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[hold])  # fmt: skip
    trainer.fit(LinkPredictor(dm.num_features, hidden_channels=8, out_channels=8), datamodule=dm)
    assert hold.after_validation == [True, True], "validation pairs were written into the held train batch"
    assert hold.pairs.size(1) == 2 * dm.split.train_pos.size(1)
    train, val = dm.batch("train"), dm.batch("val")
    assert train is not val and "edge_label_index" not in dm.partition
    assert train.x is val.x is dm.partition.x and train.shares_structure(val)
    assert torch.equal(val.edge_label_index, dm.pairs("val")[0])
