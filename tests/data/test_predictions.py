"""Predictions in global node order: taking a prediction apart, placing rows, the one-process path."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from lightning_halo import HaloDataModule, build_halo_partitions, partition_graph
from lightning_halo.data.predictions import PredictionError, flatten_prediction, gather_predictions, place_rows
from tests.support.graphs import awkward_graph
from tests.support.trainer import FakeTrainer

Pair = namedtuple("Pair", ["logits", "hidden"])


def _parts(num_parts: int):
    data = awkward_graph(num_parts)
    return data, build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, num_parts), num_parts)


def test_rows_of_every_part_land_on_their_nodes() -> None:
    data, parts = _parts(3)
    full = torch.randn(data.num_nodes, 4)
    ids = [p.inner_global_id for p in parts]
    assert not torch.equal(torch.cat(ids), torch.arange(data.num_nodes)), "rank order is not node order here"
    torch.testing.assert_close(place_rows(ids, [full[i] for i in ids], data.num_nodes), full, rtol=0, atol=0)


@pytest.mark.parametrize("damage, message", [("drop", "node \\d+ has 0 predicted rows"),
                                             ("twice", "node \\d+ has 2 predicted rows"),
                                             ("outside", "outside \\[0, 160\\)")])  # fmt: skip
def test_rows_that_do_not_cover_the_graph_once_are_refused(damage: str, message: str) -> None:
    data, parts = _parts(2)
    ids = [p.inner_global_id.clone() for p in parts]
    if damage == "drop":
        ids[1] = ids[1][1:]
    elif damage == "twice":
        ids[1] = torch.cat([ids[1], ids[0][:1]])
    else:
        ids[1][0] = data.num_nodes
    with pytest.raises(PredictionError, match=message):
        place_rows(ids, [torch.zeros(len(i), 2) for i in ids], data.num_nodes)


def test_structure_survives_and_every_tensor_is_checked() -> None:
    pred = {"pair": Pair(torch.zeros(5, 2), torch.ones(5)), "list": [torch.zeros(5, 1, 3)], "t": (torch.arange(5),)}
    flat = flatten_prediction(pred, rows=5)
    assert [where for where, _, _ in flat.layout] == [
        "prediction['pair'].logits", "prediction['pair'].hidden", "prediction['list'][0]", "prediction['t'][0]",
    ]  # fmt: skip
    rebuilt = flat.rebuild([t + 1 for t in flat.tensors])
    assert isinstance(rebuilt["pair"], Pair) and isinstance(rebuilt["list"], list) and isinstance(rebuilt["t"], tuple)
    assert torch.equal(rebuilt["t"][0], torch.arange(1, 6)) and rebuilt["list"][0].shape == (5, 1, 3)


@pytest.mark.parametrize(
    "pred, message",
    [
        ({"logits": torch.zeros(5, 2), "loss": 0.3}, r"prediction\['loss'\] is a float, not a tensor"),
        ((torch.zeros(5, 2), torch.zeros(3, 2)), r"prediction\[1\] has shape \(3, 2\), but this rank owns 5 nodes"),
        (torch.tensor(1.0), r"prediction has shape \(\), but this rank owns 5 nodes"),
        ({}, "holds no tensor"),
    ],
)
def test_what_cannot_be_gathered_is_named(pred, message: str) -> None:
    with pytest.raises(PredictionError, match=message):
        flatten_prediction(pred, rows=5)


def test_one_process_without_torch_distributed(tmp_path) -> None:
    data, (part,) = _parts(1)
    logits = torch.randn(data.num_nodes, 3)
    out = gather_predictions({"logits": logits[part.inner_global_id]}, part)
    torch.testing.assert_close(out["logits"], logits, rtol=0, atol=0)
    _, parts = _parts(2)
    with pytest.raises(PredictionError, match="rank 0 of 1 was given partition 0 of 2"):
        gather_predictions(logits[parts[0].inner_global_id], parts[0])
    with pytest.raises(ValueError, match="dst=1 is not a rank of this job"):
        gather_predictions(logits, part, dst=1)


def test_data_module_one_liner_and_its_errors(tmp_path) -> None:
    data = awkward_graph(1)
    dm = HaloDataModule(data, cache_dir=str(tmp_path))
    assert dm.num_nodes == data.num_nodes, "known before setup"
    with pytest.raises(RuntimeError, match="call trainer.predict"):
        dm.gather_predictions([torch.zeros(data.num_nodes, 2)])
    dm.trainer = FakeTrainer(1)  # type: ignore[assignment]
    dm.setup("predict")
    logits = torch.randn(data.num_nodes, 2)
    batch_output = logits[dm.partition.inner_global_id]
    for given in ([batch_output], batch_output):  # what trainer.predict returns, or its one entry
        torch.testing.assert_close(dm.gather_predictions(given), logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match="return_predictions=True"):
        dm.gather_predictions(None)
