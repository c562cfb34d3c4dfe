"""The halo exchange (one autograd function over all_to_all_single) and the layer hooks."""

from lightning_halo.exchange.exchanger import HaloExchangeError, HaloExchanger, TrafficMeter
from lightning_halo.exchange.layers import (
    LayerHook,
    UnsupportedLayerError,
    find_message_passing,
    layer_kind,
    register_layer,
    supported_layers,
    unsupported_layers,
)
from lightning_halo.exchange.plan import ExchangePlan, predict_traffic

__all__ = [
    "ExchangePlan",
    "HaloExchangeError",
    "HaloExchanger",
    "LayerHook",
    "TrafficMeter",
    "UnsupportedLayerError",
    "find_message_passing",
    "predict_traffic",
    "layer_kind",
    "register_layer",
    "supported_layers",
    "unsupported_layers",
]
