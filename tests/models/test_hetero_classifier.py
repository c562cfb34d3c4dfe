"""The zoo's HeteroNodeClassifier: every conv and both starts of a featureless type give the whole-graph result
on partitions (ranks as threads, float64), and ``featureless="type"`` has no parameter per node."""

from __future__ import annotations

import pytest
import torch

from lightning_halo.models import HeteroNodeClassifier
from tests.support.hetero import generated_hetero, hetero_reference, run_threaded_hetero, without_zero_extras
from tests.support.threaded import assert_same


def _model(data, conv: str, featureless: str) -> HeteroNodeClassifier:
    torch.manual_seed(0)
    num_features = {t: int(data[t].x.size(1)) if "x" in data[t] else 0 for t in data.node_types}
    num_nodes = {t: int(data[t].num_nodes) for t in data.node_types}
    return HeteroNodeClassifier(3, data.metadata(), num_features, num_nodes, "paper", hidden_channels=8, conv=conv,
                                dropout=0.0, featureless=featureless).double()  # fmt: skip


def _forward(model, batch):
    return model(batch)


@pytest.mark.parametrize("conv", ["sage", "gat", "hgt", "han"])
@pytest.mark.parametrize("featureless", ["embedding", "type"])
def test_every_conv_matches_the_whole_graph(conv: str, featureless: str) -> None:
    data = generated_hetero()
    model = _model(data, conv, featureless)
    ref = hetero_reference(model, data, _forward, "paper")
    got = run_threaded_hetero(model, data, 3, _forward, "paper")
    assert_same(without_zero_extras(got, ref), ref, what=f"{conv}, featureless={featureless}")


def test_a_featureless_type_by_type_has_one_learned_row() -> None:
    data = generated_hetero()
    per_node, per_type = _model(data, "hgt", "embedding"), _model(data, "hgt", "type")  # hgt reads every type
    assert per_node.inputs["venue"].weight.shape == (7, 8) and per_type.inputs["venue"].weight.shape == (1, 8)
    assert sum(p.numel() for p in per_node.parameters()) - sum(p.numel() for p in per_type.parameters()) == 6 * 8
    with pytest.raises(ValueError, match="featureless must be 'embedding' or 'type'"):
        HeteroNodeClassifier(3, featureless="random")  # type: ignore[arg-type]
