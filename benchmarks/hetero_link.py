"""What 1-bit halos and pair rows cost link prediction on a heterogeneous graph: DBLP's paper -> author links.

    python -m benchmarks.hetero_link --page docs/link-prediction.md   # a few minutes on 2 cores
    python -m benchmarks.hetero_link --epochs 20 --seeds 0            # a quick look

HeCo's DBLP (``heco/dblp`` of the shared datasets, with a reverse type per relation) split on
``("paper", "to", "author")`` by ``HaloLinkDataModule(edge_type=..., rev_edge_type=("author", "rev_to",
"paper"), num_val=0.05, num_test=0.1)``; ``HeteroLinkPredictor`` (SAGE per relation, 64 hidden, 2
layers, dot decoder) trained ``--epochs`` epochs on 2 local gloo processes at 32 bits and at 1 bit
(sync: halo rows, gradients and pair rows), per seed; the test ROC-AUC and Hits@50 of the weights with
the best validation ROC-AUC (checked every 5 epochs). Writes ``benchmarks/results/hetero_link.json``:
every run, training bytes per epoch by layer, and per bit width the mean over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "hetero_link.json"
EDGE, REV = ("paper", "to", "author"), ("author", "rev_to", "paper")
SECTION = "hetero-link"  # the generated section of docs/link-prediction.md


def rank_main(out: Path, runs: list[str], epochs: int) -> None:
    """One rank: every ``<bits>:<seed>`` run, one after the other."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from examples.hetero_dblp import heco_graph
    from lightning_halo import HaloLinkDataModule, HaloQuantStrategy
    from lightning_halo.models import HeteroLinkPredictor

    warnings.filterwarnings("ignore")
    world_size = int(os.environ["WORLD_SIZE"])  # read once: a finished Trainer's teardown removes it
    graph = heco_graph(Path(os.environ["HECO"]) / "dblp")
    for run in runs:
        bits, seed = (int(v) for v in run.split(":"))
        L.seed_everything(seed, verbose=False)
        dm = HaloLinkDataModule(graph, edge_type=EDGE, rev_edge_type=REV, num_val=0.05, num_test=0.1, seed=seed,
                                cache_dir=os.environ.get("LIGHTNING_HALO_CACHE"))  # fmt: skip
        model = HeteroLinkPredictor(dm.metadata, dm.num_features, dm.num_nodes, dm.edge_type, hidden_channels=64)
        best = ModelCheckpoint(dirpath=out / "ckpt" / run.replace(":", "_"), monitor="val_auroc", mode="max")
        strategy = HaloQuantStrategy(bits=bits, seed=seed, scale_loss="share")
        trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=world_size, max_epochs=epochs,
                            check_val_every_n_epoch=5, num_sanity_val_steps=0, enable_progress_bar=False,
                            enable_model_summary=False, logger=False, callbacks=[best])  # fmt: skip
        trainer.fit(model, datamodule=dm)
        per_epoch = {f"{layer}/{kind}": total / epochs for (layer, kind), total in strategy.traffic.total.items()
                     if kind in ("fwd", "bwd")}  # fmt: skip
        test = trainer.test(model, datamodule=dm, ckpt_path=best.best_model_path, verbose=False)[0]
        if trainer.global_rank == 0:
            row = {"bits": bits, "seed": seed, "epochs": epochs, "best_val_auroc": float(best.best_model_score),
                   "test_auroc": float(test["test_auroc"]), "test_hits@50": float(test["test_hits@50"]),
                   "bytes_per_epoch": per_epoch}  # fmt: skip
            (out / f"{run.replace(':', '_')}.json").write_text(json.dumps(row))


def summarise(rows: list[dict]) -> list[dict]:
    """Per bit width: mean test ROC-AUC and Hits@50 over seeds, and the training bytes per epoch (seed mean)."""
    out = []
    for bits in sorted({r["bits"] for r in rows}, reverse=True):
        mine = [r for r in rows if r["bits"] == bits]
        out.append({"bits": bits, "seeds": len(mine), "test_auroc": statistics.mean(r["test_auroc"] for r in mine),
                    "test_hits@50": statistics.mean(r["test_hits@50"] for r in mine),
                    "bytes_per_epoch": statistics.mean(sum(r["bytes_per_epoch"].values()) for r in mine)})  # fmt: skip
    return out


def page_section(result: dict) -> str:
    lines = ["| bits | seeds | test ROC-AUC | test Hits@50 | training bytes / epoch (all ranks) |", "|---|---|---|---|---|"]
    for row in result["summary"]:
        lines.append(f"| {row['bits']} | {row['seeds']} | {row['test_auroc']:.4f} | {row['test_hits@50']:.4f} | "
                     f"{row['bytes_per_epoch'] / 1e6:.2f} MB |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd")
    r = sub.add_parser("rank")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--runs", nargs="+", required=True)
    r.add_argument("--epochs", type=int, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULT)
    p.add_argument("--page", type=Path, default=None, help="write the figures into this docs page (its markers)")
    a = p.parse_args(argv)
    if a.cmd == "rank":
        rank_main(a.out, a.runs, a.epochs)
        return 0
    from benchmarks.launch import check, run_workers
    from benchmarks.shared import find_shared

    datasets = find_shared("datasets", override="LIGHTNING_HALO_DATASETS")
    if datasets is None or not (datasets / "heco" / "dblp").is_dir():
        print("the shared datasets (heco/dblp) are not on this machine", file=sys.stderr)
        return 2
    runs = [f"{bits}:{seed}" for seed in a.seeds for bits in (32, 1)]
    with tempfile.TemporaryDirectory(prefix="halo-hetero-link-") as tmp:
        work = Path(tmp)
        env = {"PYTHONPATH": str(ROOT), "HECO": str(datasets / "heco"), "LIGHTNING_HALO_CACHE": str(work / "cache")}
        args = [str(Path(__file__).resolve()), "rank", "--out", str(work), "--epochs", str(a.epochs), "--runs", *runs]
        check(run_workers(args, a.devices, timeout=7200, env=env))
        rows = [json.loads((work / f"{run.replace(':', '_')}.json").read_text()) for run in runs]
    result = {"devices": a.devices, "epochs": a.epochs, "edge_type": list(EDGE), "runs": rows, "summary": summarise(rows)}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    print(f"written to {a.out}")
    if a.page is not None:
        from benchmarks.pages import write_section

        write_section(a.page, SECTION, page_section(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
