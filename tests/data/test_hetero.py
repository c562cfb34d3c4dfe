"""Heterogeneous graphs through HaloDataModule: every source it reads, the cache and its manifest, the batch,
predictions in global order, and bad inputs refused naming the type."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_halo import GraphValidationError, HaloDataModule
from lightning_halo.data import save_npy_graph
from lightning_halo.data.hetero import HeteroPartitionDirectory, hetero_fingerprint, load_npy_hetero_graph
from lightning_halo.partition.hetero import HeteroHaloPartition, assign_hetero_parts, build_hetero_partitions
from tests.support.hetero import generated_hetero
from tests.support.trainer import FakeTrainer


def _setup(dm: HaloDataModule, world_size: int, rank: int) -> HeteroHaloPartition:
    dm.trainer = FakeTrainer(world_size, rank)  # type: ignore[assignment]
    dm.prepare_data()
    dm.setup("fit")
    assert isinstance(dm.partition, HeteroHaloPartition)
    return dm.partition


def _same_part(a: HeteroHaloPartition, b: HeteroHaloPartition) -> None:
    assert a.node_types == b.node_types and a.edge_types == b.edge_types
    for t in a.node_types:
        for key in ("n_id", "send_index", "send_counts", "recv_counts"):
            assert torch.equal(a[t][key], b[t][key]), (t, key)
        if "x" in a[t]:
            assert torch.equal(a[t].x, b[t].x) and torch.equal(a[t].halo_x, b[t].halo_x), t
    for e in a.edge_types:
        assert torch.equal(a[e].edge_index, b[e].edge_index) and torch.equal(a[e].e_id, b[e].e_id), e


@pytest.mark.parametrize("source", ["memory", "file", "graph directory"])
def test_every_source_gives_each_rank_the_same_part(source: str, tmp_path: Path) -> None:
    data = generated_hetero()
    given = {"memory": lambda: data, "file": lambda: (torch.save(data, tmp_path / "g.pt"), str(tmp_path / "g.pt"))[1],
             "graph directory": lambda: str(save_npy_graph(data, tmp_path / "g"))}[source]()  # fmt: skip
    expected = build_hetero_partitions(data, assign_hetero_parts(data, 2))
    for rank in range(2):
        dm = HaloDataModule(given, cache_dir=str(tmp_path / "cache"))
        assert dm.hetero and dm.labelled_type == "paper" and dm.num_classes == 3
        assert dm.num_features == {"paper": 6, "author": 4, "venue": 0}
        assert dm.num_nodes == {"paper": 300, "author": 200, "venue": 7}
        assert dm.metadata == (data.metadata()[0], data.metadata()[1])
        part = _setup(dm, 2, rank)
        _same_part(part, expected[rank])
        assert part.num_train_global == int(data["paper"].train_mask.sum())
        assert torch.equal(part["paper"].y, data["paper"].y[part["paper"].n_id[: part["paper"].n_inner]])


def test_a_graph_directory_round_trips(tmp_path: Path) -> None:
    data = generated_hetero()
    back = load_npy_hetero_graph(save_npy_graph(data, tmp_path / "g"))
    assert back.node_types == data.node_types and back.edge_types == data.edge_types
    assert back["venue"].num_nodes == 7 and hetero_fingerprint(back) == hetero_fingerprint(data)


def test_the_cache_is_reused_and_its_manifest_counts_per_type(tmp_path: Path) -> None:
    data = generated_hetero()
    dm = HaloDataModule(data, cache_dir=str(tmp_path))
    manifest = dm.build(3)
    store = dm.cache_for(3)
    assert isinstance(store, HeteroPartitionDirectory) and store.verify()
    stats = manifest["stats"]
    parts = [store.load_part(p) for p in range(3)]
    for p, part in enumerate(parts):
        for t in part.node_types:
            assert stats["parts"][p][t] == {"inner": int(part[t].n_inner), "halo": int(part[t].num_nodes) - int(part[t].n_inner)}
        for e in part.edge_types:
            assert stats["parts"][p]["__".join(e)] == {"edges": int(part[e].edge_index.size(1))}
    assert sum(stats["halo_rows_per_type"].values()) == stats["halo_rows"]
    assert stats["labelled_balance"] <= 1.05 + 1e-9
    mtime = (store.dir / "manifest.json").stat().st_mtime_ns
    assert HaloDataModule(data, cache_dir=str(tmp_path)).build(3) == manifest
    assert (store.dir / "manifest.json").stat().st_mtime_ns == mtime, "a complete entry is read, not rewritten"


def test_a_damaged_cached_part_is_rebuilt(tmp_path: Path) -> None:
    data = generated_hetero()
    dm = HaloDataModule(data, cache_dir=str(tmp_path))
    dm.build(2)
    path = dm.cache_for(2).dir / "part_1.pt"
    raw = bytearray(path.read_bytes())
    raw[-200] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="corrupt"):
        part = _setup(HaloDataModule(data, cache_dir=str(tmp_path)), 2, 1)
    _same_part(part, build_hetero_partitions(data, assign_hetero_parts(data, 2))[1])


def test_predictions_of_the_labelled_type_come_back_in_global_order(tmp_path: Path) -> None:
    data = generated_hetero()
    dm = HaloDataModule(data, cache_dir=str(tmp_path))
    part = _setup(dm, 1, 0)
    rows = part["paper"].n_id[: part["paper"].n_inner].double().unsqueeze(1)  # each row names its node
    got = dm.gather_predictions([rows])
    assert torch.equal(got.squeeze(1), torch.arange(300, dtype=torch.double))
    authors = dm.gather_predictions([part["author"].n_id[: part["author"].n_inner].double()], node_type="author")
    assert torch.equal(authors, torch.arange(200, dtype=torch.double))


def _drop_x(g):
    del g["author"].x


def _bad_edge_type(g):
    g["paper", "at", "lab"].edge_index = torch.tensor([[0], [0]])


def _no_labels(g):
    del g["paper"].y


def _out_of_range(g):
    g["author", "writes", "paper"].edge_index[0, 0] = 10_000


def _node_list(g):
    g["author"].names = [str(i) for i in range(g["author"].num_nodes)]


def _edge_list(g):
    g["author", "writes", "paper"].tags = ["t"] * g["author", "writes", "paper"].edge_index.size(1)


def _array(g):
    g["venue"].year = np.arange(7)


@pytest.mark.parametrize(
    ("mutate", "says"),
    [(_drop_x, "node type 'author' has neither x nor num_nodes"), (_bad_edge_type, "names the target node type 'lab'"),
     (_no_labels, "no node type has labels y"), (_out_of_range, r"source ids run from 0 to 10000.*node type 'author'"),
     (_node_list, "node type 'author': `names` is a list with one entry per node"),
     (_edge_list, r"edge type \('author', 'writes', 'paper'\): `tags` is a list with one entry per edge"),
     (_array, "node type 'venue': `year` is a NumPy array")],
)  # fmt: skip
def test_bad_graphs_are_refused_naming_the_type(mutate, says: str, tmp_path: Path) -> None:
    data = generated_hetero()
    mutate(data)
    with pytest.raises(GraphValidationError, match=says):
        HaloDataModule(data, cache_dir=str(tmp_path)).num_classes


def test_partition_command_writes_a_directory_the_data_module_reads(tmp_path: Path, partition_cli) -> None:
    data = generated_hetero()
    torch.save(data, tmp_path / "g.pt")
    out = tmp_path / "parts"
    code, stdout, stderr = partition_cli(str(tmp_path / "g.pt"), "--parts", "2", "--out", str(out))
    assert code == 0, stderr
    assert "paper balance" in stdout and "paper__cites__paper" in stdout
    code, again, stderr = partition_cli(str(out))  # a written directory: its table
    assert code == 0 and "paper balance" in again, stderr
    assert partition_cli(str(out), "--parts", "3")[0] != 0, "its part count is fixed"
    for rank in range(2):
        dm = HaloDataModule(str(out))
        assert dm.reads_partition_dir and dm.num_features["paper"] == 6
        _same_part(_setup(dm, 2, rank), build_hetero_partitions(data, assign_hetero_parts(data, 2))[rank])


def _magnn_dblp_raw(root: Path, seed: int = 0) -> dict:
    """A small graph in the raw files PyG's ``DBLP`` class reads (MAGNN's layout: one adjacency over all
    types, author/paper/term/conference in that order), and what it holds."""
    import numpy as np
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    n = {"author": 40, "paper": 60, "term": 30, "conference": 5}
    offset = dict(zip(n, np.cumsum([0, *n.values()])[:-1].tolist()))
    pairs = {("paper", "author"): 120, ("paper", "term"): 150, ("paper", "conference"): 60}
    rows, cols = [], []
    for (src, dst), count in pairs.items():  # both directions, as MAGNN stores them
        s, d = rng.integers(0, n[src], count) + offset[src], rng.integers(0, n[dst], count) + offset[dst]
        rows += [s, d]
        cols += [d, s]
    total = sum(n.values())
    adj = sp.coo_matrix((np.ones(sum(len(r) for r in rows)), (np.concatenate(rows), np.concatenate(cols))),
                        shape=(total, total)).tocsr()  # fmt: skip
    adj.data[:] = 1.0  # repeated pairs are one edge
    raw = root / "raw"
    raw.mkdir(parents=True)
    sp.save_npz(raw / "adjM.npz", adj)
    sp.save_npz(raw / "features_0.npz", sp.csr_matrix(rng.random((n["author"], 8)) < 0.3, dtype=np.float32))
    sp.save_npz(raw / "features_1.npz", sp.csr_matrix(rng.random((n["paper"], 6)) < 0.3, dtype=np.float32))
    np.save(raw / "features_2.npy", rng.standard_normal((n["term"], 4)).astype(np.float32))
    np.save(raw / "node_types.npy", np.repeat(np.arange(4), list(n.values())))
    np.save(raw / "labels.npy", rng.integers(0, 4, n["author"]))
    idx = rng.permutation(n["author"])
    np.savez(raw / "train_val_test_idx.npz", train_idx=idx[:20], val_idx=idx[20:30], test_idx=idx[30:])
    return {"num_nodes": n, "train": idx[:20]}


def test_a_pyg_heterogeneous_class_is_read_from_its_raw_files(tmp_path: Path) -> None:
    """pyg:DBLP:<root> (PyG's class over MAGNN's files, nothing downloaded): a heterogeneous data module whose
    types, sizes, labels and masks are the class's own, partitioned like any HeteroData."""
    from torch_geometric.datasets import DBLP

    made = _magnn_dblp_raw(tmp_path / "dblp")
    spec = f"pyg:DBLP:{tmp_path / 'dblp'}"
    dm = HaloDataModule(spec, cache_dir=str(tmp_path / "cache"))
    assert dm.hetero and dm.labelled_type == "author" and dm.num_classes == 4
    assert dm.num_nodes == made["num_nodes"]
    assert dm.num_features == {"author": 8, "paper": 6, "term": 4, "conference": 0}
    import shutil

    shutil.copytree(tmp_path / "dblp", tmp_path / "direct")
    direct = DBLP(str(tmp_path / "direct"))[0]  # what a user gets from PyG itself
    assert dm.metadata == (direct.metadata()[0], direct.metadata()[1])
    parts = [_setup(HaloDataModule(spec, cache_dir=str(tmp_path / "cache")), 2, r) for r in range(2)]
    owned = torch.cat([p["author"].n_id[: p["author"].n_inner] for p in parts])
    assert sorted(owned.tolist()) == list(range(made["num_nodes"]["author"]))
    train = torch.cat([p["author"].n_id[: p["author"].n_inner][p["author"].train_mask] for p in parts])
    assert sorted(train.tolist()) == sorted(made["train"].tolist())
    for p in parts:
        ids = p["author"].n_id[: p["author"].n_inner]
        assert torch.equal(p["author"].y, direct["author"].y[ids])


def test_a_pyg_homogeneous_class_is_still_a_homogeneous_graph(tmp_path: Path) -> None:
    from lightning_halo.data.pyg_datasets import may_be_heterogeneous

    assert not may_be_heterogeneous("pyg:Planetoid:x:Cora") and may_be_heterogeneous("pyg:DBLP:x")
    with pytest.raises(GraphValidationError, match="no class 'NoSuchClass'"):
        HaloDataModule("pyg:NoSuchClass:x", cache_dir=str(tmp_path))
