"""HaloExchanger's binding: a stage's view keeps what was built, another partition drops it, release lets go."""

from __future__ import annotations

import pytest
import torch

from lightning_halo.exchange import HaloExchanger
from lightning_halo.partition import build_halo_partitions, partition_graph
from tests.support.graphs import awkward_graph


@pytest.fixture(scope="module")
def parts():
    data = awkward_graph(2)
    return [build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, 2, partitioner=m), 2)
            for m in ("metis", "random")]  # fmt: skip


def test_a_view_of_the_bound_partition_keeps_what_was_built(parts) -> None:
    part = parts[0][0]
    ex = HaloExchanger(None, bits=32)
    assert ex.bind(part) is True
    plan, built = ex.plan(), ex.partition_value("directory", lambda: object())
    view = part.with_attrs(edge_label=torch.ones(4))
    assert ex.bind(view) is False, "the same partition: nothing to rebuild or check again"
    assert ex.part is view, "the step's batch is the bound object (its own attributes)"
    assert ex.plan() is plan and ex.partition_value("directory", lambda: object()) is built
    assert ex.holds_input(view.x)


def test_another_partition_or_release_drops_what_was_built(parts) -> None:
    ex = HaloExchanger(None, bits=32)
    ex.bind(parts[0][0])
    built = ex.partition_value("directory", lambda: object())
    assert ex.bind(parts[1][0]) is True
    assert ex.partition_value("directory", lambda: object()) is not built, "built again for the new partition"
    shapes = ex.state.state_dict()["plans"]
    ex.release()
    assert not ex.bound and ex.part is None and not ex.holds_input(parts[1][0].x)
    assert ex.state.state_dict()["plans"] == shapes, "a checkpoint written after the run still records the plan"
    with pytest.raises(RuntimeError, match="needs a bound partition"):
        ex.partition_value("directory", lambda: object())
    assert ex.bind(parts[1][0]) is True, "after release every partition is new"
