"""The registry: every PyG conv layer has a status, declarations match what the layers really do."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch_geometric.nn.conv as pyg_conv
from torch_geometric.nn import ChebConv, EGConv, MessagePassing, SAGEConv

import lightning_halo
from lightning_halo import UnsupportedLayerError, register_layer
from lightning_halo.layers import registry
from lightning_halo.layers.registry import layer_kind, layer_spec
from tests.support.graphs import awkward_graph
from tests.support.models import HOMOGENEOUS_LAYERS, LAYER_VARIANTS, _layer_factory, in_degree_histogram


def test_every_pyg_conv_layer_has_a_status() -> None:
    supported = set(lightning_halo.supported_layers())
    refused = set(lightning_halo.unsupported_layers())
    wrappers = set(lightning_halo.wrapper_layers())
    assert not (supported & refused) and not (supported & wrappers) and not (refused & wrappers)
    names = {n for n in pyg_conv.__all__ if n != "MessagePassing"}
    missing = names - supported - refused - wrappers
    assert not missing, f"PyG conv layers without a status in lightning_halo.layers.registry: {sorted(missing)}"


@pytest.mark.parametrize("name", [*HOMOGENEOUS_LAYERS, *LAYER_VARIANTS])
def test_declared_propagations_match_a_plain_run(name: str) -> None:
    """Single-step kinds declare how often forward propagates; 'steps' layers really propagate more than once."""
    data = awkward_graph(1)
    conv, style = _layer_factory(name, data.num_features, in_degree_histogram(data.edge_index, data.num_nodes))
    conv = conv.double()
    calls = []
    conv.register_propagate_forward_pre_hook(lambda m, inputs: calls.append(1))
    x = data.x
    args = {"attr": (data.edge_index, data.edge_attr), "x0": (x, data.edge_index), "type": (data.edge_index, data.edge_type)}
    conv(x, *args.get(style, (data.edge_index,)))
    spec = layer_spec(conv)
    if spec.kind == "steps":
        assert len(calls) >= 1 and spec.max_propagations(conv) is None
    else:
        assert len(calls) == spec.max_propagations(conv), (name, len(calls))


def test_refused_layer_gets_reason() -> None:
    with pytest.raises(UnsupportedLayerError, match="source degrees"):
        layer_kind(EGConv(4, 4, num_heads=1, num_bases=1))
    assert layer_kind(ChebConv(4, 4, K=2)) == "steps"


def test_unknown_layer_is_refused_until_registered() -> None:
    class MyConv(MessagePassing):
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

    with pytest.raises(UnsupportedLayerError, match="register_layer"):
        layer_kind(MyConv())
    register_layer(MyConv, "steps")
    try:
        assert layer_kind(MyConv()) == "steps"
    finally:
        registry._REG.specs.pop(MyConv)


def test_subclass_is_not_silently_accepted() -> None:
    class Sub(SAGEConv):
        pass

    with pytest.raises(UnsupportedLayerError):
        layer_kind(Sub(2, 2))


def test_register_layer_validates() -> None:
    with pytest.raises(TypeError):
        register_layer(torch.nn.Linear, "full")
    with pytest.raises(ValueError, match="kind"):
        register_layer(SAGEConv, "magic")
    with pytest.raises(ValueError, match="propagations"):
        register_layer(SAGEConv, "full", propagations=0)


def test_public_names_are_documented_kinds() -> None:
    assert set(lightning_halo.supported_layers().values()) == set(registry.KINDS)
    doc = inspect.getdoc(lightning_halo.register_layer)
    assert all(f'"{kind}"' in doc for kind in registry.KINDS)


def test_refusals_name_an_exact_alternative_where_one_exists() -> None:
    """GPSConv's global attention, the k-NN and CUDA-only layers say what to use instead."""
    import pytest
    from torch import nn
    from torch_geometric.nn import GINEConv, GPSConv

    from lightning_halo.layers.hooks import check_model
    from lightning_halo.layers.registry import UnsupportedLayerError, unsupported_layers

    reasons = unsupported_layers()
    for name, alternative in [("GPSConv", "GINEConv"), ("DynamicEdgeConv", "KNNGraph"), ("SuperGATConv", "GATConv"), ("EGConv", "GCNConv"),
                              ("CuGraphSAGEConv", "SAGEConv")]:  # fmt: skip
        assert alternative in reasons[name], (name, reasons[name])
    gps = nn.Sequential(GPSConv(8, GINEConv(nn.Linear(8, 8)), heads=2))
    with pytest.raises(UnsupportedLayerError, match="its local part alone is exact"):
        check_model(gps)


def test_to_hetero_with_bases_is_refused_by_name_with_to_hetero_as_the_alternative() -> None:
    import pytest
    from torch import nn
    from torch_geometric.nn import SAGEConv, to_hetero_with_bases

    from lightning_halo.layers.hooks import check_model
    from lightning_halo.layers.registry import UnsupportedLayerError

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = SAGEConv((16, 16), 8)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    metadata = (["paper", "author"], [("author", "writes", "paper"), ("paper", "rev_writes", "author")])
    model = to_hetero_with_bases(Net(), metadata, num_bases=2, in_channels={"x": 16})
    with pytest.raises(UnsupportedLayerError, match=r"'conv' \(HeteroBasisConv\).*to_hetero_with_bases flattens.*to_hetero\(model, metadata\)"):
        check_model(model)


def test_every_pyg_norm_is_classified() -> None:
    """A norm PyG adds later must be looked at: graph-wide (made global or refused), batch (made global) or per
    node (exact)."""
    import torch_geometric.nn.norm as pyg_norm

    from lightning_halo.layers.registry import GLOBAL_GRAPH_NORMS, graph_norms

    exact = {"BatchNorm": "made global by layers/batchnorm.py", "MessageNorm": "per node",
             "HeteroLayerNorm": "mode='node' only", "DiffGroupNorm": "its statistics are a BatchNorm1d's, made global"}  # fmt: skip
    assert set(pyg_norm.__all__) - set(graph_norms()) - set(exact) == set()
    assert set(graph_norms()) <= set(pyg_norm.__all__), "the registry names a class PyG does not have"
    assert set(GLOBAL_GRAPH_NORMS) <= set(graph_norms())


def test_graph_norm_refusals_name_the_instance_and_only_pygs_classes_not_made_global() -> None:
    import torch
    import torch_geometric.nn.norm as pyg_norm

    from lightning_halo.layers.registry import graph_norm_refusal

    assert "HeteroBatchNorm): its per-type" in graph_norm_refusal("net.norm", pyg_norm.HeteroBatchNorm(4, num_types=2))
    for made_global in (pyg_norm.PairNorm(), pyg_norm.GraphNorm(4), pyg_norm.LayerNorm(4), pyg_norm.InstanceNorm(4),
                        pyg_norm.MeanSubtractionNorm(), pyg_norm.GraphSizeNorm(), pyg_norm.LayerNorm(4, mode="node")):  # fmt: skip
        assert graph_norm_refusal("n", made_global) is None, made_global
    assert graph_norm_refusal("n", pyg_norm.MessageNorm()) is None
    assert graph_norm_refusal("n", type("HeteroBatchNorm", (torch.nn.Module,), {})()) is None, "a user's own class"


def test_reasons_keep_their_words() -> None:
    """The enums replaced strings; what the layer report and the errors print is unchanged."""
    from lightning_halo.layers.call import AggregationChoice
    from lightning_halo.layers.reasons import EdgeIndexReason, ReductionReason
    from lightning_halo.layers.reduction import ReductionChoice

    assert AggregationChoice(None, EdgeIndexReason.WEIGHTED_MIN_MAX, "max").why == "max aggregation with edge weights"
    assert ReductionChoice(False, ReductionReason.NOT_LINEAR, "max").why == "max aggregation is not linear"
    assert ReductionChoice(True).why == "" and AggregationChoice("sum").why == ""
