"""Worker for the shutdown test: pipelined 1-bit training, predict, then a plain interpreter exit.

    python tests/workers/shutdown_worker.py --out DIR [--hold-gil]

No ``destroy_process_group()`` and no ``os._exit``: the library must leave nothing behind that
aborts the exiting interpreter. Writes DIR/rank<r>.txt (the gathered predictions' shape) and, from
the last ``atexit`` handler, DIR/exit-rank<r>.txt: the gloo worker threads still alive then.

``--hold-gil`` makes the abort likelier: the main thread keeps the GIL until it blocks
(``sys.setswitchinterval``) and every thread shares one core, so a gloo worker thread that
finished the last collective tends to ask for the GIL late, while the interpreter shuts down.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

import argparse
import warnings

import torch

from lightning_halo import HaloDataModule, HaloQuantStrategy, HaloSchedule
from lightning_halo.models import GCN
from tests.support.graphs import awkward_graph
from tests.support.trainer import quiet_trainer


def gloo_threads_at_exit(out: Path, rank: int) -> None:
    """Registered before the library's handlers, so it runs after them (atexit: last in, first out)."""
    names = []
    for task in Path("/proc/self/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:
            continue
    (out / f"exit-rank{rank}.txt").write_text(str(names.count("pt_gloo_runloop")))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--hold-gil", action="store_true")
    args = parser.parse_args()
    world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if args.hold_gil:  # before the process groups start their threads (threads inherit the affinity)
        sys.setswitchinterval(1000.0)
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    warnings.filterwarnings("ignore")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    atexit.register(gloo_threads_at_exit, Path(args.out), rank)
    dm = HaloDataModule(awkward_graph(world_size, dtype=torch.float32), cache_dir=str(Path(args.out) / "cache"))
    model = GCN(dm.num_features, dm.num_classes, hidden_channels=8)
    trainer = quiet_trainer(world_size, strategy=HaloQuantStrategy(bits=1), max_epochs=3,
                            callbacks=[HaloSchedule(mode="pipelined", sync_every=2)])  # fmt: skip
    trainer.fit(model, datamodule=dm)
    logits = dm.gather_predictions(trainer.predict(model, datamodule=dm))
    (Path(args.out) / f"rank{rank}.txt").write_text(f"{tuple(logits.shape)}")
    dm.gather_predictions(logits[dm.partition.inner_global_id])  # the last collective: the interpreter exits next


if __name__ == "__main__":
    main()
