"""Worker for rank-loss tests: one rank dies (or freezes) mid-training; later the job is relaunched.

    python tests/workers/rankloss_worker.py --out DIR --phase crash --how kill|freeze --timeout 10
    python tests/workers/rankloss_worker.py --out DIR --phase resume

Writes DIR/<phase>-rank<r>.json: {"ok": bool, "error": str, "seconds": float, "epoch": int}.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from examples.train_cora import GCN
from lightning_halo import HaloDataModule, HaloQuantStrategy
from tests.support.exit import shutdown
from tests.support.cache import shared_cache

EPOCHS, FAIL_AT = 6, 3


class Saboteur(L.Callback):
    def __init__(self, how: str) -> None:
        self.how = how

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.current_epoch == FAIL_AT and trainer.global_rank == 1:
            if self.how == "nan":  # training diverges on one rank: its halo rows turn NaN
                with torch.no_grad():
                    pl_module.conv1.bias.fill_(float("nan"))
                return
            os.kill(os.getpid(), signal.SIGKILL if self.how == "kill" else signal.SIGSTOP)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--phase", choices=["crash", "resume"], required=True)
    parser.add_argument("--how", choices=["kill", "freeze", "nan"], default="kill")
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args()
    world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    warnings.filterwarnings("ignore")
    out = Path(args.out)
    L.seed_everything(0)
    dm = HaloDataModule("cora", cache_dir=shared_cache(out / "cache"))
    model = GCN(dm.num_features, 16, dm.num_classes)
    callbacks = [ModelCheckpoint(dirpath=out / "ckpt", save_last=True, every_n_epochs=1)]
    if args.phase == "crash":
        callbacks.append(Saboteur(args.how))
    trainer = L.Trainer(
        strategy=HaloQuantStrategy(bits=1, halo_timeout=args.timeout),
        accelerator="cpu",
        devices=world_size,
        max_epochs=EPOCHS,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        callbacks=callbacks,
    )
    t0 = time.monotonic()
    record = {"ok": True, "error": "", "epoch": -1}
    try:
        trainer.fit(model, datamodule=dm, ckpt_path="last" if args.phase == "resume" else None)
    except Exception as err:  # noqa: BLE001 - the message is what the test checks
        record.update(ok=False, error=f"{type(err).__name__}: {err}")
    record.update(seconds=time.monotonic() - t0, epoch=trainer.current_epoch)
    (out / f"{args.phase}-rank{rank}.json").write_text(json.dumps(record))
    if not record["ok"]:
        raise SystemExit(1)
    shutdown()


if __name__ == "__main__":
    main()
