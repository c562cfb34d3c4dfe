"""Every layer lightning-halo declares supported gives the full-graph result on partitions.

Each supported PyG layer class runs in a two-conv model (with edge attributes where the layer
takes them) on a directed graph with isolated nodes, at world sizes 2 and 3, in real
processes; logits, loss, gradients and parameters after 5 steps must equal plain PyG.
Unsupported and unknown layers must be refused with a reason.
"""

from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import ChebConv, MessagePassing, SAGEConv

import lightning_halo
from lightning_halo.exchange import UnsupportedLayerError, layer_kind, register_layer
from tests.support.parity import assert_parity, run_parity

LAYER_CONFIGS = [f"layer:{name}:awkward" for name in lightning_halo.supported_layers()]


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_supported_layer_matches_full_graph(world_size: int, tmp_path) -> None:
    run_parity(LAYER_CONFIGS, world_size, tmp_path, extra=["--steps", "3"])
    for config in LAYER_CONFIGS:
        assert_parity(config, world_size, tmp_path, steps=3)


def test_unsupported_layer_gets_reason() -> None:
    with pytest.raises(UnsupportedLayerError, match="K hops"):
        layer_kind(ChebConv(4, 4, K=2))


def test_unknown_layer_is_refused_until_registered() -> None:
    class MyConv(MessagePassing):
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

    with pytest.raises(UnsupportedLayerError, match="register_layer"):
        layer_kind(MyConv())
    register_layer(MyConv, "full")
    try:
        assert layer_kind(MyConv()) == "full"
    finally:
        from lightning_halo.exchange import layers

        layers._KINDS.pop(MyConv)


def test_subclass_is_not_silently_accepted() -> None:
    class Sub(SAGEConv):
        pass

    with pytest.raises(UnsupportedLayerError):
        layer_kind(Sub(2, 2))


def test_target_to_source_flow_is_refused() -> None:
    with pytest.raises(UnsupportedLayerError, match="flow"):
        layer_kind(SAGEConv(2, 2, flow="target_to_source"))


def test_register_layer_validates() -> None:
    with pytest.raises(TypeError):
        register_layer(torch.nn.Linear, "full")
    with pytest.raises(ValueError, match="kind"):
        register_layer(SAGEConv, "magic")
