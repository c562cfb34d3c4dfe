"""The zoo's HeteroNodeClassifier: every conv and both starts of a featureless type give the whole-graph result
on partitions (ranks as threads, float64), and ``featureless="type"`` has no parameter per node."""

from __future__ import annotations

import pytest
import torch

from lightning_halo.models import HeteroNodeClassifier
from lightning_halo.models.hetero_classifier import needed_relations
from tests.support.hetero import generated_hetero, hetero_reference, run_threaded_hetero, without_zero_extras
from tests.support.threaded import assert_same


def _model(data, conv: str, featureless: str, norm=None) -> HeteroNodeClassifier:
    torch.manual_seed(0)
    num_features = {t: int(data[t].x.size(1)) if "x" in data[t] else 0 for t in data.node_types}
    num_nodes = {t: int(data[t].num_nodes) for t in data.node_types}
    return HeteroNodeClassifier(3, data.metadata(), num_features, num_nodes, "paper", hidden_channels=8, conv=conv,
                                dropout=0.0, featureless=featureless, norm=norm).double()  # fmt: skip


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


@pytest.mark.parametrize("conv", ["sage", "hgt", "han"])
@pytest.mark.parametrize("norm", ["layer", "batch"])
@pytest.mark.parametrize("world_size, halo_reduction", [(2, "cover"), (3, "none")])
def test_normalised_layers_match_the_whole_graph(conv: str, norm: str, world_size: int, halo_reduction: str) -> None:
    data = generated_hetero()
    model = _model(data, conv, "embedding", norm)
    with torch.no_grad():  # away from LayerNorm's and BatchNorm's initial identity, so their weights take part
        for p in model.norms.parameters():
            p.uniform_(0.5, 1.5)
    ref = hetero_reference(model, data, _forward, "paper")
    got = run_threaded_hetero(model, data, world_size, _forward, "paper", halo_reduction=halo_reduction)
    assert any(k.startswith("norms.") for k in ref["grad"]), "no normalisation took part"
    assert_same(without_zero_extras(got, ref), ref, what=f"{conv}, norm={norm}")
    if norm == "batch":  # running statistics are whole-graph ones too
        for k, b in ref["buffers"].items():
            if k.startswith("norms.") and "running" in k:
                for rank in got["ranks"]:
                    torch.testing.assert_close(rank["buffers"][k], b, rtol=1e-10, atol=1e-12, msg=k)


def test_norms_per_layer_and_type_reach_the_target_only_in_the_last_layer() -> None:
    data = generated_hetero()
    sage, hgt = _model(data, "sage", "embedding", "layer"), _model(data, "hgt", "embedding", "layer")
    assert list(sage.norms[-1]) == list(hgt.norms[-1]) == ["paper"]  # the others would get no gradient
    assert set(hgt.norms[0]) == {e[2] for e in data.edge_types}
    first = needed_relations(data.edge_types, "paper", 2)[0]
    assert set(sage.norms[0]) == {e[2] for e in first} != set(data.node_types)  # what the pruned layer outputs
    assert len(_model(data, "sage", "embedding").norms) == 0  # no norm: no module, the state dict as before
    with pytest.raises(ValueError, match="norm must be None, 'batch' or 'layer'"):
        HeteroNodeClassifier(3, norm="group")  # type: ignore[arg-type]


def test_a_featureless_type_by_type_has_one_learned_row() -> None:
    data = generated_hetero()
    per_node, per_type = _model(data, "hgt", "embedding"), _model(data, "hgt", "type")  # hgt reads every type
    assert per_node.inputs["venue"].weight.shape == (7, 8) and per_type.inputs["venue"].weight.shape == (1, 8)
    assert sum(p.numel() for p in per_node.parameters()) - sum(p.numel() for p in per_type.parameters()) == 6 * 8
    with pytest.raises(ValueError, match="featureless must be 'embedding' or 'type'"):
        HeteroNodeClassifier(3, featureless="random")  # type: ignore[arg-type]


@pytest.mark.parametrize("conv", ["sage", "gat"])
def test_its_relation_sum_is_pygs_heteroconv_sum_without_the_stack(conv: str) -> None:
    """The zoo's layers add each relation's output as it comes (``RelationSum``) instead of stacking them all as
    ``HeteroConv(aggr="sum")`` does: the same modules and state dict, the same result and gradients."""
    from torch_geometric.nn import HeteroConv

    from lightning_halo.models.hetero_classifier import RelationSum

    data = generated_hetero()
    model = _model(data, conv, "embedding")
    layer = model.convs[0]
    assert isinstance(layer, RelationSum) and len({e[2] for e in layer.convs.keys()}) < len(layer.convs)  # noqa: SIM118
    pyg = HeteroConv(dict(layer.convs.items()), aggr="sum")
    assert list(pyg.state_dict()) == list(layer.state_dict())
    x = {t: v.detach().requires_grad_() for t, v in model.embed(data).items()}
    ours, theirs = layer(x, data.edge_index_dict), pyg(x, data.edge_index_dict)
    assert ours.keys() == theirs.keys()
    for t in ours:
        torch.testing.assert_close(ours[t], theirs[t], rtol=1e-12, atol=1e-12)
    sum(v.square().sum() for v in ours.values()).backward()
    mine = {t: v.grad.clone() for t, v in x.items() if v.grad is not None}
    for v in x.values():
        v.grad = None
    sum(v.square().sum() for v in theirs.values()).backward()
    for t, g in mine.items():
        torch.testing.assert_close(g, x[t].grad, rtol=1e-12, atol=1e-12)


def _featureless_graph():
    """Papers (labels, masks) and authors, neither with features: every type starts from learned rows."""
    import torch_geometric.transforms as T
    from torch_geometric.data import HeteroData

    g = torch.Generator().manual_seed(0)
    data = HeteroData()
    data["paper"].num_nodes, data["author"].num_nodes = 120, 80
    data["paper"].y = torch.randint(0, 3, (120,), generator=g)
    order = torch.randperm(120, generator=g)
    for name, rows in (("train_mask", order[:60]), ("val_mask", order[60:90]), ("test_mask", order[90:])):
        data["paper"][name] = torch.zeros(120, dtype=torch.bool).index_fill_(0, rows, True)
    writes = torch.stack([torch.randint(0, 80, (300,), generator=g), torch.randint(0, 120, (300,), generator=g)])
    data["author", "writes", "paper"].edge_index = writes
    data["paper", "cites", "paper"].edge_index = torch.randint(0, 120, (2, 400), generator=g)
    return T.ToUndirected()(data)


@pytest.mark.parametrize("conv", ["sage", "hgt"])
@pytest.mark.parametrize("featureless", ["embedding", "type"])
def test_a_graph_whose_types_have_no_features_at_all(conv: str, featureless: str) -> None:
    from lightning_halo import HaloDataModule

    data = _featureless_graph()
    dm = HaloDataModule(data)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.num_features == {"paper": 0, "author": 0} and dm.labelled_type == "paper"
    torch.manual_seed(0)
    model = HeteroNodeClassifier(dm.num_classes, dm.metadata, dm.num_features, dm.num_nodes, dm.labelled_type,
                                 hidden_channels=8, conv=conv, dropout=0.0, featureless=featureless).double()  # fmt: skip
    ref = hetero_reference(model, data, _forward, "paper")
    got = run_threaded_hetero(model, data, 2, _forward, "paper")
    assert_same(without_zero_extras(got, ref), ref, what=f"no features, {conv}, featureless={featureless}")


@pytest.mark.parametrize("conv", ["sage", "hgt"])
@pytest.mark.parametrize("how", ["replaced", "in place"])
def test_features_changed_in_the_step_are_read_with_their_own_halo(conv: str, how: str) -> None:
    """The input projection reads every local row (``local_features``); once a type's ``x`` is not the partitioned one
    (a new tensor, or changed in place), its stored ``halo_x`` is stale, and the halo of the new rows is fetched."""
    model = _model(generated_hetero(), conv, "embedding")

    def scaled(net, batch):
        if how == "replaced":
            given = batch["author"].x
            batch["author"].x = given * 2 + 1
            try:
                return net(batch)
            finally:
                batch["author"].x = given
        batch["author"].x.mul_(2).add_(1)  # each graph is changed once: one step on its own copy
        return net(batch)

    ref = hetero_reference(model, generated_hetero(), scaled, "paper")
    got = run_threaded_hetero(model, generated_hetero(), 2, scaled, "paper")
    assert_same(without_zero_extras(got, ref), ref, what=f"{conv}, author features {how}")
