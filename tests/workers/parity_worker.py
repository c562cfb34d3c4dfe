"""Worker for the parity tests: trains each config for 5 steps with HaloQuantStrategy and records.

    python tests/workers/parity_worker.py --out DIR --configs gcn:2:cora sage:3:awkward ...

Run as one rank of a job (see tests/support/launch.py). Writes DIR/<config>/rank<r>.pt.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

import lightning as L
import torch

from lightning_halo import HaloDataModule, HaloQuantStrategy
from tests.support.cache import shared_cache
from tests.support.exit import shutdown
from tests.support.graphs import graph_by_name
from tests.support.models import LOSSES, build_any, edges_for, loss_of, node_ids
from tests.support.trainer import quiet_trainer


class Recorder(L.LightningModule):
    def __init__(self, net: torch.nn.Module, kind: str = "", sparse: bool = False) -> None:
        super().__init__()
        self.net = net
        self.kind, self.sparse = kind, sparse
        self.scale_x_rank0 = 0.0
        self.loss = "mean"
        self.rec: dict[str, object] = {}
        n_cls = int(getattr(net, "n_cls", 0)) or 2
        from torchmetrics.classification import MulticlassAccuracy

        self.val_acc = MulticlassAccuracy(n_cls, average="micro")
        self.test_acc = MulticlassAccuracy(n_cls, average="micro")

    def _edges(self, batch):
        return edges_for(self.kind, batch, self.sparse)

    def training_step(self, batch, _):
        if self.scale_x_rank0 and self.global_step == 0 and self.global_rank == 0:
            batch.x.mul_(self.scale_x_rank0)  # batch.x changed after partitioning, on one rank only
        out = self.net(batch.x, self._edges(batch), batch.get("edge_attr"), batch.get("edge_type"), **node_ids(self.net, batch))
        loss = loss_of(self.loss, out, batch.y, batch.train_mask, batch.inner_global_id)
        if self.global_step == 0:
            self.rec["out0"] = out.detach().clone()
            self.rec["loss0"] = float(loss) if batch.train_mask.any() or self.loss != "mean" else float("nan")
            self.rec["n_train"] = int(batch.train_mask.sum())
            self.rec["inner_global_id"] = batch.inner_global_id.clone()
        return loss

    def on_before_optimizer_step(self, optimizer):
        if self.global_step == 0:
            self.rec["grad0"] = {k: p.grad.detach().clone() for k, p in self.net.named_parameters() if p.grad is not None}

    def on_train_end(self):
        self.rec["params"] = {k: p.detach().clone() for k, p in self.net.named_parameters()}
        self.rec["buffers"] = {k: b.detach().clone() for k, b in self.net.named_buffers()}

    # Evaluation: torchmetrics updated with each rank's own nodes, logged as Metric objects.
    def _eval(self, batch, mask, metric, name):
        out = self.net(batch.x, self._edges(batch), batch.get("edge_attr"), batch.get("edge_type"), **node_ids(self.net, batch))
        metric(out[mask], batch.y[mask])
        self.log(name, metric, batch_size=1)

    def validation_step(self, batch, _):
        self._eval(batch, batch.val_mask, self.val_acc, "val_acc")

    def test_step(self, batch, _):
        self._eval(batch, batch.test_mask, self.test_acc, "test_acc")

    def predict_step(self, batch, _):
        out = self.net(batch.x, self._edges(batch), batch.get("edge_attr"), batch.get("edge_type"), **node_ids(self.net, batch))
        return batch.inner_global_id, out

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class EpochBytes(L.Callback):
    """Bytes handed to the collectives in each training epoch (this rank)."""

    def __init__(self, rec: dict) -> None:
        self.rec = rec
        rec["epoch_bytes"] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rec["epoch_bytes"].append(dict(trainer.strategy.exchanger.meter.epoch))
        self.rec.setdefault("decisions", []).append(
            [d for d, _ in trainer.strategy.halo_decisions().values()]
            if trainer.strategy.exchanger.mode == "adaptive" else trainer.strategy.exchanger.mode
        )
        self.rec.setdefault("drifts", []).append([v for _, v in trainer.strategy.halo_decisions().values()])
        self.rec.setdefault("widths", []).append(trainer.strategy.halo_widths())

    def on_train_end(self, trainer, pl_module):
        # The plans belong to the bound partition, which the strategy releases at teardown (after this hook).
        ex = trainer.strategy.exchanger
        self.rec["plan"] = {"num_send": ex.plan().num_send, "n_halo": ex.plan().n_halo}
        cover = ex.built_cover_plan  # built during fit by the calls that took partial sums
        if cover is not None:
            self.rec["cover"] = {"num_send": cover.num_send, "n_halo": cover.block,
                                 "send_counts": list(cover.send_counts), "recv_counts": list(cover.recv_counts)}


def _schedule(spec):
    if not spec:
        return []
    from lightning_halo import HaloSchedule

    mode, *k = spec.split(":")
    if mode == "pipelined":
        return [HaloSchedule(mode="pipelined", sync_every=int(k[0]) if k else None)]
    if mode == "periodic":
        return [HaloSchedule(mode="periodic", refresh_every=int(k[0]))]
    if mode == "adaptive":  # adaptive:DRIFT[:WAIT]; without WAIT the drift alone decides (reproducible decisions)
        return [HaloSchedule(mode="adaptive", drift_threshold=float(k[0]), wait_threshold=float(k[1]) if len(k) > 1 else 0.0)]
    return [HaloSchedule(mode=mode)]


def _trace(ex, rec: dict) -> None:
    """Record what every training exchange sent and returned, per epoch and slot."""
    rec["trace"] = []
    ex.observe(lambda direction, epoch, slot, sent, received: rec["trace"].append((direction, epoch, slot, sent, received)))


def _comm_hook(name: str | None, rec: dict):
    """A DDP communication hook: PyTorch's fp16 compression, or the exact all-reduce counting its calls."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if name is None:
        return None
    if name == "fp16":
        return default_hooks.fp16_compress_hook

    def counting(state, bucket):
        rec["comm_hook_calls"] = rec.get("comm_hook_calls", 0) + 1
        return default_hooks.allreduce_hook(state, bucket)

    return counting


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--configs", nargs="+", required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--bits", type=lambda v: v if v == "adaptive" else int(v), default=32, help="N or adaptive")
    parser.add_argument("--bit-budget", type=float, default=None, help="HaloQuantStrategy(bit_budget=...) (bits=adaptive)")
    parser.add_argument("--bit-target", type=float, default=None, help="HaloQuantStrategy(bit_target=...) (bits=adaptive)")
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--schedule", default=None, help="pipelined:K | periodic:K | adaptive:DRIFT[:WAIT] | sync")
    parser.add_argument("--trace", action="store_true", help="record rows/gradients of every training exchange")
    parser.add_argument("--eval", action="store_true", help="also run validate/test/predict after fit")
    parser.add_argument("--sparse", action="store_true", help="feed the layers lightning_halo.sparse_adjacency(batch)")
    parser.add_argument("--scale-x-rank0", type=float, default=0.0, help="rank 0 multiplies batch.x in place at step 0")
    parser.add_argument("--loss", choices=sorted(LOSSES), default="mean", help="the loss form (tests.support.models.LOSSES)")
    parser.add_argument("--aggregation", default="auto", help="HaloQuantStrategy(aggregation=...)")
    parser.add_argument("--partitioner", default="metis", help="HaloDataModule(partitioner=...)")
    parser.add_argument("--halo-reduction", default="cover", help="HaloQuantStrategy(halo_reduction=...)")
    parser.add_argument("--comm-hook", choices=["count", "fp16"], default=None, help="HaloQuantStrategy(ddp_comm_hook=...)")
    args = parser.parse_args()
    world_size = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    warnings.filterwarnings("ignore")
    from lightning_halo.layers.dropedge import reset_dropout_edge

    for config in args.configs:
        reset_dropout_edge()  # lightning_halo.dropout_edge draws as a fresh process does
        kind, depth, graph = config.split(":")
        data = graph_by_name(graph, world_size)
        net = build_any(f"{kind}:{depth}", data, hidden=args.hidden)
        module = Recorder(net, kind, args.sparse)
        module.scale_x_rank0 = args.scale_x_rank0
        module.loss = args.loss
        dm = HaloDataModule(data, partitioner=args.partitioner, cache_dir=shared_cache(Path(args.out) / "cache"))
        strategy = HaloQuantStrategy(
            bits=args.bits, scale_loss=LOSSES[args.loss], aggregation=args.aggregation, halo_reduction=args.halo_reduction,
            **({} if args.bit_budget is None else {"bit_budget": args.bit_budget}),
            **({} if args.bit_target is None else {"bit_target": args.bit_target}),
            ddp_comm_hook=_comm_hook(args.comm_hook, module.rec),
            # PyG's RGATConv leaves parameters unused; a cached SGConv stops its input's gradient after step 1
            find_unused_parameters="RGATConv" in config or "cached" in config,
        )  # fmt: skip
        if args.trace:
            _trace(strategy.exchanger, module.rec)
        trainer = quiet_trainer(
            world_size,
            strategy=strategy,
            callbacks=[*_schedule(args.schedule), EpochBytes(module.rec)],
            max_epochs=args.steps,
            limit_val_batches=0,
        )
        trainer.fit(module, datamodule=dm)
        ex = trainer.strategy.exchanger
        module.rec["meter_total"] = dict(ex.meter.total)
        module.rec["meter_total_fp32"] = dict(ex.meter.total_fp32)
        module.rec["logged"] = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("halo/")}
        if args.eval:
            ev = quiet_trainer(world_size, strategy=HaloQuantStrategy())
            module.rec["val_acc"] = float(ev.validate(module, datamodule=dm, verbose=False)[0]["val_acc"])
            module.rec["test_acc"] = float(ev.test(module, datamodule=dm, verbose=False)[0]["test_acc"])
            preds = ev.predict(module, datamodule=dm)
            module.rec["predict"] = preds[0]
            # the whole graph in global node order: the one-liner (a tuple), a bare tensor, a nested dict to rank 0
            module.rec["gathered"] = dm.gather_predictions(preds)
            logits = preds[0][1]
            module.rec["gathered_tensor"] = dm.gather_predictions(logits)
            module.rec["gathered_dict"] = dm.gather_predictions([{"logits": logits, "more": [logits[:, :1]]}], dst=0)
            try:  # one rank's rows do not cover its nodes: every rank raises, none waits
                dm.gather_predictions(logits[:3] if rank == 1 else logits)
            except ValueError as err:
                module.rec["gather_error"] = f"{type(err).__name__}: {err}"
        target = Path(args.out) / config.replace(":", "_").replace("/", "-")
        target.mkdir(parents=True, exist_ok=True)
        torch.save(module.rec, target / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
    shutdown()
