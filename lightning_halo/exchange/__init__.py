"""The halo exchange: the differentiable fetch with its slots, the exact collectives, the checkpointed state."""

from lightning_halo.exchange.collectives import Collectives
from lightning_halo.exchange.exchanger import HaloExchanger
from lightning_halo.exchange.meter import Traffic, TrafficMeter
from lightning_halo.exchange.plan import DIRECTIONS, Direction, ExchangePlan, check_signatures, predict_traffic
from lightning_halo.exchange.policy import MODES, SYNC, HaloPolicy, Mode, check_mode, check_smoothing
from lightning_halo.exchange.state import ExchangeState
from lightning_halo.exchange.wire import DistTransport, HaloExchangeError, Transport

__all__ = [
    "DIRECTIONS",
    "MODES",
    "SYNC",
    "Collectives",
    "Direction",
    "DistTransport",
    "ExchangePlan",
    "ExchangeState",
    "HaloExchangeError",
    "HaloExchanger",
    "HaloPolicy",
    "Mode",
    "Traffic",
    "TrafficMeter",
    "Transport",
    "check_mode",
    "check_signatures",
    "check_smoothing",
    "predict_traffic",
]
