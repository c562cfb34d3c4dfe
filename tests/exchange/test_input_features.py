"""Input features of the halo travel with the partition; a changed batch.x is exchanged instead."""

from __future__ import annotations

import pytest
import torch

from lightning_halo import build_halo_partitions, partition_graph
from lightning_halo.exchange import HaloExchanger, predict_traffic
from lightning_halo.partition.halo_partition import tensor_digest
from lightning_halo.testing import ThreadGroup
from tests.support.graphs import awkward_graph
from tests.support.threaded import on_threads


def _parts(num_parts: int = 3):
    data = awkward_graph(num_parts)
    return data, build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, num_parts), num_parts)


def test_partitions_carry_their_halos_input_features() -> None:
    data, parts = _parts()
    for part in parts:
        n_in = int(part.n_inner)
        assert torch.equal(part.halo_x, data.x[part.global_id[n_in:]])
        assert part.halo_x.shape == (int(part.n_halo), data.num_features) and part.halo_x.dtype == data.x.dtype
        assert part.x_digest == tensor_digest(part.x) != tensor_digest(part.x * 2)


def _fetch_on_all_ranks(parts, change=None):
    """Every rank fetches its input features' halo (threads over an in-process transport)."""
    group = ThreadGroup(len(parts))

    def rank(r: int) -> tuple:
        ex = HaloExchanger(group.transport(r), bits=32)
        part = parts[r]
        ex.bind(part)
        if change is not None:
            change(r, part)
        first = ex.fetch(part.x, "conv1")
        return first, ex.fetch(part.x, "conv1"), dict(ex.meter.total)

    return on_threads(len(parts), rank)


def test_unchanged_x_reads_the_stored_halo() -> None:
    _, parts = _parts()
    for part, (first, second, meter) in zip(parts, _fetch_on_all_ranks(parts)):
        assert torch.equal(first, part.halo_x) and first is second  # stored, then cached (not re-hashed)
        assert ("conv1", "input") not in meter


@pytest.mark.parametrize("change", ["replace", "in_place"])
def test_changed_x_on_one_rank_is_exchanged_by_all(change: str) -> None:
    """Rank 0 changes its x: every rank exchanges (one skipping would leave its peers waiting)."""
    data, parts = _parts()

    def modify(r: int, part) -> None:
        if r == 0:
            if change == "replace":
                part.x = part.x * 2  # e.g. normalised in training_step and written back
            else:
                part.x.mul_(2)

    got = _fetch_on_all_ranks(parts, modify)
    x = data.x.clone()
    x[parts[0].inner_global_id] *= 2
    for part, (halo, _, meter) in zip(parts, got):
        assert torch.equal(halo, x[part.global_id[int(part.n_inner):]]), "the owners' current rows"
        assert meter[("conv1", "input")] == int(part.send_counts.sum()) * data.num_features * 8


def test_partition_without_stored_features_is_exchanged() -> None:
    data, parts = _parts()
    for part in parts:
        del part.halo_x  # e.g. built by hand without them
    for part, (halo, _, meter) in zip(parts, _fetch_on_all_ranks(parts)):
        assert torch.equal(halo, data.x[part.global_id[int(part.n_inner):]])
        assert ("conv1", "input") in meter


def test_predicted_input_bytes() -> None:
    kw = dict(halo_rows=10, num_features=5, hidden=8, layers=2, bits=1)
    assert predict_traffic(**kw)["input_once"] == 0
    assert predict_traffic(**kw, input_stored=False)["input_once"] == 10 * 5 * 4
