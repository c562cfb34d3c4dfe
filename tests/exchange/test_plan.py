"""Exchange plans: what every rank sends is exactly what its peers expect, and mismatches are caught."""

from __future__ import annotations

import pytest
import torch

from lightning_halo.exchange import ExchangePlan, check_signatures
from lightning_halo.partition import build_halo_partitions, partition_graph
from tests.support.graphs import awkward_graph


def _plans(world_size: int) -> list[ExchangePlan]:
    data = awkward_graph(world_size)
    parts = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, world_size), world_size)
    return [ExchangePlan.from_partition(p) for p in parts]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_plans_of_a_partitioning_agree(world_size: int) -> None:
    plans = _plans(world_size)
    signatures = [p.signature() for p in plans]
    for rank, plan in enumerate(plans):
        check_signatures(signatures, rank)
        out, into = plan.counts(forward=True)
        assert out == plan.send_counts and into == plan.recv_counts and plan.counts(False) == (into, out)
        assert plan.num_send == int(plan.send_index.numel()) and plan.n_src == plan.n_inner + plan.n_halo
        assert plan.send_counts[rank] == 0 and plan.recv_counts[rank] == 0  # nothing to or from itself
        assert sum(plan.recv_counts) == plan.n_halo
        for q, other in enumerate(plans):
            assert plan.send_counts[q] == other.recv_counts[rank]


def test_a_rank_with_another_partitioning_is_caught() -> None:
    plans, other = _plans(3), _plans(3)
    sigs = [p.signature() for p in plans]
    bad = list(other[1].signature())
    bad[4 + 0] += 1  # rank 1 would send one row more to rank 0
    sigs[1] = tuple(bad)
    with pytest.raises(ValueError, match="disagrees with rank 1"):
        check_signatures(sigs, 0)
    sigs = [p.signature() for p in plans]
    sigs[2] = sigs[1]  # a signature from the wrong rank
    with pytest.raises(ValueError, match="disagrees with rank 2"):
        check_signatures(sigs, 0)


def test_send_index_lists_inner_rows_only() -> None:
    for plan in _plans(4):
        assert bool((plan.send_index < plan.n_inner).all()) and plan.send_index.dtype == torch.long
