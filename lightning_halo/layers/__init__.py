"""Running PyG layers on partitions: the layer registry, the edge guard, exact normalisation, the fused kernel, the hooks."""

from lightning_halo.layers.edges import UnsupportedEdgesError
from lightning_halo.layers.registry import (
    UnsupportedLayerError,
    layer_kind,
    register_aggregation,
    register_layer,
    supported_layers,
    unsupported_layers,
    wrapper_layers,
)

__all__ = [
    "UnsupportedEdgesError",
    "UnsupportedLayerError",
    "layer_kind",
    "register_aggregation",
    "register_layer",
    "supported_layers",
    "unsupported_layers",
    "wrapper_layers",
]
