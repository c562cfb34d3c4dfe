"""Every option is checked once, by the one checker of that option, in its owner's constructor.

For each public option the table names its checker. Building the owner with a good value calls
that checker exactly once for the option; with a bad value, the error the user gets is the one
that checker raised (no second, hand-written check anywhere on the way).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch
from torch_geometric.nn import MessagePassing

from lightning_halo import HaloDataModule, HaloQuantStrategy, HaloSchedule, register_layer
from lightning_halo.exchange.policy import check_count, check_drift, check_mode, check_smoothing, check_wait
from lightning_halo.layers import registry
from lightning_halo.layers.call import check_aggregation
from lightning_halo.loss import check_scale_loss
from lightning_halo.partition.options import check_balance, check_num_parts, check_partitioner
from lightning_halo.quant import check_bits
from lightning_halo.quant.allocate import check_bit_budget, check_bit_choices, check_bit_target, check_width
from lightning_halo.strategy import check_halo_timeout, check_num_threads
from tests.support.graphs import awkward_graph


class _Conv(MessagePassing):
    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)


def _register(kind: Any) -> None:
    try:
        register_layer(_Conv, kind)
    finally:
        registry._REG.specs.pop(_Conv, None)


_GRAPH: list = []


def _data_module(**kw: Any) -> HaloDataModule:
    if not _GRAPH:  # built before the spies: the graph helper itself partitions
        _GRAPH.append(awkward_graph(2, dtype=torch.float32))
    return HaloDataModule(_GRAPH[0], cache_dir="/nonexistent/never-written", **kw)


@dataclass(frozen=True)
class Option:
    name: str
    checker: Callable[..., Any]
    build: Callable[[Any], Any]  # the owner, built with the option set to a value
    good: Any
    bad: Any
    mine: Callable[[tuple, dict], bool] = lambda args, kwargs: True  # which calls of a shared checker are this option's


def _named(name: str, position: int = 1, default: str = "") -> Callable[[tuple, dict], bool]:
    return lambda args, kwargs: (args[position] if len(args) > position else kwargs.get("name", default)) == name


OPTIONS = [
    Option("bits", check_width, lambda v: HaloQuantStrategy(bits=v), 8, 3, _named("bits", default="bits")),
    Option("grad_bits", check_width, lambda v: HaloQuantStrategy(grad_bits=v), "adaptive", 5, _named("grad_bits")),
    Option("bit_choices", check_bit_choices, lambda v: HaloQuantStrategy(bits="adaptive", bit_choices=v), (1, 4), (3,)),
    Option("bit_budget", check_bit_budget, lambda v: HaloQuantStrategy(bits="adaptive", bit_budget=v), 1.5, 0.5),
    Option("bit_target", check_bit_target, lambda v: HaloQuantStrategy(bits="adaptive", bit_target=v), 0.05, -1.0),
    Option("eval_bits", check_bits, lambda v: HaloQuantStrategy(eval_bits=v), 16, 2.0, _named("eval_bits")),
    Option("aggregation", check_aggregation, lambda v: HaloQuantStrategy(aggregation=v), "sparse", "fused"),
    Option("scale_loss", check_scale_loss, lambda v: HaloQuantStrategy(scale_loss=v), "share", "mean"),
    Option("halo_timeout", check_halo_timeout, lambda v: HaloQuantStrategy(halo_timeout=v), 5.0, 0),
    Option("num_threads", check_num_threads, lambda v: HaloQuantStrategy(num_threads=v), 2, 0),
    Option("mode", check_mode, lambda v: HaloSchedule(mode=v), "periodic", "async"),
    Option("smoothing", check_smoothing, lambda v: HaloSchedule(mode="pipelined", smoothing=v), 0.5, 1.0),
    Option("sync_every", check_count, lambda v: HaloSchedule(mode="pipelined", sync_every=v), 3, 0,
           _named("sync_every", 0)),  # fmt: skip
    Option("refresh_every", check_count, lambda v: HaloSchedule(mode="periodic", refresh_every=v), 3, 0,
           _named("refresh_every", 0)),  # fmt: skip
    Option("drift_threshold", check_drift, lambda v: HaloSchedule(mode="adaptive", drift_threshold=v), 0.2, 0.0),
    Option("wait_threshold", check_wait, lambda v: HaloSchedule(mode="adaptive", wait_threshold=v), 0.1, 1.5),
    Option("warmup_epochs", check_count, lambda v: HaloSchedule(warmup_epochs=v), 2, -1, _named("warmup_epochs", 0)),
    Option("partitioner", check_partitioner, lambda v: _data_module(partitioner=v), "random", "kahip"),
    Option("balance", check_balance, lambda v: _data_module(balance=v), "edges", "vertices"),
    Option("num_parts", check_num_parts, lambda v: _data_module(num_parts=v), 2, 0),
    Option("kind", registry.check_kind, _register, "full", "dense"),
]


class _Spy:
    """Wraps ``checker`` wherever the package bound it, recording every call and what it raised."""

    def __init__(self, checker: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[tuple, dict]] = []
        self.raised: list[BaseException] = []

        def spy(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((args, kwargs))
            try:
                return checker(*args, **kwargs)
            except BaseException as err:
                self.raised.append(err)
                raise

        bound = 0
        for name, module in list(sys.modules.items()):
            if name.startswith("lightning_halo") and module is not None:
                for attr, value in list(vars(module).items()):
                    if value is checker:
                        monkeypatch.setattr(module, attr, spy)
                        bound += 1
        assert bound, f"{checker.__name__} is bound nowhere in the package"


@pytest.mark.parametrize("option", OPTIONS, ids=[o.name for o in OPTIONS])
def test_each_option_is_checked_once_by_its_checker(option: Option, monkeypatch: pytest.MonkeyPatch) -> None:
    option.build(option.good)  # warm: whatever the owner's fixtures build happens before the spy
    spy = _Spy(option.checker, monkeypatch)
    option.build(option.good)
    mine = [c for c in spy.calls if option.mine(*c)]
    assert len(mine) == 1, f"{option.name}={option.good!r} was checked {len(mine)} times: {mine}"
    spy.calls.clear()
    with pytest.raises(ValueError) as info:
        option.build(option.bad)
    assert spy.raised and info.value is spy.raised[-1], "the error must be the one checker's"
    assert option.name in str(info.value) or repr(option.bad) in str(info.value)
