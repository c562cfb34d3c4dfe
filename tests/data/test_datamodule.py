"""HaloDataModule without a Trainer: partition once, cache, load own part, fail clearly."""

from __future__ import annotations

import json
import os

import pytest
import torch

from lightning_halo import HaloDataModule, HaloPartition
from lightning_halo.data.cache import PartitionCache
from tests.support.graphs import awkward_graph
from tests.support.trainer import FakeTrainer


def _dm(tmp_path, data=None, world_size: int = 2, rank: int = 0, **kw) -> HaloDataModule:
    dm = HaloDataModule(data if data is not None else awkward_graph(world_size), cache_dir=str(tmp_path), **kw)
    dm.trainer = FakeTrainer(world_size, rank)  # type: ignore[assignment]
    return dm


def test_num_features_and_classes_before_setup(tmp_path) -> None:
    dm = HaloDataModule("cora", cache_dir=str(tmp_path))
    assert (dm.num_features, dm.num_classes) == (1433, 7)
    (stored,) = (tmp_path / "sources").glob("*.json")  # for the other ranks: no graph to load
    assert json.loads(stored.read_text())["facts"]["num_features"] == 1433


def test_each_rank_gets_its_part_and_one_batch(tmp_path) -> None:
    data = awkward_graph(3)
    seen = []
    for rank in range(3):
        dm = _dm(tmp_path, data, 3, rank)
        dm.prepare_data()
        dm.setup("fit")
        batches = list(dm.train_dataloader())
        assert len(batches) == 1 and isinstance(batches[0], HaloPartition)
        assert batches[0] is dm.partition, "the same device-resident object every epoch"
        assert int(batches[0].part_id) == rank
        seen.append(batches[0].inner_global_id)
        assert list(dm.val_dataloader())[0] is dm.partition
    assert sorted(torch.cat(seen).tolist()) == list(range(data.num_nodes))


def test_partition_is_cached_and_reused(tmp_path) -> None:
    dm = _dm(tmp_path)
    dm.prepare_data()
    dirs = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert len(dirs) == 1
    meta = json.loads((dirs[0] / "manifest.json").read_text())
    mtime = os.path.getmtime(dirs[0] / "manifest.json")
    _dm(tmp_path).prepare_data()
    assert os.path.getmtime(dirs[0] / "manifest.json") == mtime, "second prepare_data must reuse the cache"
    assert meta["num_parts"] == 2 and meta["stats"]["num_parts"] == 2
    # a different parameter gives a different cache entry
    _dm(tmp_path, partitioner="random").prepare_data()
    assert len([p for p in tmp_path.iterdir() if not p.name.startswith(".")]) == 2


def test_changed_graph_changes_the_key(tmp_path) -> None:
    data = awkward_graph(2)
    _dm(tmp_path, data).prepare_data()
    data.x[0, 0] += 1.0
    _dm(tmp_path, data).prepare_data()
    assert len([p for p in tmp_path.iterdir() if not p.name.startswith(".")]) == 2


def test_corrupt_cache_is_detected_and_rebuilt(tmp_path) -> None:
    dm = _dm(tmp_path)
    dm.prepare_data()
    cache_dir = next(p for p in tmp_path.iterdir() if not p.name.startswith("."))
    part_file = cache_dir / "part_0.pt"
    part_file.write_bytes(part_file.read_bytes()[:100])  # truncated
    dm2 = _dm(tmp_path)
    with pytest.warns(UserWarning, match="corrupt"):
        dm2.setup("fit")
    assert dm2.partition is not None and int(dm2.partition.part_id) == 0
    assert PartitionCache(tmp_path, cache_dir.name).load_part(0).n_inner == dm2.partition.n_inner


def test_num_parts_must_equal_world_size(tmp_path) -> None:
    dm = _dm(tmp_path, num_parts=3)
    dm.prepare_data()  # never raises alone on local rank 0 (peers would wait); setup raises on all ranks
    with pytest.raises(ValueError, match=r"num_parts=3\) but the Trainer runs 2 processes"):
        dm.setup("fit")


def test_num_parts_larger_than_graph(tmp_path) -> None:
    from torch_geometric.data import Data

    tiny = Data(
        x=torch.randn(2, 1),
        edge_index=torch.tensor([[0], [1]]),
        y=torch.zeros(2, dtype=torch.long),
        train_mask=torch.ones(2, dtype=torch.bool),
        val_mask=torch.ones(2, dtype=torch.bool),
        test_mask=torch.ones(2, dtype=torch.bool),
    )
    dm = _dm(tmp_path, tiny, world_size=3)
    with pytest.raises(ValueError, match="exceeds the number of nodes \\(2\\)"):
        dm.setup("fit")


def test_constructor_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="partitioner"):
        HaloDataModule("cora", partitioner="kahip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_parts"):
        HaloDataModule("cora", num_parts=0)


def test_loader_before_setup_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="setup"):
        HaloDataModule("cora").train_dataloader()


def test_a_partition_directory_is_never_rewritten(tmp_path) -> None:
    from lightning_halo.data.offline import partition_to_dir
    from lightning_halo.errors import InternalError

    partition_to_dir(awkward_graph(2), tmp_path / "parts", 2)
    dm = HaloDataModule(str(tmp_path / "parts"))
    before = {f.name: f.read_bytes() for f in (tmp_path / "parts").iterdir()}
    with pytest.raises(InternalError, match="never rewritten"):
        dm._write(PartitionCache(tmp_path / "cache", "k"), 2)
    assert {f.name: f.read_bytes() for f in (tmp_path / "parts").iterdir()} == before
