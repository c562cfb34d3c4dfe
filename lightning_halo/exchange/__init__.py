"""The halo exchange: one autograd function over the wire, its per-slot state, plans and meter."""

from lightning_halo.exchange.exchanger import HaloExchanger
from lightning_halo.exchange.meter import TrafficMeter
from lightning_halo.exchange.plan import ExchangePlan, check_signatures, predict_traffic
from lightning_halo.exchange.slots import STEP_MODES, StepMode, check_smoothing
from lightning_halo.exchange.wire import DistTransport, HaloExchangeError, ThreadGroup, Transport

__all__ = [
    "STEP_MODES",
    "DistTransport",
    "ExchangePlan",
    "HaloExchangeError",
    "HaloExchanger",
    "StepMode",
    "ThreadGroup",
    "TrafficMeter",
    "Transport",
    "check_signatures",
    "check_smoothing",
    "predict_traffic",
]
