"""What staleness costs in accuracy at a fixed epoch count: every halo mode, several seeds, same epochs.

    # 100 epochs of each method on 2 local processes, 3 seeds (accuracy does not depend on the link)
    python -m benchmarks.staleness run --graphs tolokers cornell5 --models gcn --epochs 100 --seeds 0 1 2
    # the generated section of docs/modes.md
    python -m benchmarks.staleness report

A method is ``<bits>:<mode>[:<option>]``: ``32:sync``, ``1:sync``, ``1:pipelined``,
``1:pipelined:5`` (``sync_every=5``), ``1:adaptive`` (the default threshold) or
``1:adaptive:0.2`` (``drift_threshold=0.2``) or ``1:adaptive:0.1:0`` (also ``wait_threshold=0``). Each run records the final validation and test
score (ROC-AUC on binary graphs, accuracy otherwise) and, for adaptive runs, how many layer
decisions were stale. Results: ``benchmarks/results/staleness/runs.jsonl`` (one line per run;
a rerun of the same cell replaces its line).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L

from benchmarks.harness import RESULTS, ROOT
from benchmarks.pages import write_section

OUT = RESULTS / "staleness"
DEFAULT_METHODS = ("32:sync", "1:sync", "1:pipelined", "1:pipelined:5", "1:adaptive")


def schedule_kwargs(method: str) -> tuple[int, dict[str, Any]]:
    """``"1:adaptive:0.2"`` -> ``(1, {"mode": "adaptive", "drift_threshold": 0.2})``; ``"1:adaptive:0.1:0"`` also sets
    ``wait_threshold=0``."""
    bits, mode, *option = method.split(":")
    kwargs: dict[str, Any] = {"mode": mode}
    if option and mode == "pipelined":
        kwargs["sync_every"] = int(option[0])
    elif option and mode == "adaptive":
        kwargs["drift_threshold"] = float(option[0])
        if len(option) > 1:
            kwargs["wait_threshold"] = float(option[1])
    elif option:
        raise ValueError(f"method {method!r}: only pipelined (sync_every) and adaptive (drift_threshold) take an option")
    return int(bits), kwargs


def worker(a: argparse.Namespace) -> None:
    """One rank of one run (launched by :func:`run`)."""
    import torch

    from benchmarks.bench_cell import bench_model
    from benchmarks.graphs import graph_source
    from lightning_halo import HaloDataModule, HaloQuantStrategy, HaloSchedule

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    L.seed_everything(a.seed)
    bits, kwargs = schedule_kwargs(a.method)
    dm = HaloDataModule(graph_source(a.graph), cache_dir=a.cache_dir)
    model = bench_model(a.model, in_channels=dm.num_features, out_channels=dm.num_classes, hidden_channels=a.hidden,
                        num_layers=a.layers, lr=a.lr, dropout=0.5)  # fmt: skip
    decisions = Decisions()
    trainer = L.Trainer(
        strategy=HaloQuantStrategy(bits=bits, seed=a.seed), accelerator="cpu", devices=int(os.environ["WORLD_SIZE"]),
        max_epochs=a.epochs, check_val_every_n_epoch=a.epochs, num_sanity_val_steps=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[HaloSchedule(**kwargs), decisions],
    )  # fmt: skip
    t0 = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    if trainer.global_rank == 0:
        scores = {k[2:]: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("b_")}
        line = {"graph": a.graph, "model": a.model, "layers": a.layers, "epochs": a.epochs, "method": a.method,
                "seed": a.seed, "stale": decisions.stale, "decisions": decisions.total, "wall_s": time.perf_counter() - t0,
                **scores, "when": time.strftime("%Y-%m-%d %H:%M:%S")}  # fmt: skip
        Path(a.out).write_text(json.dumps(line))


class Decisions(L.Callback):
    """Counts an adaptive run's stale and total layer decisions."""

    def __init__(self) -> None:
        self.stale = self.total = 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.strategy.exchanger.mode == "adaptive":  # type: ignore[attr-defined]
            chosen = [d for d, _ in trainer.strategy.halo_decisions().values()]  # type: ignore[attr-defined]
            self.stale += chosen.count("pipelined")
            self.total += len(chosen)


def run(a: argparse.Namespace) -> None:
    from benchmarks.launch import check, run_workers

    OUT.mkdir(parents=True, exist_ok=True)
    cache = os.environ.get("LIGHTNING_HALO_CACHE", str(RESULTS / "tmp" / "cache"))
    for seed in a.seeds:  # seed-major: a drift of the machine's load spreads over every method alike
        for graph in a.graphs:
            for model in a.models:
                for method in a.methods:
                    if not a.force and _done((graph, model, a.layers, a.epochs, method, seed)):
                        continue
                    out = OUT / f".{graph}-{model}-{method.replace(':', '_')}-s{seed}.json"
                    args = ["-m", "benchmarks.staleness", "worker", "--graph", graph, "--model", model, "--method", method,
                            "--seed", str(seed), "--epochs", str(a.epochs), "--layers", str(a.layers), "--hidden",
                            str(a.hidden), "--lr", str(a.lr), "--cache-dir", cache, "--out", str(out)]  # fmt: skip
                    check(run_workers(args, a.ranks, timeout=3600, env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}))
                    line = json.loads(out.read_text())
                    out.unlink()
                    _append(line)
                    score = line.get("test_auroc", line.get("test_acc"))
                    print(f"{graph} {model} {method} seed {seed}: test {score:.4f}, stale {line['stale']}/{line['decisions']}",
                          flush=True)  # fmt: skip


def _done(key: tuple) -> bool:
    path = OUT / "runs.jsonl"
    return path.is_file() and any(_key(json.loads(x)) == key for x in path.read_text().splitlines())


def _key(r: dict[str, Any]) -> tuple:
    return (r["graph"], r["model"], r["layers"], r["epochs"], r["method"], r["seed"])


def _append(line: dict[str, Any]) -> None:
    path = OUT / "runs.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    rows = [r for r in rows if _key(r) != _key(line)] + [line]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def score(r: dict[str, Any]) -> float:
    """The test score: ROC-AUC on binary graphs, else accuracy (what docs/benchmarks.md reports)."""
    return r["test_auroc"] if "test_auroc" in r else r["test_acc"]


def render() -> str:
    path = OUT / "runs.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    if not rows:
        return "_No runs yet: `python -m benchmarks.staleness run`._\n"
    groups: dict[tuple, dict[str, list[dict[str, Any]]]] = {}
    for r in rows:
        groups.setdefault((r["graph"], r["model"], r["layers"], r["epochs"]), {}).setdefault(r["method"], []).append(r)
    lines = [
        "Generated by `python -m benchmarks.staleness` from `benchmarks/results/staleness/runs.jsonl`: 2 processes,",
        "hidden 256, dropout 0.5, Adam lr 0.01; the test score after the last epoch (ROC-AUC on Tolokers, accuracy",
        "otherwise), mean ± standard deviation over the seeds, and the difference to 32-bit sync in points.",
        "",
        "| graph | model | epochs | method | seeds | test score | vs 32-bit sync | stale layer-epochs |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for (graph, model, layers, epochs), methods in sorted(groups.items()):
        ref = methods.get("32:sync")
        ref_mean = statistics.fmean(map(score, ref)) if ref else float("nan")
        for method, rs in sorted(methods.items(), key=lambda kv: _order(kv[0])):
            values = [score(r) for r in rs]
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            mean = statistics.fmean(values)
            stale = sum(r["stale"] for r in rs), sum(r["decisions"] for r in rs)
            share = f"{100 * stale[0] / stale[1]:.0f} %" if stale[1] else "–"
            lines.append(f"| {graph} | {model} ({layers} layers) | {epochs} | `{method}` | {len(rs)} | {mean:.4f} ± {sd:.4f} | "
                         f"{100 * (mean - ref_mean):+.2f} | {share} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _order(method: str) -> tuple:
    bits, mode, *opt = method.split(":")
    return (-int(bits), ["sync", "pipelined", "periodic", "adaptive"].index(mode), opt)


def write_report(page: Path) -> None:
    write_section(page, "staleness", render() + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="every method x seed, local processes")
    r.add_argument("--graphs", nargs="+", default=["tolokers", "cornell5"])
    r.add_argument("--models", nargs="+", default=["gcn"])
    r.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS))
    r.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    r.add_argument("--ranks", type=int, default=2)
    r.add_argument("--force", action="store_true", help="rerun runs that already have a result")
    w = sub.add_parser("worker", help="one rank of one run (internal)")
    for p in (r, w):
        p.add_argument("--epochs", type=int, default=100)
        p.add_argument("--layers", type=int, default=2)
        p.add_argument("--hidden", type=int, default=256)
        p.add_argument("--lr", type=float, default=0.01)
    for name in ("graph", "model", "method", "cache-dir", "out"):
        w.add_argument(f"--{name}", required=True)
    w.add_argument("--seed", type=int, required=True)
    rep = sub.add_parser("report", help="the generated section of docs/modes.md")
    rep.add_argument("--page", default=str(ROOT / "docs" / "modes.md"))
    a = parser.parse_args()
    if a.cmd == "run":
        run(a)
    elif a.cmd == "worker":
        worker(a)
    else:
        write_report(Path(a.page))


if __name__ == "__main__":
    sys.exit(main())
