"""Worker for the heterogeneous-graph tests: train HeteroNodeClassifier on heterogeneous partitions.

    python tests/workers/hetero_worker.py --out DIR --configs sage:32:sync gat:32:sync hgt:1:pipelined ...

Config ``lazy`` trains a model with lazy parameters (refused first, then materialised as the
refusal says) and writes DIR/lazy/rank<r>.pt. Each config ``<conv>:<bits>:<mode>[:leaf][:none]`` (``leaf``: the
graph of :func:`tests.support.hetero.with_leaf_relation`; ``none``: ``halo_reduction="none"``, every halo row
travels, else partial sums per relation where they apply) trains the model (float64, no dropout, seeded) for
``EPOCHS`` epochs on the generated heterogeneous graph (a featureless type included) and writes
DIR/<config>/rank<r>.pt: the parameters after training, the gathered predictions of the
labelled type, the validation accuracy and the traffic totals. ``--epochs``, ``--save CKPT`` and
``--resume CKPT`` train to another epoch count, write a checkpoint after fit, or fit from one.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path
from typing import Optional

import lightning as L
import torch

from lightning_halo import HaloDataModule, HaloQuantStrategy, HaloSchedule
from tests.support.exit import shutdown
from tests.support.hetero import generated_hetero, hetero_model, lazy_model, with_leaf_relation
from tests.support.trainer import quiet_trainer

EPOCHS = 4


def lazy(out: Path, world_size: int) -> dict:
    """A lazy model is refused before DDP wraps it; materialised by one forward on the whole graph, it trains."""
    dm = HaloDataModule(generated_hetero(), cache_dir=str(out / "cache"))
    model = lazy_model(dm.metadata, dm.num_nodes, dm.labelled_type, dm.num_classes)
    # to_hetero's last layer updates every type, and the loss reads one: its other relations are unused
    unused = {"find_unused_parameters": True}
    try:
        quiet_trainer(world_size, strategy=HaloQuantStrategy(bits=32, **unused), max_epochs=1).fit(model, datamodule=dm)
        refusal = ""
    except RuntimeError as err:
        refusal = str(err)
    L.seed_everything(0, verbose=False)
    model = lazy_model(dm.metadata, dm.num_nodes, dm.labelled_type, dm.num_classes)
    with torch.no_grad():
        model(dm.data)  # what the refusal says to do
    trainer = quiet_trainer(world_size, strategy=HaloQuantStrategy(bits=32, **unused), max_epochs=EPOCHS, limit_val_batches=0)
    trainer.fit(model, datamodule=dm)
    return {"refusal": refusal, "params": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def run(config: str, out: Path, world_size: int, rank: int, epochs: int = EPOCHS, save: Optional[str] = None,
        resume: Optional[str] = None) -> None:  # fmt: skip
    if config == "lazy":
        target = out / "lazy"
        target.mkdir(parents=True, exist_ok=True)
        torch.save(lazy(out, world_size), target / f"rank{rank}.pt")
        return
    conv, bits, mode, *extra = config.split(":")
    leaf = "leaf" in extra
    data = generated_hetero() if not leaf else with_leaf_relation(generated_hetero())
    dm = HaloDataModule(data, cache_dir=str(out / ("cache" if not leaf else "cache_leaf")))
    model = hetero_model(conv, dm.metadata, dm.num_features, dm.num_nodes, dm.labelled_type, dm.num_classes)
    schedule = [] if mode == "sync" else [HaloSchedule(mode=mode, sync_every=3)]
    strategy = HaloQuantStrategy(bits=int(bits), find_unused_parameters=conv in ("hgt", "han"),
                                 halo_reduction="none" if "none" in extra else "cover")  # fmt: skip
    trainer = quiet_trainer(world_size, strategy=strategy, max_epochs=epochs, callbacks=schedule)
    trainer.fit(model, datamodule=dm, ckpt_path=resume)
    if save:
        trainer.save_checkpoint(save)  # every rank: the halo state of each is gathered into it
    val = trainer.validate(model, datamodule=dm, verbose=False)[0]
    pred = dm.gather_predictions(trainer.predict(model, datamodule=dm))
    target = out / config.replace(":", "_")
    target.mkdir(parents=True, exist_ok=True)
    torch.save({"params": {k: v.detach().clone() for k, v in model.state_dict().items()}, "pred": pred, "val": val,
                "traffic": dict(strategy.traffic.total), "choices": strategy.layer_choices}, target / f"rank{rank}.pt")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--configs", nargs="+", required=True)
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="train until this many epochs")
    parser.add_argument("--save", help="write a checkpoint here after fit (one config)")
    parser.add_argument("--resume", help="fit from this checkpoint (one config)")
    args = parser.parse_args()
    world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    warnings.filterwarnings("ignore")
    for config in args.configs:
        L.seed_everything(0, verbose=False)
        run(config, Path(args.out), world_size, rank, args.epochs, args.save, args.resume)


if __name__ == "__main__":
    main()
    shutdown()
