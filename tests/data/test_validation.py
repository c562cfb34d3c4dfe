"""Every bad graph input gets a clear error naming the problem (and the fix)."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from lightning_halo.data import GraphValidationError, load_graph, validate_graph


def good(n: int = 6) -> Data:
    return Data(
        x=torch.randn(n, 3),
        edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]),
        y=torch.zeros(n, dtype=torch.long),
        train_mask=torch.ones(n, dtype=torch.bool),
        val_mask=torch.zeros(n, dtype=torch.bool),
        test_mask=torch.zeros(n, dtype=torch.bool),
    )


def _drop(key: str):
    def f(d: Data) -> None:
        del d[key]

    return f


def _set(key: str, value):
    def f(d: Data) -> None:
        d[key] = value

    return f


#: (case id, mutation, expected message fragment) — also rendered into docs/errors.md.
CASES = [
    ("missing x", _drop("x"), "no node features `x`"),
    ("x not 2-D", _set("x", torch.randn(6)), "`x` must be 2-D"),
    ("x integer", _set("x", torch.ones(6, 2, dtype=torch.long)), "`x` must be floating point"),
    ("x with NaN", _set("x", torch.tensor([[0.0], [float("nan")], [0], [0], [0], [0]])), "NaN or Inf (first at node 1)"),
    ("missing edge_index", _drop("edge_index"), "no `edge_index`"),
    ("edge_index wrong shape", _set("edge_index", torch.tensor([[0, 1, 2]])), "shape [2, num_edges]"),
    ("edge_index transposed", _set("edge_index", torch.tensor([[0, 1], [1, 2], [2, 3]])), "looks transposed"),
    ("edge_index float", _set("edge_index", torch.tensor([[0.0, 1.0], [1.0, 2.0]])), "must be an integer tensor"),
    ("edge_index out of range", _set("edge_index", torch.tensor([[0, 6], [1, 2]])), "refers to node 6, outside [0, 6)"),
    ("edge_index negative", _set("edge_index", torch.tensor([[0, -1], [1, 2]])), "refers to node -1"),
    ("missing y", _drop("y"), "no labels `y`"),
    ("y wrong length", _set("y", torch.zeros(5, dtype=torch.long)), "`y` has 5 rows but there are 6 nodes"),
    ("missing train_mask", _drop("train_mask"), "no `train_mask`"),
    ("missing val_mask", _drop("val_mask"), "no `val_mask`"),
    ("missing test_mask", _drop("test_mask"), "no `test_mask`"),
    ("mask not bool", _set("train_mask", torch.tensor([0, 1, 2])), "must be a bool mask"),
    ("mask length mismatch", _set("val_mask", torch.zeros(5, dtype=torch.bool)), "`val_mask` has shape (5,) but must be [6]"),
    ("mask with several splits", _set("test_mask", torch.zeros(6, 10, dtype=torch.bool)), "pick one"),
    ("no nodes", lambda d: d.update({"x": torch.zeros(0, 3)}), "has no nodes"),
    ("num_nodes disagrees with x", _set("num_nodes", 9), "data.num_nodes=9 but x has 6 rows"),
]


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
    assert validate_graph(data).edge_index.dtype == torch.long


def test_not_a_data() -> None:
    with pytest.raises(GraphValidationError, match="dict, not a torch_geometric.data.Data"):
        validate_graph({"x": torch.ones(2, 2)})


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
