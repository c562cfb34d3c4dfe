"""What 1-bit halos cost heterogeneous models: test accuracy against 32 bits on HeCo's DBLP and ACM, 2 processes.

    python -m benchmarks.hetero_accuracy --page docs/heterogeneous.md   # about 33 minutes on 2 cores
    python -m benchmarks.hetero_accuracy --epochs 20 --seeds 0 --datasets dblp   # a quick look
    python -m benchmarks.hetero_accuracy --convs han --merge --page docs/heterogeneous.md   # one model more
    python -m benchmarks.hetero_accuracy --plain --convs hgt hgt+layer   # one process, plain PyG

For each dataset (``heco/dblp``: authors in 4 classes; ``heco/acm``: papers in 3; the 20-per-class
splits), model (``HeteroNodeClassifier`` with ``conv="sage"``, ``"hgt"``, ``"hgt"`` with ``norm="layer"``
(``hgt+layer``) and ``"han"``, 64 hidden, 2 layers)
and seed, one run per bit width (32 and 1, sync) on 2 local gloo processes: ``--epochs`` epochs of
Adam, then the test accuracy of the weights with the best validation accuracy (checked every
epoch). Writes ``benchmarks/results/hetero_accuracy.json``: every run's figures and the training
halo bytes per epoch by layer and source type, and per dataset and model the mean over seeds of
1-bit minus 32-bit test accuracy (the target of issue 38: at most 0.5 points below).

``--plain`` trains the same models in one process on the whole graph with a plain PyTorch loop (no Lightning,
no lightning-halo; the same recipe), to tell a model's own instability from the partitions': writes
``benchmarks/results/hetero_accuracy_plain.json`` with the validation accuracy of every epoch.
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
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "hetero_accuracy.json"


def run_name(dataset: str, config: str) -> str:
    """A run's file and checkpoint name: the dataset is in it, so one work dir holds every dataset's runs."""
    return f"{dataset}_{config.replace(':', '_')}"


def rank_main(out: Path, dataset: str, configs: list[str], epochs: int, lr: float = 0.01, dropout: float = 0.5) -> None:
    """One rank: every ``<conv>:<bits>:<seed>`` config on ``dataset``, one after the other."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from examples.hetero_dblp import heco_graph
    from lightning_halo import HaloDataModule, HaloQuantStrategy
    from lightning_halo.models import HeteroNodeClassifier

    warnings.filterwarnings("ignore")
    world_size = int(os.environ["WORLD_SIZE"])  # read once: a finished Trainer's teardown removes it
    graph = heco_graph(Path(os.environ["HECO"]) / dataset)
    for config in configs:
        spec, bits, seed = config.split(":")
        conv, norm = model_spec(spec)
        L.seed_everything(int(seed), verbose=False)
        dm = HaloDataModule(graph, cache_dir=os.environ.get("LIGHTNING_HALO_CACHE"))
        model = HeteroNodeClassifier(dm.num_classes, dm.metadata, dm.num_features, dm.num_nodes, dm.labelled_type,
                                     hidden_channels=64, conv=conv, lr=lr, dropout=dropout, norm=norm)  # type: ignore[arg-type]  # fmt: skip
        best = ModelCheckpoint(dirpath=out / "ckpt" / run_name(dataset, config), monitor="val_acc", mode="max")
        strategy = HaloQuantStrategy(bits=int(bits), seed=int(seed), find_unused_parameters=conv in ("hgt", "han"))
        trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=world_size,
                            max_epochs=epochs, num_sanity_val_steps=0, enable_progress_bar=False,
                            enable_model_summary=False, logger=False, callbacks=[best])  # fmt: skip
        trainer.fit(model, datamodule=dm)
        per_epoch = {f"{layer}/{kind}": total / epochs for (layer, kind), total in strategy.traffic.total.items()
                     if kind in ("fwd", "bwd")}  # fmt: skip
        test = trainer.test(model, datamodule=dm, ckpt_path=best.best_model_path, verbose=False)[0]
        if trainer.global_rank == 0:
            row = {"dataset": dataset, "model": spec, "conv": conv, "norm": norm, "bits": int(bits), "seed": int(seed),
                   "epochs": epochs, "lr": lr, "dropout": dropout,
                   "best_val_acc": float(best.best_model_score), "test_acc": float(test["test_acc"]),
                   "bytes_per_epoch": per_epoch}  # fmt: skip
            (out / f"{run_name(dataset, config)}.json").write_text(json.dumps(row))


def model_spec(spec: str) -> tuple[str, Optional[str]]:
    """``"hgt"`` or ``"hgt+layer"`` as ``HeteroNodeClassifier``'s ``(conv, norm)``.

    Example:
        >>> model_spec("hgt+layer"), model_spec("sage")
        (('hgt', 'layer'), ('sage', None))
    """
    conv, _, norm = spec.partition("+")
    return conv, norm or None


def model_of(row: dict) -> str:
    """A run's model label (runs stored before ``norm`` existed name their conv only)."""
    return row.get("model", row["conv"])


def plain_run(graph: Any, spec: str, seed: int, epochs: int, lr: float, dropout: float) -> dict:
    """One model trained on the whole graph in this process, as PyG's examples train: full-batch Adam steps on the
    labelled type's train nodes, validation accuracy after every step; the test accuracy at the best one."""
    import torch
    import torch.nn.functional as F

    from lightning_halo.models import HeteroNodeClassifier

    conv, norm = model_spec(spec)
    target = next(t for t in graph.node_types if "y" in graph[t])
    store = graph[target]
    torch.manual_seed(seed)
    model = HeteroNodeClassifier(int(store.y.max()) + 1, graph.metadata(),
                                 {t: int(graph[t].x.size(1)) if "x" in graph[t] else 0 for t in graph.node_types},
                                 {t: int(graph[t].num_nodes) for t in graph.node_types}, target, hidden_channels=64,
                                 conv=conv, lr=lr, dropout=dropout, norm=norm)  # type: ignore[arg-type]  # fmt: skip
    opt = model.configure_optimizers()
    val, best = [], (-1.0, float("nan"), -1)
    for epoch in range(epochs):
        model.train()
        opt.zero_grad()
        F.cross_entropy(model(graph)[store.train_mask], store.y[store.train_mask]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            pred = model(graph).argmax(-1)
        acc = {s: float((pred[store[f"{s}_mask"]] == store.y[store[f"{s}_mask"]]).float().mean()) for s in ("val", "test")}
        val.append(round(acc["val"], 4))
        if acc["val"] > best[0]:
            best = (acc["val"], acc["test"], epoch)
    return {"model": spec, "seed": seed, "epochs": epochs, "best_val_acc": best[0], "test_acc": best[1],
            "best_epoch": best[2], "val_acc_per_epoch": val}  # fmt: skip


def summarise(rows: list[dict]) -> list[dict]:
    """Per dataset and model: mean test accuracy per bit width over seeds, and 1-bit minus 32-bit."""
    out = []
    for dataset in sorted({r["dataset"] for r in rows}):
        for conv in sorted({model_of(r) for r in rows if r["dataset"] == dataset}):
            acc = {b: [r["test_acc"] for r in rows if (r["dataset"], model_of(r), r["bits"]) == (dataset, conv, b)]
                   for b in (32, 1)}  # fmt: skip
            if not acc[32] or not acc[1]:
                continue
            m32, m1 = statistics.mean(acc[32]), statistics.mean(acc[1])
            out.append({"dataset": dataset, "conv": conv, "seeds": len(acc[1]), "test_acc_32": m32, "test_acc_1": m1,
                        "one_bit_minus_32_pp": 100 * (m1 - m32), "within_0.5pp": 100 * (m1 - m32) >= -0.5})  # fmt: skip
    return out


def page_section(result: dict) -> str:
    """The Markdown the docs show: accuracy per dataset and model, and training halo bytes per epoch by layer and type."""
    lines = ["| dataset | model | seeds | test acc. 32-bit | test acc. 1-bit | 1-bit - 32-bit |", "|---|---|---|---|---|---|"]
    for row in result["summary"]:
        lines.append(f"| {row['dataset']} | {row['conv']} | {row['seeds']} | {100 * row['test_acc_32']:.2f} | "
                     f"{100 * row['test_acc_1']:.2f} | {row['one_bit_minus_32_pp']:+.2f} pp |")  # fmt: skip
    lines += ["", "Training halo bytes per epoch, all ranks, by layer and source type (seed 0):", "",
              "| dataset | model | bits | layer[type]/direction | bytes per epoch |", "|---|---|---|---|---|"]  # fmt: skip
    shown = set()
    for run in result["runs"]:
        if run["seed"] != result["runs"][0]["seed"] or (run["dataset"], run["conv"], run["bits"]) in shown:
            continue  # a norm after the layers moves the same rows: one conv's bytes once
        shown.add((run["dataset"], run["conv"], run["bits"]))
        for key, value in sorted(run["bytes_per_epoch"].items()):
            lines.append(f"| {run['dataset']} | {model_of(run)} | {run['bits']} | `{key}` | {value:,.0f} |")
    return "\n".join(lines)


def write_page(page: Path, result: dict) -> None:
    """Put :func:`page_section` into the page's ``hetero-accuracy`` section."""
    from benchmarks.pages import write_section

    write_section(page, "hetero-accuracy", page_section(result))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd")
    r = sub.add_parser("rank")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--dataset", required=True)
    r.add_argument("--configs", nargs="+", required=True)
    r.add_argument("--epochs", type=int, required=True)
    r.add_argument("--lr", type=float, required=True)
    r.add_argument("--dropout", type=float, required=True)
    p.add_argument("--datasets", nargs="+", default=["dblp", "acm"])
    p.add_argument("--convs", nargs="+", default=["sage", "hgt", "hgt+layer", "han"],
                   help="models: a conv, or conv+norm for HeteroNodeClassifier(norm=...) (hgt+layer: HGT with LayerNorm)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.01, help="Adam's learning rate (HeteroNodeClassifier's default)")
    p.add_argument("--dropout", type=float, default=0.5, help="dropout between layers (HeteroNodeClassifier's default)")
    p.add_argument("--out", type=Path, default=RESULT)
    p.add_argument("--page", type=Path, default=None, help="write the figures into this docs page (its markers)")
    p.add_argument("--plain", action="store_true", help="one process, the whole graph, plain PyTorch: the models' own "
                   "spread, to hetero_accuracy_plain.json")
    p.add_argument("--report", action="store_true", help="only write --page from the stored --out")
    p.add_argument("--merge", action="store_true", help="keep the stored --out's runs of other datasets, models and seeds")
    a = p.parse_args(argv)
    if a.report:
        write_page(a.page, json.loads(a.out.read_text()))
        return 0
    if a.cmd == "rank":
        rank_main(a.out, a.dataset, a.configs, a.epochs, a.lr, a.dropout)
        return 0
    if a.plain:
        return plain_main(a)
    from benchmarks.launch import check, run_workers
    from benchmarks.shared import find_shared

    datasets = find_shared("datasets", override="LIGHTNING_HALO_DATASETS")
    if datasets is None or not (datasets / "heco").is_dir():
        print("the shared datasets (heco/dblp, heco/acm) are not on this machine", file=sys.stderr)
        return 2
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="halo-hetero-acc-") as tmp:
        work = Path(tmp)
        env = {"PYTHONPATH": str(ROOT), "HECO": str(datasets / "heco"), "LIGHTNING_HALO_CACHE": str(work / "cache")}
        for dataset in a.datasets:
            configs = [f"{conv}:{bits}:{seed}" for conv in a.convs for seed in a.seeds for bits in (32, 1)]
            args = [str(Path(__file__).resolve()), "rank", "--out", str(work), "--dataset", dataset,
                    "--epochs", str(a.epochs), "--lr", str(a.lr), "--dropout", str(a.dropout), "--configs", *configs]  # fmt: skip
            check(run_workers(args, a.devices, timeout=7200, env=env))
            rows += [json.loads((work / f"{run_name(dataset, c)}.json").read_text()) for c in configs]
            print(json.dumps(summarise([r for r in rows if r["dataset"] == dataset]), indent=1), flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    if a.merge and a.out.is_file():  # the runs this one did replace theirs, every other stored run stays
        ran = {(r["dataset"], model_of(r), r["bits"], r["seed"]) for r in rows}
        kept = [r for r in json.loads(a.out.read_text())["runs"] if (r["dataset"], model_of(r), r["bits"], r["seed"]) not in ran]
        rows = kept + rows
    result = {"devices": a.devices, "epochs": a.epochs, "runs": rows, "summary": summarise(rows)}
    a.out.write_text(json.dumps(result, indent=1))
    print(f"written to {a.out}")
    if a.page is not None:
        write_page(a.page, result)
    return 0


def plain_main(a: argparse.Namespace) -> int:
    """``--plain``: every dataset, model and seed in this process; the figures to ``hetero_accuracy_plain.json``."""
    import statistics

    import torch

    from benchmarks.shared import find_shared
    from examples.hetero_dblp import heco_graph

    datasets = find_shared("datasets", override="LIGHTNING_HALO_DATASETS")
    if datasets is None or not (datasets / "heco").is_dir():
        print("the shared datasets (heco/dblp, heco/acm) are not on this machine", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # one core, as each of the benchmark's processes
    runs = []
    for dataset in a.datasets:
        graph = heco_graph(datasets / "heco" / dataset)
        for spec in a.convs:
            tests = []
            for seed in a.seeds:
                runs.append({"dataset": dataset, **plain_run(graph, spec, seed, a.epochs, a.lr, a.dropout)})
                tests.append(100 * runs[-1]["test_acc"])
            print(f"{dataset} {spec}: test at the best validation epoch {' / '.join(f'{t:.1f}' for t in tests)} % "
                  f"(mean {statistics.mean(tests):.2f}, spread {max(tests) - min(tests):.1f} points)", flush=True)  # fmt: skip
    out = RESULT.with_name("hetero_accuracy_plain.json")
    out.write_text(json.dumps({"epochs": a.epochs, "lr": a.lr, "dropout": a.dropout, "runs": runs}, indent=1))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
