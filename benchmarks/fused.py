r"""The fused aggregation against PyG's ``edge_index`` path, on one process, measured side by side.

    python -m benchmarks.fused --graph tolokers --hidden 256 --threads 1

Prints and writes ``benchmarks/results/fused/<graph>.json``:

* **one layer** (``GCNConv``/``SAGEConv``, ``hidden -> hidden``), forward + backward: an ordinary
  model's call on ``edge_index``; the same layer on a precomputed ``torch.sparse`` adjacency
  (torch's own backward); the layer under lightning-halo's hooks (fused CSR, cached transpose);
  the aggregation kernel alone (the bound);
* **epochs** of a 2-layer model: a plain PyTorch loop on ``edge_index`` and on a sparse
  adjacency, and Lightning with ``HaloQuantStrategy(bits=32)`` on one process with
  ``aggregation="auto"`` and ``"edge_index"``; plus the partition's kernel bound
  (:mod:`benchmarks.kernel_bound`) and compute / bound.

The layer variants run interleaved, round after round, and the medians count; the epoch
variants run one after the other, twice (the better pass counts). A loaded machine shifts all
of them alike: read the ratios.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from benchmarks.graphs import graph_source
from benchmarks.kernel_bound import kernel_bound

ROOT = Path(__file__).resolve().parents[1]


def _median_times(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    for fn in fns.values():
        fn()  # warm-up: allocations, caches, the fused path's CSR
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _partition(data: Any) -> Any:
    from lightning_halo.partition import build_halo_partitions

    return build_halo_partitions(data, torch.zeros(data.num_nodes, dtype=torch.long), 1)[0]


def one_layer(data: Any, layer: str, hidden: int, rounds: int) -> dict[str, float]:
    from torch_geometric.nn import GCNConv, SAGEConv
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    from lightning_halo import sparse_adjacency
    from lightning_halo.exchange import HaloExchanger
    from lightning_halo.layers.hooks import LayerContext, install_hooks
    from lightning_halo.layers.fused import FusedAdjacency

    part = _partition(data)
    x = torch.randn(data.num_nodes, hidden, requires_grad=True)
    conv = GCNConv(hidden, hidden) if layer == "gcn" else SAGEConv(hidden, hidden)
    if layer == "gcn":
        ei, w = gcn_norm(data.edge_index, None, data.num_nodes, add_self_loops=True)
        adj = torch.sparse_coo_tensor(ei.flip(0), w, (data.num_nodes,) * 2).coalesce().to_sparse_csr()
        plain = GCNConv(hidden, hidden, normalize=False)
        plain.load_state_dict(conv.state_dict())
        fused_kernel = FusedAdjacency.build(ei, w, data.num_nodes, data.num_nodes)
    else:
        adj = sparse_adjacency(data, reduce="mean")
        plain = conv
        fused_kernel = FusedAdjacency.build(data.edge_index, None, data.num_nodes, data.num_nodes, "mean")

    hooked = copy.deepcopy(conv)
    ex = HaloExchanger(None, bits=32)
    ctx = LayerContext(ex)
    holder = torch.nn.Module()
    holder.conv = hooked
    install_hooks(holder, ctx)
    ex.bind(part)
    ctx.bind(part)

    def step(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            fn().sum().backward()
            x.grad = None

        return run

    def hooked_step() -> torch.Tensor:
        ex.begin_step(True)
        return hooked(x, part.edge_index)

    reduce = "sum" if layer == "gcn" else "mean"
    return _median_times(
        {
            "edge_index (an ordinary model's call)": step(lambda: conv(x, data.edge_index)),
            "torch.sparse adjacency, torch's backward": step(lambda: plain(x, adj)),
            "lightning-halo fused (cached CSR + transpose)": step(hooked_step),
            "aggregation kernel alone, fwd + bwd": step(lambda: torch.sparse.mm(fused_kernel, x, reduce)),
        },
        rounds,
    )


def epochs(data: Any, model_name: str, hidden: int, n_epochs: int, source: Any) -> dict[str, Any]:
    """Per-epoch training time of a 2-layer zoo model: plain loops and the strategy on one process."""
    import lightning as L

    from lightning_halo import HaloDataModule, HaloQuantStrategy, sparse_adjacency
    from lightning_halo.models import GCN, GraphSAGE

    cls = {"gcn": GCN, "sage": GraphSAGE}[model_name]
    n_cls = int(data.y.max()) + 1
    kw = dict(in_channels=data.num_features, out_channels=n_cls, hidden_channels=hidden, dropout=0.5)
    out: dict[str, Any] = {}

    def plain_loop(sparse: bool) -> list[float]:
        torch.manual_seed(0)
        model = cls(**kw)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        edges = sparse_adjacency(data, reduce="mean" if model_name == "sage" else "sum") if sparse else data.edge_index
        times = []
        for _ in range(n_epochs):
            t0 = time.perf_counter()
            opt.zero_grad()
            logits = model(data.x, edges)
            F.cross_entropy(logits[data.train_mask], data.y[data.train_mask]).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
        return times

    class Timer(L.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_batch_start(self, *args: Any) -> None:
            self._t0 = time.perf_counter()

        def on_train_batch_end(self, *args: Any) -> None:
            self.times.append(time.perf_counter() - self._t0)

    def strategy_run(aggregation: str) -> tuple[list[float], dict]:
        torch.manual_seed(0)
        timer = Timer()
        trainer = L.Trainer(
            strategy=HaloQuantStrategy(bits=32, aggregation=aggregation, num_threads=torch.get_num_threads()),
            accelerator="cpu", devices=1, max_epochs=n_epochs, limit_val_batches=0, num_sanity_val_steps=0,
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, logger=False,
            callbacks=[timer],
        )  # fmt: skip
        dm = HaloDataModule(source)
        trainer.fit(cls(**kw), datamodule=dm)
        return timer.times, dict(trainer.strategy.layer_choices)

    warm = 2
    medians: dict[str, list[float]] = {}
    for _ in range(2):  # A B C D A B C D: a load change shifts both passes, the better one counts
        runs = {"plain loop, edge_index": plain_loop(False), "plain loop, sparse adjacency": plain_loop(True)}
        for agg in ("auto", "edge_index"):
            times, choices = strategy_run(agg)
            runs[f"HaloQuantStrategy(bits=32), 1 process, aggregation={agg!r}"] = times
            out[f"choices_{agg}"] = choices
        for k, v in runs.items():
            medians.setdefault(k, []).append(statistics.median(v[warm:]))
    out["epoch_s_passes"] = medians
    out["epoch_s"] = {k: min(v) for k, v in medians.items()}
    bound = kernel_bound(model_name, _partition(data), [data.num_features, hidden, n_cls])
    out["kernel_bound"] = {k: v for k, v in bound.items() if k != "kernels"}
    out["kernels"] = bound["kernels"]
    base = out["epoch_s"]["plain loop, edge_index"]
    out["speedup_vs_plain_edge_index"] = {k: base / v for k, v in out["epoch_s"].items()}
    auto = out["epoch_s"]["HaloQuantStrategy(bits=32), 1 process, aggregation='auto'"]
    out["compute_over_bound"] = auto / bound["bound_s"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="tolokers")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--models", nargs="+", default=["gcn", "sage"])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fused"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    from lightning_halo.data import load_graph

    source = graph_source(args.graph)
    data = load_graph(source)
    result: dict[str, Any] = {"graph": args.graph, "nodes": data.num_nodes, "edges": data.num_edges,
                              "features": data.num_features, "hidden": args.hidden, "threads": args.threads}  # fmt: skip
    for model in args.models:
        layer = one_layer(data, model, args.hidden, args.rounds)
        result[f"{model}_one_layer_s"] = layer
        print(f"\n{args.graph}: one {model.upper()} layer {args.hidden}->{args.hidden}, forward + backward, median s")
        base = layer["edge_index (an ordinary model's call)"]
        for k, v in layer.items():
            print(f"  {k:<48} {v:8.3f} s  ({base / v:5.1f}x vs edge_index)")
        ep = epochs(data, model, args.hidden, args.epochs, source)
        result[f"{model}_epochs"] = ep
        print(f"{args.graph}: 2-layer {model.upper()} (hidden {args.hidden}), median training epoch")
        for k, v in ep["epoch_s"].items():
            print(f"  {k:<64} {v:8.3f} s  ({ep['speedup_vs_plain_edge_index'][k]:5.2f}x)")
        b = ep["kernel_bound"]
        print(f"  kernel bound {b['bound_s']:.3f} s (SpMM {b['spmm_s']:.3f} s, dense {b['dense_s']:.3f} s); "
              f"compute / bound {ep['compute_over_bound']:.2f}")  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.graph}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
