"""What a resize costs a lossy run: final test accuracy of 1-bit pipelined GCN on Cora, resumed at another process count.

    python -m benchmarks.resize_accuracy            # about 5 minutes on 2 cores

For each seed, the uninterrupted run at *P* processes (``--epochs``, default 100) and the same run
checkpointed after half the epochs and resumed at *Q* (4 -> 2 and 2 -> 3; the halo state
restarts with a sync epoch, docs/modes.md#resuming-at-another-number-of-processes). GCN (64
hidden), 1-bit halos, ``HaloSchedule(mode="pipelined", sync_every=5)``, local processes.
Writes ``benchmarks/results/resize_accuracy.json``: every run's test accuracy, and per transition
the mean over seeds of resumed minus uninterrupted. At ``bits=32`` sync a resize is exact
(``tests/callbacks/test_resize.py``); this measures the lossy modes, where it is not.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "resize_accuracy.json"
TRANSITIONS = ((4, 2), (2, 3))


def rank_main(out: Path, phase: str, seed: int, epochs: int) -> None:
    """One rank: ``full`` trains ``epochs``; ``first`` half of them (checkpoint); ``second`` resumes it to ``epochs``."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_halo import HaloDataModule, HaloQuantStrategy, HaloSchedule
    from lightning_halo.models import GCN

    warnings.filterwarnings("ignore")
    L.seed_everything(seed)
    dm = HaloDataModule("cora", cache_dir=os.environ.get("LIGHTNING_HALO_CACHE"))
    model = GCN(dm.num_features, dm.num_classes, hidden_channels=64)
    trainer = L.Trainer(
        strategy=HaloQuantStrategy(bits=1, seed=seed), accelerator="cpu", devices=int(os.environ["WORLD_SIZE"]),
        max_epochs=epochs // 2 if phase == "first" else epochs, limit_val_batches=0, num_sanity_val_steps=0,
        enable_progress_bar=False, enable_model_summary=False, logger=False,
        callbacks=[HaloSchedule(mode="pipelined", sync_every=5), ModelCheckpoint(dirpath=out / "ckpt", save_last=True)],
    )  # fmt: skip
    trainer.fit(model, datamodule=dm, ckpt_path=str(out / "ckpt" / "last.ckpt") if phase == "second" else None)
    if phase != "first":
        acc = float(trainer.test(model, datamodule=dm, verbose=False)[0]["test_acc"])
        if trainer.global_rank == 0:
            (out / f"{phase}.json").write_text(json.dumps({"test_acc": acc}))


def run(work: Path, world: int, phase: str, seed: int, epochs: int) -> None:
    from benchmarks.launch import check, run_workers

    args = [str(Path(__file__).resolve()), "rank", "--out", str(work), "--phase", phase, "--seed", str(seed),
            "--epochs", str(epochs)]  # fmt: skip
    check(run_workers(args, world, timeout=1800, env={"PYTHONPATH": str(ROOT)}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd")
    r = sub.add_parser("rank")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--phase", choices=["full", "first", "second"], required=True)
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--epochs", type=int, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--out", type=Path, default=RESULT)
    a = p.parse_args(argv)
    if a.cmd == "rank":
        rank_main(a.out, a.phase, a.seed, a.epochs)
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="halo-resize-acc-") as tmp:
        os.environ.setdefault("LIGHTNING_HALO_CACHE", str(Path(tmp) / "cache"))
        for src, dst in TRANSITIONS:
            for seed in a.seeds:
                full, resized = Path(tmp) / f"full-{src}-{seed}", Path(tmp) / f"resize-{src}-{dst}-{seed}"
                run(full, src, "full", seed, a.epochs)
                run(resized, src, "first", seed, a.epochs)
                run(resized, dst, "second", seed, a.epochs)
                row = {"from": src, "to": dst, "seed": seed,
                       "uninterrupted": json.loads((full / "full.json").read_text())["test_acc"],
                       "resized": json.loads((resized / "second.json").read_text())["test_acc"]}  # fmt: skip
                print(json.dumps(row), flush=True)
                rows.append(row)
    summary = []
    for src, dst in TRANSITIONS:
        mine = [r for r in rows if (r["from"], r["to"]) == (src, dst)]
        diff = sum(r["resized"] - r["uninterrupted"] for r in mine) / len(mine)
        summary.append({"from": src, "to": dst, "mean_resized_minus_uninterrupted": round(diff, 4),
                        "max_abs": round(max(abs(r["resized"] - r["uninterrupted"]) for r in mine), 4)})  # fmt: skip
    a.out.write_text(json.dumps({"graph": "cora", "model": "GCN 64", "bits": 1, "schedule": "pipelined, sync_every=5",
                                 "epochs": a.epochs, "resized_after": a.epochs // 2, "runs": rows, "summary": summary},
                                indent=1) + "\n")  # fmt: skip
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
