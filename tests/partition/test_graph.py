"""partition_graph: METIS and random assignments."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_halo.partition import partition_graph, symmetric_csr
from tests.support.graphs import awkward_graph, cora


def test_symmetric_csr_drops_self_loops_and_duplicates() -> None:
    ei = torch.tensor([[0, 0, 1, 1, 2], [1, 1, 0, 1, 0]])  # duplicate 0->1, self-loop 1->1, 2->0
    xadj, adjncy = symmetric_csr(ei, 4)
    assert xadj.tolist() == [0, 2, 3, 4, 4]
    assert adjncy.tolist() == [1, 2, 0, 0]


@pytest.mark.parametrize("partitioner", ["metis", "kaminpar", "auto", "random"])
@pytest.mark.parametrize("num_parts", [1, 2, 3, 4, 7])
def test_every_node_assigned_once_no_empty_part(partitioner: str, num_parts: int) -> None:
    data = awkward_graph(1)
    parts = partition_graph(data.edge_index, data.num_nodes, num_parts, partitioner=partitioner)
    assert parts.shape == (data.num_nodes,) and parts.dtype == torch.long
    assert set(parts.tolist()) == set(range(num_parts))


@pytest.mark.parametrize("partitioner", ["metis", "kaminpar", "auto", "random"])
def test_deterministic_for_a_seed(partitioner: str) -> None:
    data = cora()
    a = partition_graph(data.edge_index, data.num_nodes, 4, partitioner=partitioner, seed=3)
    b = partition_graph(data.edge_index, data.num_nodes, 4, partitioner=partitioner, seed=3)
    assert torch.equal(a, b)


def test_metis_cuts_far_fewer_edges_than_random() -> None:
    data = cora()
    src, dst = data.edge_index

    def cut(parts: torch.Tensor) -> int:
        return int((parts[src] != parts[dst]).sum())

    metis = partition_graph(data.edge_index, data.num_nodes, 4)
    rand = partition_graph(data.edge_index, data.num_nodes, 4, partitioner="random")
    assert cut(metis) * 3 < cut(rand)
    sizes = torch.bincount(metis).float()
    assert sizes.max() / sizes.mean() < 1.1  # balanced


def test_edge_balance_weights_by_in_degree() -> None:
    data = cora()
    parts = partition_graph(data.edge_index, data.num_nodes, 4, balance="edges")
    indeg = torch.bincount(data.edge_index[1], minlength=data.num_nodes) + 1
    load = torch.zeros(4).index_add_(0, parts, indeg.float())
    assert load.max() / load.mean() < 1.1


def test_tiny_graph_never_leaves_a_part_empty() -> None:
    ei = torch.tensor([[0, 1], [1, 0]])
    parts = partition_graph(ei, 3, 3)
    assert sorted(parts.tolist()) == [0, 1, 2]


def test_graph_without_edges() -> None:
    parts = partition_graph(torch.empty(2, 0, dtype=torch.long), 5, 2)
    assert sorted(torch.bincount(parts).tolist()) == [2, 3]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(num_parts=0), "positive"),
        (dict(num_parts=11), "exceeds the number of nodes"),
        (dict(num_parts=2, partitioner="spectral"), "unknown partitioner"),
        (dict(num_parts=2, balance="mass"), "unknown balance"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        partition_graph(torch.tensor([[0], [1]]), 10, **kwargs)


def _reference_csr(edge_index: torch.Tensor, n: int) -> tuple[list[int], list[int]]:
    """The plain definition: sorted unique (row, col) keys of both directions, self-loops dropped."""
    src, dst = edge_index.long()
    keep = src != dst
    key = torch.unique(torch.cat([src[keep] * n + dst[keep], dst[keep] * n + src[keep]]))
    rows = torch.div(key, n, rounding_mode="floor")
    xadj = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(torch.bincount(rows, minlength=n), 0)])
    return xadj.tolist(), (key - rows * n).tolist()


@pytest.mark.parametrize(("n", "e", "chunk"), [(10, 40, 3), (200, 3000, 17), (1000, 20000, 999), (50, 400, 1), (7, 0, 2)])
def test_symmetric_csr_in_windows_equals_the_definition(n: int, e: int, chunk: int) -> None:
    ei = torch.randint(0, n, (2, e), generator=torch.Generator().manual_seed(n + e))
    xadj, adjncy = symmetric_csr(ei, n, chunk_edges=chunk)
    assert (xadj.tolist(), adjncy.tolist()) == _reference_csr(ei, n)
    assert xadj.dtype == adjncy.dtype == np.int64 and adjncy.flags.c_contiguous


def test_partition_graph_reads_a_memory_mapped_edge_list(tmp_path) -> None:
    data = cora()
    np.save(tmp_path / "ei.npy", data.edge_index.int().numpy())  # int32 on disk, as a graph directory may hold
    mapped = torch.from_numpy(np.load(tmp_path / "ei.npy", mmap_mode="c"))
    for balance in ("nodes", "edges"):
        assert torch.equal(partition_graph(mapped, data.num_nodes, 4, balance=balance),
                           partition_graph(data.edge_index, data.num_nodes, 4, balance=balance))  # fmt: skip
