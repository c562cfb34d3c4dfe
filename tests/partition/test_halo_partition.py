"""HaloPartition as a PyG Data: derived attributes seen alike by every access form; stage views share tensors."""

from __future__ import annotations

import copy

import pytest
import torch
from torch_geometric.data import Data

from lightning_halo.partition import build_halo_partitions, partition_graph
from lightning_halo.partition.halo_partition import DERIVED_KEYS, HaloPartition
from tests.support.graphs import awkward_graph


@pytest.fixture(scope="module")
def parts() -> list[HaloPartition]:
    data = awkward_graph(2)
    return build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, 2), 2)


def _same(a, b) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


@pytest.mark.parametrize("key", DERIVED_KEYS)
def test_every_access_form_sees_a_derived_attribute(parts, key: str) -> None:
    """`in`, keys(), hasattr, get and [] agree with attribute access, as code that checks before it reads expects."""
    part = parts[1]
    value = getattr(part, key)
    assert key in part, f"'{key}' in batch"
    assert key in part.keys(), f"batch.keys() lists {key}"
    assert hasattr(part, key)
    assert _same(part.get(key), value) and _same(part.get(key, "absent"), value)
    assert _same(part[key], value)
    assert len(part) == len(part.keys())


@pytest.mark.parametrize("key", DERIVED_KEYS)
def test_a_derived_attribute_is_absent_alike_without_its_sources(key: str) -> None:
    """A partition missing the attributes a derived one is computed from has it nowhere (no form says yes)."""
    part = HaloPartition(x=torch.zeros(3, 1))
    assert key not in part and key not in part.keys() and not hasattr(part, key)
    assert part.get(key) is None and part.get(key, 7) == 7
    with pytest.raises(KeyError):
        part[key]


@pytest.mark.parametrize("key", DERIVED_KEYS)
def test_a_derived_attribute_cannot_be_stored_behind_its_property(parts, key: str) -> None:
    """Assigning would store a value that attribute access never returns: refused, naming what owns it."""
    part = copy.copy(parts[0])
    with pytest.raises(AttributeError, match="derived"):
        setattr(part, key, torch.zeros(1))
    with pytest.raises(AttributeError, match="derived"):
        part[key] = torch.zeros(1)
    assert key not in part.to_dict()


def test_stored_form_collation_and_moves_are_unchanged(parts) -> None:
    """Derived keys stay out of what is stored, written, collated and moved; x and halo_x stay one tensor."""
    part = parts[0]
    stored = part.to_dict()
    assert not set(DERIVED_KEYS) & set(stored)
    assert set(part.to_state()) == set(stored)
    assert set(part.keys()) == set(stored) | set(DERIVED_KEYS)
    moved = copy.copy(part).to("cpu", non_blocking=False)
    assert moved.input_rows() is not None, "x and halo_x are still views of one tensor"
    assert torch.equal(moved.n_id, part.n_id)
    copied = part.apply(lambda t: t)
    assert set(copied.to_dict()) == set(stored)
    from torch_geometric.data import Batch

    batch = Batch.from_data_list([Data(**{k: v for k, v in stored.items() if k in ("x", "edge_index", "y")})])
    assert "n_id" not in batch  # a plain Data is untouched


def test_a_stage_view_shares_every_tensor_and_keeps_its_own_attributes(parts) -> None:
    part = parts[0]
    train = part.with_attrs(edge_label=torch.ones(3))
    val = part.with_attrs(edge_label=torch.zeros(2))
    assert train is not part and val is not train
    assert all(train[k] is v for k, v in part.to_dict().items()), "no tensor copied"
    assert train.edge_label.tolist() == [1.0, 1.0, 1.0] and val.edge_label.tolist() == [0.0, 0.0]
    assert "edge_label" not in part
    assert train.shares_structure(part) and val.shares_structure(train)
    assert not part.shares_structure(parts[1])
    other = part.with_attrs(edge_index=part.edge_index.clone())
    assert not other.shares_structure(part), "another edge set is another partition"
