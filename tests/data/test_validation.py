"""Every bad graph input gets a clear error naming the problem (and the fix)."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from lightning_halo.data import GraphValidationError, load_graph, validate_graph
from tests.support.error_cases import GRAPH_CASES, good_graph, in_process_cases


def good(n: int = 6) -> Data:
    return good_graph(n)


CASES = GRAPH_CASES


@pytest.mark.parametrize(("case", "mutate", "match"), CASES, ids=[c[0] for c in CASES])
def test_bad_graph_is_rejected(case: str, mutate, match: str) -> None:
    data = good()
    mutate(data)
    with pytest.raises(GraphValidationError) as info:
        validate_graph(data)
    assert match in str(info.value), str(info.value)


def test_good_graph_passes_and_int32_edges_become_int64() -> None:
    data = good()
    data.edge_index = data.edge_index.int()
    checked = validate_graph(data)
    assert checked.edge_index.dtype == torch.long and torch.equal(checked.edge_index, data.edge_index.long())
    assert data.edge_index.dtype == torch.int32, "the caller's Data is left as it was"
    assert checked.x is data.x, "a shallow copy: the features are not copied"


def test_not_a_data() -> None:
    with pytest.raises(GraphValidationError, match="dict, not a torch_geometric.data.Data"):
        validate_graph({"x": torch.ones(2, 2)})


def test_a_hetero_data_where_a_data_is_read_says_where_it_goes() -> None:
    from tests.support.hetero import generated_hetero

    with pytest.raises(GraphValidationError, match="is a HeteroData, and this reads a homogeneous graph") as err:
        load_graph(generated_hetero())  # type: ignore[arg-type]
    assert "Give a heterogeneous graph to HaloDataModule itself" in str(err.value)


def test_unknown_bundled_name() -> None:
    with pytest.raises(GraphValidationError, match="neither an existing file nor a bundled dataset name.*cora"):
        load_graph("pubmed-offline")


def test_path_that_is_not_a_data(tmp_path) -> None:
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.ones(2)}, path)
    with pytest.raises(GraphValidationError, match="is a dict, not a torch_geometric.data.Data"):
        load_graph(str(path))


def test_path_with_unsafe_pickle_is_never_executed(tmp_path) -> None:
    import pickle

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(GraphValidationError, match="loads safely"):
        load_graph(str(path))
    assert not marker.exists()


def test_path_that_is_garbage(tmp_path) -> None:
    path = tmp_path / "g.pt"
    path.write_bytes(b"not a torch file")
    with pytest.raises(GraphValidationError, match="not a torch.save'd"):
        load_graph(str(path))


def test_saved_data_round_trips(tmp_path) -> None:
    path = tmp_path / "g.pt"
    torch.save(good(), path)
    assert load_graph(str(path)).num_nodes == 6


@pytest.mark.parametrize(("case", "run", "match"), in_process_cases(), ids=[c[0] for c in in_process_cases()])
def test_documented_error_cases(case: str, run, match: str) -> None:
    """Every row of docs/errors.md raises, with the documented message."""
    with pytest.raises(Exception) as info:
        run()
    assert match in str(info.value), str(info.value)
