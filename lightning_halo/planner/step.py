"""What a training step costs beyond its kernels, measured through Lightning and the strategy on a tiny graph.

An epoch of full-graph training is one step, and the step pays, besides its sparse and dense
products, for Lightning's loop (the epoch's hooks, fetching the batch, the optimizer's Python),
the strategy's per-layer work (hooks, the halo bookkeeping and the ``all_to_all`` calls) and,
with several ranks, DDP's gradient hooks. None of it grows with the graph, so it is measured on
a 2-layer-wide model small enough that its kernels take a fraction of a millisecond:

* :func:`fit_epochs`: one rank, in this process (Lightning's loop and the strategy's hooks);
* :func:`measure_ranks`: ``ranks`` processes on this host over gloo (the halo exchange,
  DDP's all-reduce), started torchrun-style; each rank also times the kernels while the
  others do (:func:`~lightning_halo.planner.calibrate.measure_kernels`), which gives the
  slowdown of ranks sharing this host's cores.

Each epoch is timed from its start to the end of its one step (what the benchmark cells call an
epoch), at 1 and 3 layers: the overhead per step and per layer are the intercept and the slope,
after the kernel time the planner's own formulas give the tiny model is subtracted
(:func:`overhead_fit`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

from lightning_halo.rendezvous import free_port

#: The tiny model: nodes, out-degree, features, hidden width, classes.
TINY = {"nodes": 2000, "degree": 8, "features": 16, "hidden": 16, "classes": 4}
#: Layer counts the overhead is measured at (intercept and slope of a line through them).
LAYERS = (1, 3)
#: Epochs of each tiny fit: an epoch takes milliseconds, so many cost little, and the shortest of
#: many is what a host busy with other work still lets through.
EPOCHS = 30


def tiny_graph(nodes: int = TINY["nodes"], degree: int = TINY["degree"], features: int = TINY["features"],
               classes: int = TINY["classes"]) -> Any:  # fmt: skip
    """A random graph with features, labels and masks, the size the overhead is measured on."""
    import torch
    from torch_geometric.data import Data
    from torch_geometric.utils import to_undirected

    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, nodes, (nodes * degree // 2,), generator=g)
    dst = torch.randint(0, nodes, (nodes * degree // 2,), generator=g)
    keep = src != dst
    edge_index = to_undirected(torch.stack([src[keep], dst[keep]]), num_nodes=nodes)
    mask = torch.rand(nodes, generator=g)
    return Data(x=torch.randn(nodes, features, generator=g), edge_index=edge_index,
                y=torch.randint(0, classes, (nodes,), generator=g), train_mask=mask < 0.6,
                val_mask=(mask >= 0.6) & (mask < 0.8), test_mask=mask >= 0.8)  # fmt: skip


@contextlib.contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Lightning's info lines off while the tiny run trains, and its logger's level as it was afterwards (also on error)."""
    logger = logging.getLogger("lightning.pytorch")
    before = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(before)


def fit_epochs(layers: int, epochs: int, devices: int = 1) -> list[float]:
    """Seconds of every training epoch (its start to the end of its one step) of the tiny GCN with ``layers`` layers.

    Args:
        layers (int): message-passing layers. epochs (int): epochs trained.
        devices (int, optional): processes; more than one only inside ranks started by
            :func:`measure_ranks` (``LOCAL_RANK`` set: Lightning starts none itself). (default: ``1``)
    """
    import lightning as L

    from lightning_halo import HaloDataModule, HaloQuantStrategy
    from lightning_halo.models import GCN

    times: list[float] = []

    class Clock(L.Callback):
        start = 0.0

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            times.append(time.perf_counter() - self.start)

    quiet = contextlib.redirect_stdout(io.StringIO())  # the run's own report would corrupt `plan --json`
    with tempfile.TemporaryDirectory(prefix="halo-calibrate-") as tmp, warnings.catch_warnings(), quiet, _quiet_lightning():
        warnings.simplefilter("ignore")
        dm = HaloDataModule(tiny_graph(), num_parts=devices, cache_dir=tmp)
        model = GCN(TINY["features"], TINY["classes"], hidden_channels=TINY["hidden"], num_layers=layers)
        trainer = L.Trainer(
            strategy=HaloQuantStrategy(bits=32), accelerator="cpu", devices=devices, max_epochs=epochs, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, limit_val_batches=0, callbacks=[Clock()], default_root_dir=tmp,
        )  # fmt: skip
        trainer.fit(model, datamodule=dm)
    return times


def _fastest(times: Sequence[float], warmup: int = 2) -> float:
    """The shortest epoch after ``warmup`` (a busy host only ever adds time)."""
    if len(times) <= warmup:
        raise ValueError(f"timing the overhead needs more than {warmup} epochs, got {len(times)}")
    return min(times[warmup:])


def tiny_kernel_seconds(layers: int, ranks: int, rates: dict[str, Any]) -> float:
    """The tiny model's kernel time on one of ``ranks`` ranks, as the planner's formulas give it (halo rows left out)."""
    from lightning_halo.planner.memory import layer_dims
    from lightning_halo.planner.timing import compute_seconds

    n = TINY["nodes"] // ranks
    edges = TINY["nodes"] * TINY["degree"] // ranks
    dims = layer_dims(TINY["features"], TINY["hidden"], layers, TINY["classes"])
    return compute_seconds("gcn", dims, n, n, edges + n, rates)["total"]


def overhead_fit(epoch_s: dict[int, float], ranks: int, rates: dict[str, Any]) -> tuple[float, float]:
    """``(per step, per layer)`` seconds: the line through the shortest epochs at :data:`LAYERS`, kernels subtracted.

    Each is at least 0 (on a busy host a noisy pair of epochs can tilt the line below it).

    Args:
        epoch_s (dict[int, float]): the shortest epoch at each of :data:`LAYERS` layers.
        ranks (int): ranks it was measured with. rates (dict): the kernel rates for the subtraction.

    Example:
        >>> r = {"spmm": float("inf"), "dense": float("inf"), "elementwise_s": 0.0}
        >>> overhead_fit({1: 0.010, 3: 0.016}, 1, r)
        (0.007, 0.003)
    """
    lo, hi = LAYERS
    rest = {layers: epoch_s[layers] - tiny_kernel_seconds(layers, ranks, rates) for layers in LAYERS}
    per_layer = max((rest[hi] - rest[lo]) / (hi - lo), 0.0)
    return round(max(rest[lo] - lo * per_layer, 0.0), 12), round(per_layer, 12)


def measure_ranks(
    ranks: int = 2, threads: int = 1, epochs: int = EPOCHS, rounds: int = 3, timeout: float = 600.0
) -> list[dict[str, Any]]:
    """Start ``ranks`` processes on this host (gloo, torchrun-style); each returns its epochs and its kernel rates.

    Args:
        ranks (int, optional): processes. (default: ``2``)
        threads (int, optional): torch threads per process. (default: ``1``)
        epochs (int, optional): epochs at each of :data:`LAYERS`. (default: ``30``)
        rounds (int, optional): rounds of the kernels' timing, the best of each figure kept (as
            :func:`~lightning_halo.planner.calibrate.calibrate` keeps the best of its rounds alone). (default: ``3``)
        timeout (float, optional): seconds before the ranks are stopped. (default: ``600``)

    Raises:
        RuntimeError: a rank failed or timed out (its output is in the message).
    """
    with tempfile.TemporaryDirectory(prefix="halo-calibrate-ranks-") as out:
        base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(ranks),
                    NODE_RANK="0", OMP_NUM_THREADS=str(threads))  # fmt: skip
        cmd = [sys.executable, "-m", "lightning_halo.planner.step", "--epochs", str(epochs), "--threads", str(threads),
               "--rounds", str(rounds), "--out", out]  # fmt: skip
        procs = [subprocess.Popen(cmd, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for r in range(ranks)]  # fmt: skip
        logs, deadline = [], time.monotonic() + timeout
        try:
            for p in procs:
                logs.append(p.communicate(timeout=max(deadline - time.monotonic(), 1.0))[0])
        except subprocess.TimeoutExpired:
            logs.append(f"timed out after {timeout:.0f} s")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        failed = [r for r, p in enumerate(procs) if p.returncode != 0]
        if failed or len(logs) < ranks:
            raise RuntimeError(
                f"timing {ranks} ranks on this host failed (rank {failed}); their output:\n" + "\n".join(logs)[-4000:]
            )
        return [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(ranks)]


def _rank_main(argv: Optional[list[str]] = None) -> None:
    """One rank of :func:`measure_ranks`: the tiny fits at :data:`LAYERS`, then the kernels timed with the others."""
    p = argparse.ArgumentParser(description="one rank of the planner's overhead calibration")
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    import torch
    import torch.distributed as dist

    from lightning_halo.planner.calibrate import best_of, measure_kernels

    torch.set_num_threads(a.threads)
    world = int(os.environ["WORLD_SIZE"])
    epochs = {layers: fit_epochs(layers, a.epochs, devices=world) for layers in LAYERS}
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # every rank times its kernels while the others do
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernels = best_of([measure_kernels() for _ in range(max(a.rounds, 1))])
    record = {"epochs": {str(k): v for k, v in epochs.items()}, "kernels": kernels}
    Path(a.out, f"rank{os.environ['RANK']}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    _rank_main()
