"""Worker for the link-prediction tests: trains LinkPredictor on HaloLinkDataModule and records.

    python tests/workers/link_worker.py --out DIR --configs cora:gcn:dot actor:gcn:dot --epochs 5 --bits 32

Run as one rank of a job (see tests/support/launch.py). Writes DIR/<config>/rank<r>.pt.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

import lightning as L
import torch

from lightning_halo import HaloLinkDataModule, HaloQuantStrategy
from tests.support.exit import shutdown
from tests.support.link import MODEL, SPLIT, build_model, link_graph
from tests.support.trainer import quiet_trainer
from tests.support.cache import shared_cache


class Losses(L.Callback):
    def __init__(self, rec: dict) -> None:
        self.rec = rec
        rec["losses"] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rec["losses"].append(float(trainer.callback_metrics["train_loss"]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--configs", nargs="+", required=True, help="graph:encoder:decoder")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--bits", type=int, default=32)
    args = parser.parse_args()
    world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    warnings.filterwarnings("ignore")
    for config in args.configs:
        graph, encoder, decoder = config.split(":")
        data = link_graph(graph)
        dm = HaloLinkDataModule(data, cache_dir=shared_cache(Path(args.out) / "cache"), **SPLIT)
        model = build_model(dm.num_features, data.x.dtype, encoder, decoder)
        rec: dict = {}
        strategy = HaloQuantStrategy(bits=args.bits, scale_loss="share")
        trainer = quiet_trainer(world_size, strategy=strategy, max_epochs=args.epochs, limit_val_batches=0,
                                callbacks=[Losses(rec)])  # fmt: skip
        trainer.fit(model, datamodule=dm)
        from lightning_halo import HaloTrafficLogger

        rec["summary"] = next(cb for cb in trainer.callbacks if isinstance(cb, HaloTrafficLogger)).summary
        meter = trainer.strategy.exchanger.meter
        rec["meter_total"], rec["meter_fp32"] = dict(meter.total), dict(meter.total_fp32)
        rec["params"] = {k: p.detach().clone() for k, p in model.named_parameters()}
        ev = quiet_trainer(world_size, strategy=HaloQuantStrategy(bits=32, scale_loss="share"))
        for stage, run in (("val", ev.validate), ("test", ev.test)):
            got = run(model, datamodule=dm, verbose=False)[0]
            rec[f"{stage}_auroc"] = float(got[f"{stage}_auroc"])
            rec[f"{stage}_hits"] = float(got[f"{stage}_hits@{MODEL['hits_k']}"])
        rec["n_pairs"] = {s: int(dm.pairs(s)[0].size(1)) for s in ("val", "test")}
        target = Path(args.out) / config.replace(":", "_")
        target.mkdir(parents=True, exist_ok=True)
        torch.save(rec, target / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
    shutdown()
