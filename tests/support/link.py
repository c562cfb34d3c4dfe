"""Link-prediction parity: graphs, the model, the single-process PyG reference, and the worker runs."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torchmetrics.classification import BinaryAUROC

from lightning_halo.data.datasets import load_bundled
from lightning_halo.link import link_split, negative_sampling
from lightning_halo.link.metrics import HitsAtK
from tests.support.launch import check, run_workers

#: Options shared by the workers and the reference (the split, the model, the optimiser).
SPLIT = dict(num_val=0.1, num_test=0.1, neg_ratio=1.0, seed=3)
MODEL = dict(hidden_channels=16, out_channels=16, num_layers=2, lr=0.01, hits_k=20)
MODEL_SEED = 0


def link_graph(name: str) -> Data:
    """``cora`` / ``cora32`` (bundled) or ``actor`` / ``actor32`` (../shared/datasets)."""
    base, dtype = (name[:-2], torch.float32) if name.endswith("32") else (name, torch.float64)
    if base == "cora":
        data = load_bundled("cora")
    elif base == "actor":
        from lightning_halo.data.sources import load_graph
        from tests.support.cli import shared_datasets

        root = shared_datasets()
        assert root is not None, "../shared/datasets is not on this machine"
        data = load_graph(f"pyg:Actor:{root / 'Actor'}")
    else:
        raise KeyError(name)
    data.x = data.x.to(dtype)
    return data


def build_model(in_channels: int, dtype: torch.dtype, encoder: str = "gcn", decoder: str = "dot"):
    from lightning_halo.models import LinkPredictor

    torch.manual_seed(MODEL_SEED)
    return LinkPredictor(in_channels, encoder=encoder, decoder=decoder, **MODEL).to(dtype)


def reference(name: str, epochs: int, encoder: str = "gcn", decoder: str = "dot") -> dict:
    """Plain single-process PyG: the same split, the same negatives each epoch, Adam; then val/test metrics
    (validation passes messages over the training edges, test over training + validation edges)."""
    data = link_graph(name)
    n = data.num_nodes
    split = link_split(data.edge_index, n, **SPLIT)
    model = build_model(data.num_features, data.x.dtype, encoder, decoder)
    opt = model.configure_optimizers()
    losses = []
    for epoch in range(epochs):
        neg = negative_sampling(split.edge_index, n, split.train_pos.size(1), seed=SPLIT["seed"], epoch=epoch)
        index = torch.cat([split.train_pos, neg], 1)
        label = torch.cat([torch.ones(split.train_pos.size(1)), torch.zeros(neg.size(1))]).to(data.x.dtype)
        z = model(data.x, split.edge_index)
        loss = F.binary_cross_entropy_with_logits(model.decode(z[index[0]], z[index[1]]), label)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    out = {"params": {k: p.detach().clone() for k, p in model.named_parameters()}, "losses": losses}
    with torch.no_grad():
        for stage, edges in (("val", split.edge_index), ("test", split.test_edge_index)):  # RandomLinkSplit's graphs
            z = model(data.x, edges)
            index, label = split.labelled(stage)
            logits = model.decode(z[index[0]], z[index[1]])
            out[f"{stage}_auroc"] = float(BinaryAUROC()(logits, label.long()))
            hits = HitsAtK(MODEL["hits_k"])
            hits.update(logits, label.long())
            out[f"{stage}_hits"] = float(hits.compute())
    return out


def run_link_workers(configs: list[str], world_size: int, out: Path, extra: list[str] | None = None) -> list[dict]:
    """Run tests/workers/link_worker.py; returns, per config, the records of every rank."""
    check(run_workers(["tests/workers/link_worker.py", "--out", str(out), "--configs", *configs, *(extra or [])],
                      world_size, timeout=900))  # fmt: skip
    return [[torch.load(out / c.replace(":", "_") / f"rank{r}.pt") for r in range(world_size)] for c in configs]
