"""Worker for the partition-directory tests: train from a partition directory or the in-memory graph.

    python tests/workers/partition_dir_worker.py parity --out DIR --data PARTDIR|memory --configs sage:2:awkward ...
    python tests/workers/partition_dir_worker.py resume --out DIR --data PARTDIR --phase full|first|second
    python tests/workers/partition_dir_worker.py load --out DIR --data PARTDIR

``parity`` trains each config for 5 steps at bits=32 (the parity worker's recording module) and
writes DIR/<config>/rank<r>.pt; ``resume`` trains the example GCN (dropout, 1-bit halos, sync
and pipelined) as the resume worker does and writes DIR/<phase>/<mode>/rank<r>.pt.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from examples.train_cora import GCN
from lightning_halo import HaloDataModule, HaloQuantStrategy
from tests.support.exit import shutdown
from tests.support.graphs import graph_by_name
from tests.support.models import build_any
from tests.support.trainer import quiet_trainer
from tests.workers.parity_worker import EpochBytes, Recorder, _schedule

HALF, TOTAL = 3, 6
MODES = ("sync", "pipelined:2")


def datamodule(source: str, graph: str, world_size: int, cache: Path) -> HaloDataModule:
    if source == "memory":
        return HaloDataModule(graph_by_name(graph, world_size), cache_dir=str(cache))
    return HaloDataModule(source)


def parity(args: argparse.Namespace, world_size: int, rank: int) -> None:
    for config in args.configs:
        kind, depth, graph = config.split(":")
        data = graph_by_name(graph, world_size)  # the model is built from it; the DIR run never partitions it
        module = Recorder(build_any(f"{kind}:{depth}", data, hidden=16), kind)
        source = args.data if args.data == "memory" else str(Path(args.data) / f"{graph}-{world_size}")
        dm = datamodule(source, graph, world_size, Path(args.out) / "cache")
        trainer = quiet_trainer(world_size, strategy=HaloQuantStrategy(bits=32), callbacks=[EpochBytes(module.rec)],
                                max_epochs=5, limit_val_batches=0)  # fmt: skip
        trainer.fit(module, datamodule=dm)
        module.rec["num_features"], module.rec["num_classes"] = dm.num_features, dm.num_classes
        target = Path(args.out) / config.replace(":", "_")
        target.mkdir(parents=True, exist_ok=True)
        torch.save(module.rec, target / f"rank{rank}.pt")


def resume(args: argparse.Namespace, world_size: int, rank: int) -> None:
    out = Path(args.out)
    for mode in MODES:
        tag = mode.replace(":", "_")
        ckpt_dir = out / ("ckpt-full" if args.phase == "full" else "ckpt-split") / tag
        L.seed_everything(0)
        dm = HaloDataModule(args.data)
        model = GCN(dm.num_features, 32, dm.num_classes)
        trainer = L.Trainer(
            strategy=HaloQuantStrategy(bits=1, seed=1),
            accelerator="cpu",
            devices=world_size,
            max_epochs=HALF if args.phase == "first" else TOTAL,
            num_sanity_val_steps=1,
            enable_progress_bar=False,
            enable_model_summary=False,
            logger=False,
            callbacks=[*_schedule(mode), ModelCheckpoint(dirpath=ckpt_dir, save_last=True, every_n_epochs=1)],
        )
        trainer.fit(model, datamodule=dm, ckpt_path="last" if args.phase == "second" else None)
        target = out / args.phase / tag
        target.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, target / f"rank{rank}.pt")


def load(args: argparse.Namespace, world_size: int, rank: int) -> None:
    dm = HaloDataModule(args.data)
    model = GCN(dm.num_features, 16, dm.num_classes)
    try:
        quiet_trainer(world_size, strategy=HaloQuantStrategy(), max_epochs=1, limit_val_batches=0).fit(model, datamodule=dm)
        msg = "OK"
    except Exception as err:  # noqa: BLE001 - the message is the test subject
        msg = f"{type(err).__name__}: {err}"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank{rank}.txt").write_text(msg)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("task", choices=["parity", "resume", "load"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--data", required=True, help="parity: a folder of <graph>-<world size> partition directories, or 'memory'; resume: the partition directory")
    parser.add_argument("--configs", nargs="*", default=[])
    parser.add_argument("--phase", choices=["full", "first", "second"], default="full")
    args = parser.parse_args()
    world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    warnings.filterwarnings("ignore")
    {"parity": parity, "resume": resume, "load": load}[args.task](args, world_size, rank)


if __name__ == "__main__":
    main()
    shutdown()
