"""Input features of the halo travel with the partition; a changed batch.x is exchanged instead."""

from __future__ import annotations

import pytest
import torch

from lightning_halo import build_halo_partitions, partition_graph
from lightning_halo.exchange import predict_traffic
from lightning_halo.exchange.exchanger import HaloExchanger
from lightning_halo.partition.halo_partition import tensor_digest
from tests.support.graphs import awkward_graph


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


class _Wire:
    """Stands in for the collective: records what would have been exchanged."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, rows: torch.Tensor, bits: int, layer: str, direction: str, *, forward: bool) -> torch.Tensor:
        self.calls.append(direction)
        return torch.full((rows.size(0), rows.size(1)), 7.0, dtype=rows.dtype)


def _exchanger(part, monkeypatch) -> tuple[HaloExchanger, _Wire]:
    ex = HaloExchanger(None, bits=32)  # group None: _all_agree is the local decision
    wire = _Wire()
    monkeypatch.setattr(ex, "_exchange_sync", wire)
    ex.bind(part)
    return ex, wire


def test_unchanged_x_reads_the_stored_halo(monkeypatch) -> None:
    _, parts = _parts()
    part = max(parts, key=lambda p: int(p.n_halo))
    ex, wire = _exchanger(part, monkeypatch)
    assert torch.equal(ex.fetch(part.x, "conv1"), part.halo_x) and wire.calls == []
    assert ex.fetch(part.x, "conv1") is ex.fetch(part.x, "conv1")  # cached, not re-hashed


@pytest.mark.parametrize("change", ["replace", "in_place"])
def test_changed_x_is_exchanged(change: str, monkeypatch) -> None:
    _, parts = _parts()
    part = max(parts, key=lambda p: int(p.n_halo))
    ex, wire = _exchanger(part, monkeypatch)
    if change == "replace":
        part.x = part.x * 2  # e.g. normalised in training_step and written back
    else:
        part.x.mul_(2)
    halo = ex.fetch(part.x, "conv1")
    assert wire.calls == ["input"] and bool((halo == 7.0).all()), "the owners' current rows, not the stale halo_x"


def test_partition_without_stored_features_is_exchanged(monkeypatch) -> None:
    _, parts = _parts()
    part = max(parts, key=lambda p: int(p.n_halo))
    del part.halo_x  # e.g. built by hand without them
    ex, wire = _exchanger(part, monkeypatch)
    ex.fetch(part.x, "conv1")
    assert wire.calls == ["input"]


def test_predicted_input_bytes() -> None:
    kw = dict(halo_rows=10, num_features=5, hidden=8, layers=2, bits=1)
    assert predict_traffic(**kw)["input_once"] == 0
    assert predict_traffic(**kw, input_stored=False)["input_once"] == 10 * 5 * 4
