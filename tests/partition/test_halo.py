"""build_halo_partitions: halos follow in-edges, plans agree between peers, attributes sliced."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from lightning_halo.partition import build_halo_partitions, partition_graph, partition_stats
from lightning_halo.partition.halo import format_stats, plan_halos
from tests.support.graphs import awkward_graph, cora


def _brute_force_halo(data: Data, parts: torch.Tensor, p: int) -> set[int]:
    src, dst = data.edge_index
    return {int(s) for s, t in zip(src, dst) if parts[t] == p and parts[s] != p}


@pytest.mark.parametrize("num_parts", [1, 2, 3, 4])
@pytest.mark.parametrize("graph", ["awkward", "cora"])
def test_partitions_reconstruct_the_graph(graph: str, num_parts: int) -> None:
    data = awkward_graph(num_parts) if graph == "awkward" else cora()
    parts = partition_graph(data.edge_index, data.num_nodes, num_parts)
    result = build_halo_partitions(data, parts, num_parts)
    assert len(result) == num_parts
    edges = []
    owned = []
    for p, part in enumerate(result):
        n_in = int(part.n_inner)
        assert part.x.size(0) == n_in == part.num_nodes == part.y.size(0) == part.train_mask.size(0)
        assert (part.edge_index[1] < n_in).all(), "targets must be inner nodes"
        assert (part.edge_index[0] < n_in + int(part.n_halo)).all()
        gid = part.global_id
        inner = gid[:n_in]
        assert torch.equal(inner, torch.sort(inner).values), "inner nodes sorted by global id"
        assert (parts[inner] == p).all()
        halo = gid[n_in:]
        assert set(halo.tolist()) == _brute_force_halo(data, parts, p), "halo = remote sources of in-edges"
        owners = parts[halo]
        assert torch.equal(owners, torch.sort(owners, stable=True).values), "halo grouped by owner"
        assert torch.equal(part.recv_counts, torch.bincount(owners, minlength=num_parts))
        torch.testing.assert_close(part.x, data.x[inner])
        assert torch.equal(part.train_mask, data.train_mask[inner])
        edges.append(torch.stack([gid[part.edge_index[0]], gid[part.edge_index[1]]]))
        owned.append(inner)
        if "edge_attr" in data:  # edge attributes travel with their edges
            glob: dict[tuple, list] = {}
            for (s, t), row in zip(data.edge_index.t().tolist(), data.edge_attr.tolist()):
                glob.setdefault((s, t), []).append(row)
            for (s, t), row in zip(edges[-1].t().tolist(), part.edge_attr.tolist()):
                assert row in glob[(s, t)]
    assert sorted(torch.cat(owned).tolist()) == list(range(data.num_nodes))
    got = torch.cat(edges, dim=1)
    key = lambda e: torch.sort(e[0] * data.num_nodes + e[1]).values  # noqa: E731
    assert torch.equal(key(got), key(data.edge_index)), "every edge exactly once, duplicates kept"


@pytest.mark.parametrize("num_parts", [2, 3, 4])
def test_plans_agree_between_peers(num_parts: int) -> None:
    data = awkward_graph(num_parts)
    result = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, num_parts), num_parts)
    for q in result:
        offset = int(q.n_inner)
        for owner, count in enumerate(q.recv_counts.tolist()):
            sender = result[owner]
            start = int(sender.send_counts[: q.part_id].sum())
            rows = sender.send_index[start : start + int(sender.send_counts[q.part_id])]
            assert torch.equal(sender.global_id[rows], q.global_id[offset : offset + count])
            offset += count
        assert int(q.send_counts[q.part_id]) == 0 and int(q.recv_counts[q.part_id]) == 0


def test_directed_edges_create_one_sided_halo() -> None:
    # 0 -> 2 only: part 1 (node 2) needs node 0; part 0 needs nothing.
    data = Data(x=torch.randn(4, 1), edge_index=torch.tensor([[0, 1, 2], [2, 0, 3]]), y=torch.zeros(4, dtype=torch.long))
    data.train_mask = data.val_mask = data.test_mask = torch.ones(4, dtype=torch.bool)
    p0, p1 = build_halo_partitions(data, torch.tensor([0, 0, 1, 1]))
    assert int(p0.n_halo) == 0 and int(p1.n_halo) == 1
    assert p0.send_index.tolist() == [0] and p0.send_counts.tolist() == [0, 1]


def test_stats() -> None:
    data = cora()
    parts = partition_graph(data.edge_index, data.num_nodes, 2)
    stats = partition_stats(build_halo_partitions(data, parts, 2))
    src, dst = data.edge_index
    assert stats["edge_cut"] == int((parts[src] != parts[dst]).sum())
    assert sum(stats["nodes"]) == data.num_nodes and sum(stats["edges"]) == data.num_edges
    assert stats["halo_rows"] == sum(stats["halo_nodes"]) == sum(stats["send_rows"])
    assert 1.0 <= stats["balance"] < 1.1


def test_indices_are_int64_end_to_end() -> None:
    data = awkward_graph(2)
    data.edge_index = data.edge_index.int()  # int32 input must not survive into the partitions
    from lightning_halo.data import validate_graph

    given = data.edge_index
    data = validate_graph(data)
    assert given.dtype == torch.int32, "the caller's graph is not modified"
    for part in build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, 2), 2):
        for key in ("edge_index", "send_index", "send_counts", "recv_counts", "global_id"):
            assert part[key].dtype == torch.int64, key


def test_generated_graph_has_the_awkward_cases() -> None:
    """The parity tests rely on these properties of the generated graph."""
    data = awkward_graph(2)
    src, dst = data.edge_index
    assert bool((src == dst).any()), "self-loops"
    key = src * data.num_nodes + dst
    assert key.unique().numel() < key.numel(), "duplicate edges"
    assert not bool(((dst * data.num_nodes + src)[:, None] == key[None, :]).any(1).all()), "directed"
    touched = torch.zeros(data.num_nodes, dtype=torch.bool)
    touched[src] = touched[dst] = True
    assert not bool(touched.all()), "isolated nodes"


@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_plan_is_the_same_whatever_the_window(chunk: int) -> None:
    data = awkward_graph(3)
    parts = partition_graph(data.edge_index, data.num_nodes, 3)
    whole, windowed = plan_halos(data.edge_index, parts, 3), plan_halos(data.edge_index, parts, 3, chunk_edges=chunk)
    for p in range(3):
        assert torch.equal(whole.halos[p], windowed.halos[p])
        assert torch.equal(whole.send_index(p), windowed.send_index(p))
    assert whole.edge_counts == windowed.edge_counts == torch.bincount(parts[data.edge_index[1]], minlength=3).tolist()


def test_format_stats_lists_every_part() -> None:
    data = cora()
    stats = partition_stats(build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, 3), 3))
    lines = format_stats(stats, "metis, 3 parts")
    assert lines[0].startswith(
        f"metis, 3 parts: edge cut {stats['edge_cut']}, halo rows {stats['halo_rows']} ({stats['halo_rows_cover']} with partial sums)"
    )
    assert [line.split() for line in lines[2:]] == [
        [str(p), str(stats["nodes"][p]), str(stats["edges"][p]), str(stats["halo_nodes"][p]), str(stats["send_rows"][p]),
         str(stats["cover_rows"][p])]
        for p in range(3)
    ]  # fmt: skip
    assert stats["halo_rows_cover"] == sum(stats["cover_rows"]) < stats["halo_rows"]
    # a directory written before partial sums has no cover figures: the table leaves the column out
    old = {k: v for k, v in stats.items() if k not in ("cover_rows", "halo_rows_cover")}
    assert "partial sums" not in format_stats(old, "metis, 3 parts")[0] and "cover" not in format_stats(old, "t")[1]


@pytest.mark.parametrize("num_parts", [1, 2, 3])
def test_n_id_names_the_rows_of_x_as_neighbor_loader_does(num_parts: int, tmp_path) -> None:
    """batch.n_id: the global id of every row of batch.x (NeighborLoader's meaning), so emb(batch.n_id) is each
    node's own row; derived from global_id, in memory and loaded from a partition directory alike."""
    from lightning_halo.data.partition_dir import PartitionDirectory, write_partition_dir

    data = awkward_graph(num_parts)
    parts = partition_graph(data.edge_index, data.num_nodes, num_parts)
    write_partition_dir(data, tmp_path, num_parts, graph={}, key="k")
    stored = PartitionDirectory(tmp_path)
    for p, part in enumerate(build_halo_partitions(data, parts, num_parts)):
        for batch in (part, stored.load_part(p)):
            assert "n_id" not in batch.to_dict(), "derived, not stored: global_id owns the ids"
            assert "n_id" in batch and torch.equal(batch["n_id"], batch.n_id), "but seen like a stored attribute"
            assert batch.n_id.dtype == torch.long and batch.n_id.size(0) == batch.x.size(0)
            assert torch.equal(batch.n_id, batch.global_id[: int(batch.n_inner)])
            assert (parts[batch.n_id] == p).all()
            torch.testing.assert_close(batch.x, data.x[batch.n_id])
            if num_parts == 1:
                assert torch.equal(batch.n_id, torch.arange(data.num_nodes))
            else:  # a positional lookup reads other nodes' rows on a partition
                assert not torch.equal(batch.n_id, torch.arange(batch.x.size(0)))
