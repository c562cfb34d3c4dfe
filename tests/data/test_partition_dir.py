"""Partition directories: identical to in-memory partitions, read part by part, and every bad input named."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

import lightning_halo.partition.chunks as chunks
from lightning_halo import HaloDataModule, HaloPartition
from lightning_halo.data import GraphValidationError, PartitionFileError, load_npy_graph, save_npy_graph
from lightning_halo.data.offline import partition_to_dir
from lightning_halo.data.partition_dir import FORMAT_VERSION, read_manifest
from lightning_halo.partition import build_halo_partitions, partition_graph, partition_stats
from tests.support.graphs import awkward_graph, cora
from tests.support.trainer import FakeTrainer


def _setup(dm: HaloDataModule, world_size: int, rank: int) -> HaloPartition:
    dm.trainer = FakeTrainer(world_size, rank)  # type: ignore[assignment]
    dm.prepare_data()
    dm.setup("fit")
    assert dm.partition is not None
    return dm.partition


def assert_same_partition(a: HaloPartition, b: HaloPartition) -> None:
    """Same attributes in the same (storage) order, same dtypes, shapes and bits."""
    # not `keys()`: PyG returns those through a set, whose order is not the storage order
    assert list(a.to_dict()) == list(b.to_dict())
    for key in a.to_dict():
        va, vb = a[key], b[key]
        if isinstance(va, torch.Tensor):
            assert va.dtype == vb.dtype and va.shape == vb.shape, key
            assert torch.equal(va, vb), key
        else:
            assert va == vb, key


def _source(kind: str, data: Data, tmp_path: Path) -> object:
    if kind == "data":
        return data
    if kind == "file":
        torch.save(Data(**data.to_dict()), tmp_path / "graph.pt")  # fresh: no PyG attribute cache in it
        return tmp_path / "graph.pt"
    return save_npy_graph(data, tmp_path / "graph-npy")


@pytest.mark.parametrize("kind", ["data", "file", "npy"])
@pytest.mark.parametrize("graph", ["awkward", "cora"])
@pytest.mark.parametrize("num_parts", [1, 2, 3, 4])
def test_directory_equals_in_memory_partitions(kind: str, graph: str, num_parts: int, tmp_path: Path, monkeypatch) -> None:
    data = awkward_graph(num_parts) if graph == "awkward" else cora()
    expect = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, num_parts), num_parts)
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 4096)  # many windows: their seams must not show
    manifest = partition_to_dir(_source(kind, data, tmp_path), tmp_path / "out", num_parts)
    assert manifest["stats"] == partition_stats(expect)
    assert (manifest["graph"]["num_features"], manifest["graph"]["num_classes"]) == (data.num_features, int(data.y.max()) + 1)
    dm = HaloDataModule(str(tmp_path / "out"))
    for p in range(num_parts):
        part = _setup(dm, num_parts, p)
        assert_same_partition(part, expect[p])
        rows = part.input_rows()  # x and halo_x: one mapped tensor, as in memory
        assert rows is not None and rows.data_ptr() == part.x.data_ptr()


def test_memory_mapped_parts_are_read_only_on_disk(tmp_path: Path) -> None:
    partition_to_dir(awkward_graph(2), tmp_path / "out", 2)
    before = (tmp_path / "out" / "part_0.pt").read_bytes()
    part = _setup(HaloDataModule(str(tmp_path / "out")), 2, 0)
    part.x.mul_(2.0)  # copy-on-write: the rank's memory changes, the file does not
    assert (tmp_path / "out" / "part_0.pt").read_bytes() == before


def test_cache_entry_and_directory_are_the_same_files(tmp_path: Path) -> None:
    torch.save(cora(), tmp_path / "cora.pt")
    offline = partition_to_dir(tmp_path / "cora.pt", tmp_path / "out", 3)
    dm = HaloDataModule(str(tmp_path / "cora.pt"), cache_dir=str(tmp_path / "cache"))
    cached = dm.build(3)
    assert cached["files"] == offline["files"] and cached["key"] == offline["key"]
    assert dm.cache_for(3).dir == tmp_path / "cache" / offline["key"]


def test_ranks_read_the_manifest_and_their_part_only(tmp_path: Path) -> None:
    torch.save(awkward_graph(3), tmp_path / "graph.pt")
    partition_to_dir(tmp_path / "graph.pt", tmp_path / "out", 3)
    (tmp_path / "graph.pt").unlink()  # the graph is gone: nothing can read it
    (tmp_path / "out" / "part_2.pt").unlink()  # and rank 1 does not need rank 2's part
    dm = HaloDataModule(str(tmp_path / "out"))
    assert (dm.num_features, dm.num_classes) == (8, 3)
    assert int(_setup(dm, 3, 1).part_id) == 1
    with pytest.raises(ValueError, match="partition directory"):
        dm.data


def test_path_source_facts_are_computed_once_and_follow_the_file(tmp_path: Path, monkeypatch) -> None:
    import lightning_halo.data.sources as sources

    calls = []
    real = sources.graph_facts
    monkeypatch.setattr(sources, "graph_facts", lambda *a: calls.append(1) or real(*a))
    data = awkward_graph(2)
    torch.save(data, tmp_path / "graph.pt")
    cache = str(tmp_path / "cache")
    first = HaloDataModule(str(tmp_path / "graph.pt"), cache_dir=cache)
    assert first.num_features == 8
    for rank in range(2):  # every other process reads the source manifest instead of the graph
        dm = HaloDataModule(str(tmp_path / "graph.pt"), cache_dir=cache)
        _setup(dm, 2, rank)
    assert len(calls) == 1
    key = first.cache_for(2).key
    data.x[0, 0] += 1.0
    torch.save(data, tmp_path / "graph.pt")  # changed after partitioning: new facts, new key, new partition
    os.utime(tmp_path / "graph.pt", ns=(1, 1))
    changed = HaloDataModule(str(tmp_path / "graph.pt"), cache_dir=cache)
    part = _setup(changed, 2, 0)
    assert len(calls) == 2 and changed.cache_for(2).key != key
    assert torch.equal(part.x, data.x[part.inner_global_id])


# ------------------------------------------------------------------------------------- bad inputs
def _written(tmp_path: Path, parts: int = 2) -> Path:
    out = tmp_path / "out"
    partition_to_dir(awkward_graph(parts), out, parts)
    return out


def _contents(directory: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(directory.iterdir())}


@pytest.mark.parametrize("name", ["part_1.pt", "adj_1.pt"])
def test_missing_part_file(name: str, tmp_path: Path) -> None:
    out = _written(tmp_path)
    (out / name).unlink()
    before = _contents(out)
    with pytest.raises(PartitionFileError, match=rf"{name} is missing: .* holds 3 of the 4 files its manifest lists"):
        _setup(HaloDataModule(str(out)), 2, 1)
    assert _contents(out) == before, "nothing in the directory may change"


def test_truncated_part_file(tmp_path: Path) -> None:
    out = _written(tmp_path)
    (out / "part_0.pt").write_bytes((out / "part_0.pt").read_bytes()[:-10])
    before = _contents(out)
    with pytest.raises(PartitionFileError, match=r"bytes but manifest.json records .*truncated or an incomplete copy"):
        _setup(HaloDataModule(str(out)), 2, 0)
    assert _contents(out) == before


def test_part_file_changed_after_partitioning(tmp_path: Path) -> None:
    out = _written(tmp_path)
    raw = bytearray((out / "part_0.pt").read_bytes())
    raw[-200] ^= 0xFF  # same size, other bytes
    (out / "part_0.pt").write_bytes(bytes(raw))
    before = _contents(out)
    with pytest.raises(PartitionFileError, match="does not match the SHA-256 recorded in manifest.json: it changed after"):
        _setup(HaloDataModule(str(out)), 2, 0)
    assert _contents(out) == before


def test_directory_for_another_part_count(tmp_path: Path) -> None:
    out = _written(tmp_path, parts=3)
    with pytest.raises(ValueError, match=r"holds 3 parts but the Trainer runs 2 processes.*--parts 2"):
        _setup(HaloDataModule(str(out)), 2, 0)


def test_manifest_of_another_version_or_garbage(tmp_path: Path) -> None:
    out = _written(tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "format_version": 2}))
    with pytest.raises(PartitionFileError, match=f"format version 2, this lightning-halo reads version {FORMAT_VERSION}"):
        HaloDataModule(str(out)).num_features
    (out / "manifest.json").write_text("{trunc")
    with pytest.raises(PartitionFileError, match="unreadable or truncated"):
        read_manifest(out)


def test_directory_without_manifest(tmp_path: Path) -> None:
    out = _written(tmp_path)
    (out / "manifest.json").unlink()
    with pytest.raises(GraphValidationError, match="neither a partition directory .* nor a graph directory"):
        HaloDataModule(str(out), cache_dir=str(tmp_path / "cache")).num_features


def test_feature_array_of_the_wrong_length(tmp_path: Path) -> None:
    graph = save_npy_graph(awkward_graph(2), tmp_path / "g")
    np.save(graph / "x.npy", np.zeros((150, 8), dtype=np.float64))  # 160 nodes elsewhere
    with pytest.raises(GraphValidationError, match=r"y.npy has 160 rows but x.npy has 150"):
        partition_to_dir(graph, tmp_path / "out", 2)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*")), "nothing half-written"


def test_graph_directory_without_features(tmp_path: Path) -> None:
    graph = save_npy_graph(awkward_graph(2), tmp_path / "g")
    (graph / "x.npy").unlink()
    with pytest.raises(GraphValidationError, match="has no x.npy"):
        load_npy_graph(graph)


def test_graph_directory_values_are_validated(tmp_path: Path) -> None:
    data = awkward_graph(2)
    data.x[7, 1] = float("nan")
    with pytest.raises(GraphValidationError, match=r"NaN or Inf \(first at node 7\)"):
        partition_to_dir(save_npy_graph(data, tmp_path / "g"), tmp_path / "out", 2)


def test_out_directory_is_never_clobbered(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds other files"):
        partition_to_dir(awkward_graph(2), out, 2)
    with pytest.raises(FileExistsError, match="not a partition directory"):
        partition_to_dir(awkward_graph(2), out, 2, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"
    shutil.rmtree(out)
    first = partition_to_dir(awkward_graph(2), out, 2)
    assert partition_to_dir(awkward_graph(2), out, 2) == first, "the same partitioning again: nothing to do"
    with pytest.raises(FileExistsError, match="another partitioning.*--overwrite"):
        partition_to_dir(awkward_graph(2), out, 3)
    assert partition_to_dir(awkward_graph(2), out, 3, overwrite=True)["num_parts"] == 3
    assert sorted(f.name for f in out.iterdir()) == ["adj_0.pt", "adj_1.pt", "adj_2.pt", "manifest.json", "part_0.pt",
                                                      "part_1.pt", "part_2.pt"]  # fmt: skip


@pytest.mark.parametrize("partitioner", ["kaminpar", "auto"])
def test_directory_records_which_partitioner_ran(partitioner: str, tmp_path: Path) -> None:
    data = cora()
    manifest = partition_to_dir(data, tmp_path / "out", 3, partitioner=partitioner)
    ran = "kaminpar" if partitioner == "kaminpar" else "metis"  # Cora fits any machine's budget for METIS
    expect = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, 3, partitioner=ran), 3)
    assert manifest["partitioner"] == partitioner and manifest["partitioned_with"]["partitioner"] == ran
    assert manifest["stats"] == partition_stats(expect)
    assert {"edge_cut", "balance"} <= set(manifest["stats"]) and manifest["timings"]["partition_s"] > 0
    if partitioner == "auto":
        assert manifest["partitioned_with"]["metis_predicted_bytes"] <= manifest["partitioned_with"]["memory_budget"]
    else:
        assert manifest["partitioned_with"]["threads"] == 1
    dm = HaloDataModule(str(tmp_path / "out"))
    for p in range(3):
        assert_same_partition(_setup(dm, 3, p), expect[p])
    assert not [f for f in (tmp_path / "out").iterdir() if f.name not in manifest["files"] and f.name != "manifest.json"]


# ------------------------------------------------------------------------- tensors by storage key
def _save_in_order(monkeypatch, order: str) -> None:
    """Make ``torch.save`` meet a dict's tensors (and so number their storages) in another order than the dict's."""
    real = torch.save

    def save(obj, f, *args, **kwargs):
        if isinstance(obj, dict):
            items = list(obj.items())
            if order == "reversed":
                items.reverse()
            else:
                import random

                random.Random(0).shuffle(items)
            obj = dict(items)
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


@pytest.mark.parametrize("order", ["reversed", "shuffled"])
def test_writer_places_tensors_of_equal_size_by_name(order: str, tmp_path: Path, monkeypatch) -> None:
    from lightning_halo.data.partition_dir import _PartWriter

    # adj_col, adj_t_col and adj_t_perm have one size and dtype: a check of sizes cannot tell them apart
    state = {key: torch.arange(12, dtype=torch.long) * (i + 1) for i, key in enumerate(["a", "b", "c", "d"])}
    state["x"] = torch.arange(12, dtype=torch.float64).view(3, 4)  # as many bytes again, another dtype
    state["halo"] = state["x"][1:]  # a view: x's storage, from its second row
    _save_in_order(monkeypatch, order)
    writer = _PartWriter(tmp_path / "part.pt", state)
    writer.write("b", torch.full((3,), -7, dtype=torch.long), 4)
    writer.write("halo", torch.full((4,), -1.0, dtype=torch.float64), 4)
    writer.close()
    back = torch.load(tmp_path / "part.pt", weights_only=True)
    expect = {k: v.clone() for k, v in state.items()}
    expect["b"][4:7] = -7
    expect["x"][2] = -1.0
    expect["halo"] = expect["x"][1:]
    assert sorted(back) == sorted(state)  # (the simulated torch also saves the dict in that order)
    for key, value in expect.items():
        assert torch.equal(back[key], value), key


@pytest.mark.parametrize("order", ["reversed", "shuffled"])
def test_directory_is_right_whatever_order_torch_numbers_storages_in(order: str, tmp_path: Path, monkeypatch) -> None:
    data = awkward_graph(2)
    expect = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, 2), 2)
    _save_in_order(monkeypatch, order)
    partition_to_dir(data, tmp_path / "out", 2)
    monkeypatch.undo()
    dm = HaloDataModule(str(tmp_path / "out"))
    for p in range(2):
        part = _setup(dm, 2, p)
        assert sorted(part.to_dict()) == sorted(expect[p].to_dict())  # (saved in the simulated order)
        for key, value in expect[p].to_dict().items():
            if isinstance(value, torch.Tensor):
                assert part[key].dtype == value.dtype and torch.equal(part[key], value), key
            else:
                assert part[key] == value, key


# --------------------------------------------------------------------------- checksums, read once
def test_ranks_read_their_part_in_full_once_and_still_refuse_a_changed_one(tmp_path: Path, monkeypatch) -> None:
    import time

    import lightning_halo.data.checksums as checksums
    from tests.support.files import damage_in_place

    out = _written(tmp_path)
    real_now, real_sha = time.time_ns, checksums.file_sha256
    monkeypatch.setattr(checksums, "time_ns", lambda: real_now() + 10**10)  # a start after the partition step
    reads: list[str] = []
    monkeypatch.setattr(checksums, "file_sha256", lambda path: reads.append(Path(path).name) or real_sha(path))
    cache = str(tmp_path / "cache")
    first = _setup(HaloDataModule(str(out), cache_dir=cache), 2, 0)
    assert sorted(reads) == ["adj_0.pt", "part_0.pt"]
    again = _setup(HaloDataModule(str(out), cache_dir=cache), 2, 0)  # every later start: no full read
    assert sorted(reads) == ["adj_0.pt", "part_0.pt"]
    assert_same_partition(again, first)
    damage_in_place(out / "part_0.pt")
    before = _contents(out)
    with pytest.raises(PartitionFileError, match=r"out/part_0.pt does not match the SHA-256 .*re-run `lightning-halo partition"):
        _setup(HaloDataModule(str(out), cache_dir=cache), 2, 0)
    assert _contents(out) == before, "the user's directory is never written"


def test_writer_refuses_a_file_whose_tensors_it_cannot_place(tmp_path: Path, monkeypatch) -> None:
    import lightning_halo.data.partition_dir as partition_dir
    from lightning_halo._compat.torch import SavedTensor
    from lightning_halo.data.partition_dir import _PartWriter
    from lightning_halo.errors import InternalError

    state = {"a": torch.arange(4), "b": torch.arange(4)}
    monkeypatch.setattr(partition_dir, "saved_tensors", lambda path: {"a": SavedTensor(0, 32, 0)})  # b's record lost
    with pytest.raises(InternalError, match=r"tensor 'b' of .*part.pt is not where torch .* was expected to save it"):
        _PartWriter(tmp_path / "part.pt", state)
