"""Worker for link prediction on a heterogeneous graph: the plain PyG model of tests/support/hetero_link.py
trained on ``HaloLinkDataModule(edge_type=..., rev_edge_type=...)``, then validated and tested.

    python tests/workers/hetero_link_worker.py --out DIR --epochs 3 --bits 32 --model plain|zoo

Run as one rank of a job (see tests/support/launch.py). Writes DIR/rank<r>.pt: the parameters, the losses,
the ROC-AUC of validation and test, the rank's pairs per stage and the traffic totals.
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
from tests.support.hetero_link import EDGE, REV, SPLIT, build_model, link_graph
from tests.support.trainer import quiet_trainer


class Losses(L.Callback):
    def __init__(self, rec: dict) -> None:
        self.rec = rec
        rec["losses"] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rec["losses"].append(float(outputs["loss"].detach()))
        self.rec.setdefault("train_pairs", []).append(batch[EDGE].edge_label_index.clone())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--bits", type=int, default=32)
    parser.add_argument("--model", choices=["plain", "zoo"], default="plain")
    args = parser.parse_args()
    world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    warnings.filterwarnings("ignore")
    out = Path(args.out)
    data = link_graph()
    dm = HaloLinkDataModule(data, edge_type=EDGE, rev_edge_type=REV, cache_dir=str(out / "cache"), **SPLIT)
    model = build_model(data, args.model)
    rec: dict = {}
    strategy = HaloQuantStrategy(bits=args.bits, scale_loss="share")
    trainer = quiet_trainer(world_size, strategy=strategy, max_epochs=args.epochs, limit_val_batches=0,
                            callbacks=[Losses(rec)])  # fmt: skip
    trainer.fit(model, datamodule=dm)
    rec["meter_total"] = dict(trainer.strategy.exchanger.meter.total)
    rec["params"] = {k: p.detach().clone() for k, p in model.named_parameters()}
    ev = quiet_trainer(world_size, strategy=HaloQuantStrategy(bits=32, scale_loss="share"))
    for stage, run in (("val", ev.validate), ("test", ev.test)):
        rec[f"{stage}_auroc"] = float(run(model, datamodule=dm, verbose=False)[0][f"{stage}_auroc"])
    if args.model == "zoo":  # the zoo's predictions: this rank's test pairs and their probabilities
        rec["predicted"] = ev.predict(model, datamodule=dm)[0]
    rec["pairs"] = {s: dm.pairs(s)[0] for s in ("val", "test")}
    torch.save(rec, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
    shutdown()
