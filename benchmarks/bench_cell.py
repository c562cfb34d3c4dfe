"""One benchmark cell: train one configuration and record per-epoch timings, traffic and accuracy.

Run as every rank of a job (``srun``, ``torchrun`` or the harness's local launcher):

    python -m benchmarks.bench_cell --graph cornell5 --model gcn --bits 1 --mode pipelined5 --out DIR

Each rank writes ``DIR/rank<r>.json``; ``python -m benchmarks.harness`` merges them. ``--patience N``
stops training with Lightning's ``EarlyStopping`` on the validation score (ROC-AUC for binary
graphs, accuracy otherwise) and ``--time-budget S`` with ``Trainer(max_time=...)``, as
``python -m benchmarks.converge`` runs them. Baselines:
``--baseline single`` (one process, plain full-graph training, no halo strategy) and
``--baseline neighbor`` (Lightning DDP with PyG ``NeighborLoader`` mini-batches).
"""

import argparse
import json
import os
import resource
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchmetrics.classification import BinaryAUROC, MulticlassAccuracy

from benchmarks.graphs import graph_source
from lightning_halo import HaloDataModule, HaloQuantStrategy, HaloSchedule
from lightning_halo.models import GAT, GCN, GraphSAGE

MODELS = {"gcn": GCN, "sage": GraphSAGE, "gat": GAT}
MODES = {
    "sync": dict(mode="sync"),
    "pipelined": dict(mode="pipelined"),
    "pipelined5": dict(mode="pipelined", sync_every=5),
    "periodic": dict(mode="periodic", refresh_every=5),
    "adaptive": dict(mode="adaptive"),  # per-layer staleness from the drift of the sent rows (HaloSchedule's defaults)
}


def bench_model(name: str, **kwargs: Any) -> L.LightningModule:
    """The zoo model, also tracking test accuracy (and ROC-AUC) at every validation."""
    base = MODELS[name]

    class Bench(base):  # type: ignore[misc, valid-type]
        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            n = kw["out_channels"]
            self.v_acc, self.t_acc = MulticlassAccuracy(n, average="micro"), MulticlassAccuracy(n, average="micro")
            self.v_auc, self.t_auc = BinaryAUROC(), BinaryAUROC()

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            out = self(batch.x, self.adjacency(batch))
            for mask, acc, auc, tag in ((batch.val_mask, self.v_acc, self.v_auc, "val"), (batch.test_mask, self.t_acc, self.t_auc, "test")):
                if mask.any():  # a partition may own no val/test node
                    acc.update(out[mask], batch.y[mask])
                    if self.binary:
                        auc.update(out[mask].softmax(-1)[:, 1], batch.y[mask])
                self.log(f"b_{tag}_acc", acc, batch_size=1)
                if self.binary:
                    self.log(f"b_{tag}_auroc", auc, batch_size=1)

    if name == "gat":
        kwargs.setdefault("heads", 4)
    return Bench(**kwargs)


def _rss_mb() -> float:
    """Current resident set size of this process (VmRSS), in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Probe(L.Callback):
    """Per-epoch training time and its breakdown, traffic, accuracy and peak memory of this rank."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, Any]] = []
        self.allreduce_s = 0.0
        self.train_s = 0.0
        self._t0 = 0.0
        self.kernel_bound: Any = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        ddp = trainer.strategy.model
        if isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            probe, world = self, trainer.world_size

            def timed_allreduce(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
                # DDP's default all-reduce, timed from launch to completion (on our small models
                # the single bucket is ready only at the end of backward, so this is exposed time)
                t0 = time.perf_counter()
                fut = dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future()

                def done(f: torch.futures.Future) -> torch.Tensor:
                    probe.allreduce_s += time.perf_counter() - t0
                    return f.value()[0]

                return fut.then(done)

            ddp.register_comm_hook(None, timed_allreduce)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.allreduce_s = 0.0
        self._t0 = time.perf_counter()
        self._cpu0 = time.process_time()  # every thread of this process (gloo's too): work, not waiting
        self._phase: dict[str, float] = {}

    def _mark(self, trainer: L.Trainer, name: str) -> None:
        """Time (since the epoch's start) and halo wait so far at a phase boundary of the step."""
        ex = getattr(trainer.strategy, "exchanger", None)
        self._phase[name] = time.perf_counter() - self._t0
        self._phase[f"{name}_wait"] = ex.meter.epoch_wait_s if ex is not None else 0.0

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self._mark(trainer, "forward_end")

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._mark(trainer, "backward_end")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.record(trainer, time.perf_counter() - self._t0)

    def record(self, trainer: L.Trainer, step: float) -> None:
        """Append this epoch's record: ``step`` seconds of training (no evaluation) and the meters' figures."""
        self.train_s += step
        ex = getattr(trainer.strategy, "exchanger", None)
        m = ex.meter if ex is not None else None
        self.epochs.append(
            {
                "epoch": trainer.current_epoch,
                "step_s": step,
                "cpu_s": time.process_time() - self._cpu0,
                "train_wall_s": self.train_s,
                "steps": trainer.global_step,  # optimizer steps so far (one per epoch for full-graph training)
                "wait_s": m.epoch_wait_s if m else 0.0,
                "codec_s": m.epoch_codec_s if m else 0.0,
                "allreduce_s": self.allreduce_s,
                "fwd_bytes": sum(v for (_, d), v in m.epoch.items() if d == "fwd") if m else 0,
                "bwd_bytes": sum(v for (_, d), v in m.epoch.items() if d == "bwd") if m else 0,
                "once_bytes": sum(v for (_, d), v in m.epoch.items() if d in ("input", "aux")) if m else 0,
                "staleness": max(ex.staleness(), default=0) if ex is not None else 0,
                "rss_mb": _rss_mb(),
                "mode": ex.mode if ex is not None else "single",
                # adaptive: how many layers ran stale this epoch, of how many
                **({"stale_layers": [d for d, _ in ex.decisions()].count("pipelined"), "layers": len(ex.decisions())}
                   if ex is not None and ex.mode == "adaptive" else {}),
                # bits="adaptive": this epoch's agreed width per exchange and direction
                **({"widths": dict(zip(ex.slot_layers(), ex.widths())), "noise": dict(zip(ex.slot_layers(), ex.width_noise()))}
                   if ex is not None and ex.adaptive_bits else {}),
                # phases of the step: forward (to the loss), backward (with DDP's all-reduce), the rest
                # (optimizer); each with the halo wait inside it
                **self._phases(step),
            }
        )

    def _phases(self, step: float) -> dict[str, float]:
        p = getattr(self, "_phase", {})
        if "forward_end" not in p or "backward_end" not in p:
            return {}
        fwd, bwd = p["forward_end"], p["backward_end"]
        return {
            "forward_s": fwd, "backward_s": bwd - fwd, "optimizer_s": step - bwd,
            "forward_wait_s": p["forward_end_wait"], "backward_wait_s": p["backward_end_wait"] - p["forward_end_wait"],
        }  # fmt: skip

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not self.epochs:
            return
        metrics = trainer.callback_metrics
        for key in ("b_val_acc", "b_test_acc", "b_val_auroc", "b_test_auroc"):
            if key in metrics:
                self.epochs[-1][key[2:]] = float(metrics[key])


def stopping(args: argparse.Namespace, binary: bool) -> tuple[list[L.Callback], dict[str, Any]]:
    """Lightning's own stopping rules for a convergence run: early stopping on validation, a wall-clock budget.

    ``EarlyStopping`` reduces its decision over the ranks through the strategy (any rank's stop
    stops all) and ``Timer`` (``max_time``) broadcasts rank 0's, so every rank stops at the same
    epoch. The monitored metric is torchmetrics-synced, hence equal on every rank anyway.
    """
    callbacks: list[L.Callback] = []
    if args.patience:
        from lightning.pytorch.callbacks import EarlyStopping

        monitor = "b_val_auroc" if binary else "b_val_acc"
        callbacks.append(EarlyStopping(monitor=monitor, mode="max", patience=args.patience, check_finite=False))
    kwargs: dict[str, Any] = {"max_time": {"seconds": args.time_budget}} if args.time_budget else {}
    return callbacks, kwargs


def stop_reason(trainer: L.Trainer, args: argparse.Namespace) -> str:
    """Why training ended: ``patience`` (early stopping), ``time`` (the budget) or ``max_epochs``."""
    from lightning.pytorch.callbacks import EarlyStopping

    es = next((c for c in trainer.callbacks if isinstance(c, EarlyStopping)), None)
    if es is not None and es.stopped_epoch > 0:
        return "patience"
    if trainer.current_epoch < trainer.max_epochs and args.time_budget:
        return "time"
    return "max_epochs"


def run_halo(args: argparse.Namespace, world_size: int) -> tuple[Probe, L.Trainer]:
    dm = HaloDataModule(graph_source(args.graph), cache_dir=args.cache_dir)
    model = bench_model(
        args.model, in_channels=dm.num_features, out_channels=dm.num_classes, hidden_channels=args.hidden,
        num_layers=args.layers, lr=args.lr, dropout=args.dropout, **({"sparse": True} if args.sparse else {}),
    )  # fmt: skip
    probe = Probe()
    callbacks: list[L.Callback] = [probe]
    if args.baseline == "single":
        strategy: Any = "auto"
    else:
        strategy = HaloQuantStrategy(
            bits=args.bits, seed=args.seed, **({"bit_budget": args.bit_budget} if args.bit_budget is not None else {}), **({"bit_target": args.bit_target} if args.bit_target is not None else {}),
            # the budget opens when the early-stopping metric stalls for --bit-patience validations
            **({"bit_monitor": "b_val_auroc" if dm.num_classes == 2 else "b_val_acc", "bit_mode": "max",
                "bit_patience": args.bit_patience} if args.bit_patience else {}),
            halo_timeout=args.timeout, aggregation=args.aggregation,
            halo_reduction=args.halo_reduction, num_threads=int(os.environ.get("OMP_NUM_THREADS", "1")),
        )
        callbacks.append(HaloSchedule(**MODES[args.mode]))
    stops, limits = stopping(args, dm.num_classes == 2)
    callbacks += stops
    trainer = L.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        max_epochs=args.epochs,
        num_sanity_val_steps=0,
        check_val_every_n_epoch=args.eval_every,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        callbacks=callbacks,
        **limits,
    )
    trainer.fit(model, datamodule=dm)
    probe.kernel_bound = _kernel_bound(args, dm)
    return probe, trainer


def _kernel_bound(args: argparse.Namespace, dm: HaloDataModule) -> Any:
    """This rank's kernel bound (same run, same threads): its epoch's SpMMs and matmuls alone."""
    if args.model not in ("gcn", "sage", "gin") or dm.partition is None:
        return None
    from benchmarks.kernel_bound import kernel_bound

    dims = [dm.num_features] + [args.hidden] * (args.layers - 1) + [dm.num_classes]
    bound = kernel_bound(args.model, dm.partition.cpu(), dims)
    return {k: v for k, v in bound.items() if k != "kernels"}


def run_neighbor(args: argparse.Namespace, world_size: int, rank: int) -> tuple[Probe, L.Trainer]:
    """Lightning DDP with neighbour-sampled mini-batches: what users would otherwise pick.

    Uses :class:`benchmarks.sampler.UniformNeighborLoader`, since PyG's NeighborLoader needs
    pyg-lib or torch-sparse, which cannot be installed here.
    """
    from benchmarks.sampler import UniformNeighborLoader as NeighborLoader
    from lightning_halo.data import load_graph

    data = load_graph(graph_source(args.graph))
    n_cls = int(data.y.max()) + 1
    train_idx = torch.nonzero(data.train_mask).view(-1)[rank::world_size]  # each rank its share
    val_idx = torch.nonzero(data.val_mask).view(-1)[rank::world_size]
    test_idx = torch.nonzero(data.test_mask).view(-1)[rank::world_size]
    fanout = list(args.fanout) if args.fanout else [10] * args.layers
    # each rank samples its own stream, and a new one per seed (evaluation: the same fan-outs)
    train_loader = NeighborLoader(data, num_neighbors=fanout, batch_size=args.batch_size, input_nodes=train_idx, shuffle=True,
                                  seed=1000 * args.seed + rank)  # fmt: skip
    eval_loader = NeighborLoader(data, num_neighbors=fanout, batch_size=4096, input_nodes=torch.cat([val_idx, test_idx]),
                                 seed=1000 * args.seed + rank + 500)  # fmt: skip
    n_val = val_idx.numel()
    base = bench_model(
        args.model, in_channels=data.num_features, out_channels=n_cls, hidden_channels=args.hidden,
        num_layers=args.layers, lr=args.lr, dropout=args.dropout,
    )  # fmt: skip

    class MiniBatch(type(base)):  # type: ignore[misc]
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            out = self(batch.x, batch.edge_index)[: batch.batch_size]
            return F.cross_entropy(out, batch.y[: batch.batch_size])

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            out = self(batch.x, batch.edge_index)[: batch.batch_size]
            y = batch.y[: batch.batch_size]
            is_val = batch.input_id < n_val  # input_id indexes the concatenated [val; test] nodes
            for sel, acc, auc, tag in ((is_val, self.v_acc, self.v_auc, "val"), (~is_val, self.t_acc, self.t_auc, "test")):
                if sel.any():  # a mini-batch may hold only val or only test nodes; torchmetrics rejects empty input
                    acc.update(out[sel], y[sel])
                    if self.binary:
                        auc.update(out[sel].softmax(-1)[:, 1], y[sel])
                self.log(f"b_{tag}_acc", acc, batch_size=1)
                if self.binary:
                    self.log(f"b_{tag}_auroc", auc, batch_size=1)

    model = MiniBatch(
        in_channels=data.num_features, out_channels=n_cls, hidden_channels=args.hidden, num_layers=args.layers,
        lr=args.lr, dropout=args.dropout, **({"heads": 4} if args.model == "gat" else {}),
    )  # fmt: skip

    class EpochProbe(Probe):
        def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            super().on_train_epoch_start(trainer, pl_module)
            self._batches = 0
            self._trained = 0.0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
            self._batches += 1
            self._trained = time.perf_counter() - self._t0  # validation runs after the last batch: not training time

        def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            self.record(trainer, self._trained)
            self.epochs[-1]["batches"] = self._batches

        def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            # in mini-batch training validation runs before on_train_epoch_end: stash the metrics
            if trainer.sanity_checking:
                return
            self._pending = {k[2:]: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("b_")}

    probe = EpochProbe()
    stops, limits = stopping(args, n_cls == 2)

    class Attach(L.Callback):
        def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            if probe.epochs and getattr(probe, "_pending", None):
                probe.epochs[-1].update(probe._pending)
                probe._pending = None  # an epoch cut short by the time budget has no validation of its own

    trainer = L.Trainer(
        strategy="ddp" if world_size > 1 else "auto",
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        max_epochs=args.epochs,
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        callbacks=[probe, Attach(), *stops],
        **limits,
    )
    trainer.fit(model, train_dataloaders=train_loader, val_dataloaders=eval_loader)
    return probe, trainer


def _bits(text: str) -> int | str:
    return text if text == "adaptive" else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", required=True)
    parser.add_argument("--model", choices=sorted(MODELS), default="gcn")
    parser.add_argument("--bits", type=_bits, default=32, help="1, 2, 4, 8, 16, 32 or adaptive")
    parser.add_argument("--bit-budget", type=float, default=None, help="HaloQuantStrategy(bit_budget=...) with --bits adaptive")
    parser.add_argument("--bit-target", type=float, default=None, help="HaloQuantStrategy(bit_target=...) with --bits adaptive")
    parser.add_argument("--bit-patience", type=int, default=0,
                        help="with --bits adaptive: HaloQuantStrategy(bit_monitor=<the validation score>, bit_mode='max', "
                             "bit_patience=N): the narrowest width until the score stalls for N validations")
    parser.add_argument("--mode", choices=sorted(MODES), default="sync")
    parser.add_argument("--baseline", choices=["none", "single", "neighbor"], default="none")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--sparse", action="store_true", help="the model passes a sparse adjacency itself")
    parser.add_argument("--aggregation", default="auto", choices=["auto", "edge_index", "sparse"],
                        help="HaloQuantStrategy(aggregation=...): the fused kernel by default")
    parser.add_argument("--halo-reduction", default="cover", choices=["cover", "none"],
                        help="HaloQuantStrategy(halo_reduction=...): partial sums by default")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=1024, help="--baseline neighbor: seed nodes per mini-batch")
    parser.add_argument("--fanout", type=int, nargs="+", default=None,
                        help="--baseline neighbor: neighbours sampled per hop (default 10 per layer)")
    parser.add_argument("--patience", type=int, default=0,
                        help="stop after this many validations without a better validation score (EarlyStopping; 0: off)")
    parser.add_argument("--time-budget", type=float, default=0.0,
                        help="stop after this many seconds of fit() wall time (Trainer(max_time=...); 0: off)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    L.seed_everything(args.seed, workers=True)
    world_size = args.devices * args.num_nodes
    t0 = time.perf_counter()
    if args.baseline == "neighbor":
        probe, trainer = run_neighbor(args, world_size, int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))))
    else:
        probe, trainer = run_halo(args, world_size)
    rank = trainer.global_rank
    summary = getattr(next((c for c in trainer.callbacks if type(c).__name__ == "HaloTrafficLogger"), None), "summary", {})
    record = {
        "config": vars(args),
        "rank": rank,
        "world_size": trainer.world_size,
        "total_s": time.perf_counter() - t0,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "epochs": probe.epochs,
        "traffic_summary": summary,
        "kernel_bound": probe.kernel_bound,
        "stopped_by": stop_reason(trainer, args),
        "layer_choices": getattr(trainer.strategy, "layer_choices", {}),
        "host": os.uname().nodename,
        "slurm_node": os.environ.get("SLURMD_NODENAME"),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
