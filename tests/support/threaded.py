"""Run the ranks of a model in threads (exchange over ``ThreadGroup``): fast in-process parity.

Each thread plays one rank: its own copy of the model with lightning-halo's layer hooks, its
own :class:`HaloExchanger` over an in-process transport, its partition. One forward and
backward; the loss is each rank's share of the global mean over train nodes, so the ranks'
parameter gradients *sum* to the whole graph's (what DDP's average computes with the
strategy's loss scaling). The reference is plain PyG on the whole graph.

Models and graphs run on ``LIGHTNING_HALO_DEVICE`` (``tests.support.device``): on CUDA in
``tools/gpu_check.sh``, where the threads' exchanges carry CUDA tensors; results come back on the CPU.
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from lightning_halo.exchange import HaloExchanger, TrafficMeter
from lightning_halo.exchange.wire import Wire
from lightning_halo.layers.hooks import LayerContext, install_batch_norms, install_hooks
from lightning_halo.partition import build_halo_partitions, partition_graph
from lightning_halo.testing import ThreadGroup
from tests.support.device import DEVICE

Forward = Callable[[nn.Module, Any], torch.Tensor]


def on_threads(world_size: int, fn: Callable[[int], Any], timeout: float = 60.0) -> list[Any]:
    """``fn(rank)`` for every rank at once, one thread each; the results by rank.

    If a rank raises, the first rank's error is raised here, carrying every rank's outcome
    (``None`` or its error) as ``rank_errors``.
    """
    results: list[Any] = [None] * world_size
    errors: list[Optional[BaseException]] = [None] * world_size

    def run(r: int) -> None:
        try:
            results[r] = fn(r)
        except BaseException as err:  # noqa: BLE001 - raised by the caller's thread
            errors[r] = err

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    first = next((err for err in errors if err is not None), None)
    if first is not None:
        first.rank_errors = errors  # type: ignore[attr-defined]  # every rank's outcome, for "all ranks refused"
        raise first
    return results


def on_wires(world_size: int, fn: Callable[[int, Wire], Any], timeout: float = 10.0) -> list[Any]:
    """``fn(rank, wire)`` on every rank, each with its own :class:`Wire` and meter over one :class:`ThreadGroup`."""
    group = ThreadGroup(world_size, timeout=timeout)
    return on_threads(world_size, lambda r: fn(r, Wire(group.transport(r), TrafficMeter())), timeout + 5)


def on_device(obj: Any) -> Any:
    """``obj`` (a module, graph or partition) on :data:`DEVICE`; a graph is copied first, never moved in place."""
    if DEVICE == "cpu":
        return obj
    return obj.to(DEVICE) if isinstance(obj, nn.Module) else copy.copy(obj).to(DEVICE)


def _cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: t.detach().cpu() for k, t in tensors.items()}


def plain_forward(model: nn.Module, batch: Any) -> torch.Tensor:
    return model(batch.x, batch.edge_index)


def _loss(out: torch.Tensor, batch: Any, n_train: int) -> torch.Tensor:
    mask = batch.train_mask
    return F.cross_entropy(out[mask], batch.y[mask], reduction="sum") / n_train


def reference(model: nn.Module, data: Any, forward: Forward = plain_forward, steps: int = 1) -> dict[str, Any]:
    model = on_device(copy.deepcopy(model))
    data = on_device(data)
    for _ in range(steps):
        model.zero_grad()
        out = forward(model, data)
        loss = _loss(out, data, int(data.train_mask.sum()))
        loss.backward()
    return {"out": out.detach().cpu(), "loss": float(loss.detach()),
            "grad": _cpu({k: p.grad for k, p in model.named_parameters() if p.grad is not None}),
            "buffers": _cpu({k: b.clone() for k, b in model.named_buffers()})}  # fmt: skip


def run_threaded(
    model: nn.Module,
    data: Any,
    world_size: int,
    forward: Forward = plain_forward,
    *,
    bits: int = 32,
    aggregation: str = "auto",
    halo_reduction: str = "cover",
    parts: Optional[list] = None,
    steps: int = 1,
    mode: Callable[[int], str] = lambda epoch: "sync",
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Logits of every node (assembled), loss, summed gradients, and each rank's layer choices."""
    if DEVICE != "cpu" and world_size > 1:
        # Autograd runs the backward of every thread's CUDA graph on one worker thread per device: a rank's
        # backward waiting for its peers' halo gradients blocks the others' (found on the GPU check: a hang).
        raise RuntimeError(f"threaded ranks on {DEVICE} run at world size 1 only (got {world_size}): autograd "
                           "serialises their backward on one device thread, where exchanges would deadlock")  # fmt: skip
    if parts is None:
        parts = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, world_size), world_size)
    group = ThreadGroup(world_size, timeout=timeout)
    n_train = int(data.train_mask.sum())

    def rank_main(r: int) -> dict[str, Any]:
        net = on_device(copy.deepcopy(model))
        ex = HaloExchanger(group.transport(r) if world_size > 1 else None, bits=bits)
        ctx = LayerContext(ex, aggregation, halo_reduction)  # type: ignore[arg-type]
        hooks = [*install_hooks(net, ctx), *install_batch_norms(net, ctx)]
        part = on_device(parts[r])
        ex.bind(part)
        ctx.bind(part)
        for step in range(steps):
            ex.begin_step(True, epoch=step, mode=mode(step))  # type: ignore[arg-type]
            net.zero_grad()
            out = forward(net, part)
            loss = ex.prepare_loss(_loss(out, part, n_train))
            loss.backward()
        grads = _cpu({k: p.grad.clone() for k, p in net.named_parameters() if p.grad is not None})
        for h in hooks:
            h.remove()
        return {"out": out.detach().cpu(), "loss": float(loss.detach()), "grad": grads, "ids": part.inner_global_id.cpu(),
                "choices": dict(ctx.choices), "meter": dict(ex.meter.total), "slots": ex.slot_layers(),
                "staleness": ex.staleness(), "plan": ex.plan(),
                "cover": ex.cover_plan() if world_size > 1 else None,
                "buffers": _cpu({k: b.clone() for k, b in net.named_buffers()})}  # fmt: skip

    results = on_threads(world_size, rank_main, timeout + 30)
    d = results[0]["out"].size(-1)
    out = torch.full((data.num_nodes, d), float("nan"), dtype=results[0]["out"].dtype)
    grad: dict[str, torch.Tensor] = {}
    for res in results:
        out[res["ids"]] = res["out"]
        for k, g in res["grad"].items():
            grad[k] = grad[k] + g if k in grad else g.clone()
    return {
        "out": out,
        "loss": sum(r["loss"] for r in results),
        "grad": grad,
        "choices": results[0]["choices"],
        "meters": [r["meter"] for r in results],
        "ranks": results,
    }


def assert_same(got: dict, ref: dict, atol: float = 1e-9, rtol: float = 1e-7, what: str = "") -> None:
    assert not torch.isnan(got["out"]).any(), f"{what}: some node's logits were produced by no rank"
    torch.testing.assert_close(got["out"], ref["out"], atol=atol, rtol=rtol, msg=lambda m: f"{what} logits: {m}")
    assert abs(got["loss"] - ref["loss"]) <= atol + rtol * abs(ref["loss"]), (what, got["loss"], ref["loss"])
    assert set(got["grad"]) == set(ref["grad"]), (what, set(got["grad"]) ^ set(ref["grad"]))
    for k, g in ref["grad"].items():
        torch.testing.assert_close(got["grad"][k], g, atol=atol, rtol=rtol, msg=lambda m: f"{what} grad {k}: {m}")
