"""Worker for accuracy tests: trains the example GCN on Cora for each run and records test accuracy.

    python tests/workers/accuracy_worker.py --out DIR --epochs 200 --model gcn --runs 32:0 1:0 ...

A run is ``bits:seed`` optionally followed by ``:mode[:k]`` for a HaloSchedule (e.g.
``1:0:pipelined:5``). Rank 0 writes DIR/accuracy.json.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path

import lightning as L

from tests.support.exit import shutdown
from tests.support.lightning_models import MODELS
from tests.support.trainer import quiet_trainer
from lightning_halo import HaloDataModule, HaloQuantStrategy
from tests.support.cache import shared_cache


def schedule_callbacks(spec: list[str]) -> list:
    if not spec:
        return []
    from lightning_halo import HaloSchedule

    mode = spec[0]
    k = int(spec[1]) if len(spec) > 1 else None
    if mode == "pipelined":
        return [HaloSchedule(mode="pipelined", sync_every=k)]
    if mode == "periodic":
        return [HaloSchedule(mode="periodic", refresh_every=k or 5)]
    return [HaloSchedule(mode=mode)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--runs", nargs="+", required=True)
    parser.add_argument("--model", choices=sorted(MODELS), default="gcn")
    args = parser.parse_args()
    world_size = int(os.environ["WORLD_SIZE"])
    warnings.filterwarnings("ignore")
    results = {}
    for run in args.runs:
        bits, seed, *sched = run.split(":")
        L.seed_everything(int(seed), workers=True)
        dm = HaloDataModule("cora", cache_dir=shared_cache(Path(args.out) / "cache"))
        model = MODELS[args.model](dm.num_features, 64, dm.num_classes)
        trainer = quiet_trainer(
            world_size,
            strategy=HaloQuantStrategy(bits=int(bits), seed=int(seed)),
            max_epochs=args.epochs,
            limit_val_batches=0,
            callbacks=schedule_callbacks(sched),
        )
        trainer.fit(model, datamodule=dm)
        acc = trainer.test(model, datamodule=dm, verbose=False)[0]["test_acc"]
        results[run] = float(acc)
    if int(os.environ["RANK"]) == 0:
        (Path(args.out) / "accuracy.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
    shutdown()
