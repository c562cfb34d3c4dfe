"""The CSR adjacency a partition stores: its definition, the blocked builder, and what layers get from it."""

from __future__ import annotations

import pytest
import torch

from lightning_halo.partition import build_halo_partitions, partition_graph, sparse_adjacency
from lightning_halo.partition.chunks import iter_edges
from lightning_halo.partition.csr import CSR_KEYS, csr_from_windows, index_dtype, partition_csr, sizes
from tests.support.graphs import awkward_graph


def _random_edges(n_inner: int, n_src: int, num_edges: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, n_src, (num_edges,), generator=g), torch.randint(0, n_inner, (num_edges,), generator=g)])


def _dense(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    row = torch.repeat_interleave(torch.arange(crow.numel() - 1), (crow[1:] - crow[:-1]).long())
    return torch.zeros(shape, dtype=values.dtype).index_put_((row, col.long()), values, accumulate=True)


@pytest.mark.parametrize(("n_inner", "n_src", "num_edges"), [(30, 50, 400), (6, 6, 0), (1, 9, 20), (200, 600, 3000)])
def test_the_stored_arrays_mean_what_they_say(n_inner: int, n_src: int, num_edges: int) -> None:
    ei = _random_edges(n_inner, n_src, num_edges, n_src)
    csr = partition_csr(ei, n_inner, n_src)
    assert list(csr) == list(CSR_KEYS)
    assert {k: v.numel() for k, v in csr.items()} == sizes(n_inner, n_src, csr["adj_col"].numel(), num_edges)
    assert len({v.dtype for v in csr.values()}) == 1
    src, dst = ei
    # counts per entry from the edge slots: the dense adjacency with repeats, plus a 0 on every inner diagonal
    counts = torch.bincount(csr["adj_edge_slot"].long(), minlength=csr["adj_col"].numel()).double()
    dense = torch.zeros(n_inner, n_src, dtype=torch.float64).index_put_((dst, src), torch.ones(num_edges, dtype=torch.float64), accumulate=True)
    assert torch.equal(_dense(csr["adj_crow"], csr["adj_col"], counts, (n_inner, n_src)), dense)
    pattern = _dense(csr["adj_crow"], csr["adj_col"], torch.ones_like(counts), (n_inner, n_src))
    expect = (dense > 0).double()
    expect[torch.arange(n_inner), torch.arange(n_inner)] = 1.0
    assert torch.equal(pattern, expect), "every distinct edge once, and every inner diagonal"
    assert torch.equal(csr["adj_col"][csr["adj_diag_slot"].long()].long(), torch.arange(n_inner))
    row = torch.repeat_interleave(torch.arange(n_inner), (csr["adj_crow"][1:] - csr["adj_crow"][:-1]).long())
    key = row * n_src + csr["adj_col"].long()
    assert bool((key[1:] > key[:-1]).all()), "rows sorted by source"
    # the transpose, with values permuted by t_perm
    values = torch.rand(counts.numel(), dtype=torch.float64)
    t = _dense(csr["adj_t_crow"], csr["adj_t_col"], values[csr["adj_t_perm"].long()], (n_src, n_inner))
    assert torch.equal(t, _dense(csr["adj_crow"], csr["adj_col"], values, (n_inner, n_src)).t())


@pytest.mark.parametrize(("block", "window"), [(1, 3), (7, 1000), (50, 11), (10**9, 10**9)])
def test_blocked_builder_equals_the_in_memory_one(block: int, window: int) -> None:
    ei = _random_edges(60, 140, 900, 5)
    expect = partition_csr(ei, 60, 140)
    got = csr_from_windows(lambda: iter_edges(ei, window), 60, 140, 900, max_entries=block)
    for key in CSR_KEYS:
        assert got[key].dtype == expect[key].dtype and torch.equal(got[key], expect[key]), key


def test_ids_switch_to_int64_only_when_they_must() -> None:
    assert index_dtype(2**31 - 2, 5, 5) == torch.int32
    assert index_dtype(10, 5, 2**31) == torch.int64
    assert partition_csr(_random_edges(4, 6, 10, 0), 4, 6)["adj_col"].dtype == torch.int32


@pytest.mark.parametrize("world_size", [1, 3])
def test_partitions_carry_the_csr_of_their_edges(world_size: int) -> None:
    data = awkward_graph(world_size)
    for part in build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, world_size), world_size):
        n_in, n_src = int(part.n_inner), part.num_local_nodes
        expect = partition_csr(part.edge_index, n_in, n_src)
        assert all(torch.equal(part[k], expect[k]) for k in CSR_KEYS)
        # the counts reproduce lightning_halo.sparse_adjacency's "sum" values on the stored pattern
        counts = torch.bincount(part.adj_edge_slot.long(), minlength=part.adj_col.numel()).double()
        plain = sparse_adjacency(part, "sum", torch.float64).to_dense()
        assert torch.equal(_dense(part.adj_crow, part.adj_col, counts, (n_in, n_src)), plain)


def test_x_and_halo_x_are_one_tensor() -> None:
    data = awkward_graph(2)
    part = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, 2), 2)[1]
    rows = part.input_rows()
    assert rows is not None and torch.equal(rows, torch.cat([part.x, part.halo_x]))
    assert rows.data_ptr() == part.x.data_ptr()
    moved = part.clone().to("cpu")
    assert moved.input_rows() is not None
    part.x = part.x.clone()  # replaced by the user: no longer one tensor
    assert part.input_rows() is None
