"""Heterogeneous graphs for the tests: a generated one of every awkward kind, and HeCo's DBLP from the shared datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch_geometric.data import HeteroData

from benchmarks.shared import find_shared


def generated_hetero(seed: int = 0, papers: int = 300, authors: int = 200, venues: int = 7) -> HeteroData:
    """Papers (features, labels, masks), authors (features), venues (no features: ``num_nodes`` only);
    paper->paper citations (a relation within one type, with repeats and self-loops), author->paper,
    paper->venue, and a reverse type; an author with no edges."""
    g = torch.Generator().manual_seed(seed)
    data = HeteroData()
    data["paper"].x = torch.randn(papers, 6, generator=g, dtype=torch.float64)
    data["paper"].y = torch.randint(0, 3, (papers,), generator=g)
    perm = torch.randperm(papers, generator=g)
    for name, chunk in zip(("train_mask", "val_mask", "test_mask"), perm.chunk(3)):
        mask = torch.zeros(papers, dtype=torch.bool)
        mask[chunk] = True
        data["paper"][name] = mask
    data["author"].x = torch.randn(authors, 4, generator=g, dtype=torch.float64)
    data["venue"].num_nodes = venues
    cites = torch.randint(0, papers, (2, 4 * papers), generator=g)
    cites[:, :5] = torch.arange(5).repeat(2, 1)  # self-loops
    data["paper", "cites", "paper"].edge_index = torch.cat([cites, cites[:, :7]], dim=1)  # and repeats
    writes = torch.stack([torch.randint(0, authors - 1, (2 * papers,), generator=g),  # author authors-1: no edges
                          torch.randint(0, papers, (2 * papers,), generator=g)])  # fmt: skip
    data["author", "writes", "paper"].edge_index = writes
    data["paper", "rev_writes", "author"].edge_index = writes.flip(0)
    data["paper", "in", "venue"].edge_index = torch.stack([torch.arange(papers), torch.randint(0, venues, (papers,), generator=g)])
    return data


def with_leaf_relation(data: HeteroData, seed: int = 3) -> HeteroData:
    """``data`` with venue -> author edges: venue's first-layer rows then reach only the authors' second-layer
    rows, which the loss (on papers) does not read, so the first layer's weights for venue get their
    gradient only through the halo exchange's tie into the loss (as DBLP's terms do)."""
    g = torch.Generator().manual_seed(seed)
    n_venue, n_author = int(data["venue"].num_nodes), int(data["author"].num_nodes)
    data["venue", "hosts", "author"].edge_index = torch.stack(
        [torch.randint(0, n_venue, (n_author,), generator=g), torch.randint(0, n_author, (n_author,), generator=g)]
    )
    return data


def dblp(root: Path | None = None) -> HeteroData | None:
    """HeCo's DBLP (author 4,057 labelled in 4 classes; paper, term, conference) with reverse edge types, or
    ``None`` where the shared datasets are not on this machine. Splits: ``train_20``/``val_20``/``test_20``."""
    import scipy.sparse as sp

    base = root or find_shared("datasets", override="LIGHTNING_HALO_DATASETS")
    if base is None or not (Path(base) / "heco" / "dblp").is_dir():
        return None
    d = Path(base) / "heco" / "dblp"
    data = HeteroData()
    data["author"].x = torch.from_numpy(sp.load_npz(d / "a_feat.npz").toarray()).float()
    data["paper"].x = torch.from_numpy(sp.load_npz(d / "p_feat.npz").toarray()).float()
    data["term"].x = torch.from_numpy(np.load(d / "t_feat.npz")).float()
    data["conference"].num_nodes = 20
    labels = torch.from_numpy(np.load(d / "labels.npy")).long()
    data["author"].y = labels
    for split in ("train", "val", "test"):
        mask = torch.zeros(labels.numel(), dtype=torch.bool)
        mask[torch.from_numpy(np.load(d / f"{split}_20.npy")).long()] = True
        data["author"][f"{split}_mask"] = mask
    for name, (src, dst) in {"pa": ("paper", "author"), "pc": ("paper", "conference"), "pt": ("paper", "term")}.items():
        ei = torch.from_numpy(np.loadtxt(d / f"{name}.txt", dtype=np.int64).T)
        data[src, "to", dst].edge_index = ei
        data[dst, "rev_to", src].edge_index = ei.flip(0)
    return data


def hetero_loss(out: torch.Tensor, store, n_train: int) -> torch.Tensor:
    """Each rank's share of the mean cross entropy over the labelled type's train nodes of all ranks."""
    mask = store.train_mask
    return torch.nn.functional.cross_entropy(out[mask], store.y[mask], reduction="sum") / n_train


def hetero_reference(model, data: HeteroData, forward, target: str) -> dict:
    """Plain PyG on the whole graph: the target type's logits, the loss and every gradient."""
    import copy

    model = copy.deepcopy(model)
    out = forward(model, data)
    loss = hetero_loss(out, data[target], int(data[target].train_mask.sum()))
    loss.backward()
    return {"out": out.detach(), "loss": float(loss.detach()),
            "grad": {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None},
            "buffers": {k: b.clone() for k, b in model.named_buffers()}}  # fmt: skip


def run_threaded_hetero(model, data: HeteroData, world_size: int, forward, target: str, *, bits: int | str = 32,
                        partitioner: str = "metis", steps: int = 1, mode=lambda epoch: "sync",
                        options: Optional[dict] = None, drift_bound: Optional[float] = None,
                        halo_reduction: str = "cover") -> dict:  # fmt: skip
    """The ranks in threads (as tests.support.threaded.run_threaded), on heterogeneous partitions: the target
    type's logits in global order, the summed loss and gradients, each rank's traffic and slots. ``options``: more
    :class:`~lightning_halo.exchange.HaloExchanger` options; ``drift_bound``: the ``"adaptive"`` mode's threshold;
    ``halo_reduction``: the layers' option (``"cover"``: partial sums per relation where they apply).
    Each rank also returns the logits of every step (``outs``) and the adaptive decisions of the last one."""
    import copy

    from lightning_halo.exchange import HaloExchanger
    from lightning_halo.layers.hooks import LayerContext, install_batch_norms, install_hooks
    from lightning_halo.partition.hetero import assign_hetero_parts, build_hetero_partitions
    from lightning_halo.testing import ThreadGroup
    from tests.support.threaded import on_threads

    parts = build_hetero_partitions(data, assign_hetero_parts(data, world_size, partitioner=partitioner))
    group = ThreadGroup(world_size, timeout=60)
    n_train = int(data[target].train_mask.sum())

    def rank_main(r: int) -> dict:
        net = copy.deepcopy(model)
        ex = HaloExchanger(group.transport(r) if world_size > 1 else None, bits=bits, **(options or {}))
        ctx = LayerContext(ex, halo_reduction=halo_reduction)  # type: ignore[arg-type]
        hooks = [*install_hooks(net, ctx), *install_batch_norms(net, ctx)]  # as the strategy installs them
        part = parts[r]
        ex.bind(part)
        ctx.bind(part)
        outs = []
        for step in range(steps):
            ex.begin_step(True, epoch=step, mode=mode(step), drift_bound=drift_bound)
            net.zero_grad()
            out = forward(net, part)
            outs.append(out.detach())
            loss = ex.prepare_loss(hetero_loss(out, part[target], n_train))
            loss.backward()
        for h in hooks:
            h.remove()
        return {"out": out.detach(), "loss": float(loss.detach()), "ids": part[target].n_id[: part[target].n_inner],
                "grad": {k: p.grad.clone() for k, p in net.named_parameters() if p.grad is not None},
                "meter": dict(ex.meter.total), "slots": ex.slot_layers(), "choices": dict(ctx.choices),
                "widths": ex.widths() if ex.adaptive_bits else [], "noise": ex.width_noise() if ex.adaptive_bits else [],
                "reach": {k: ex.reach(k) for k in ex.plan_keys()}, "outs": outs, "decisions": ex.decisions(),
                "buffers": {k: b.clone() for k, b in net.named_buffers()}}  # fmt: skip

    results = on_threads(world_size, rank_main, 90)
    n = data[target].num_nodes
    out = torch.full((n, results[0]["out"].size(-1)), float("nan"), dtype=results[0]["out"].dtype)
    grad: dict[str, torch.Tensor] = {}
    for res in results:
        out[res["ids"]] = res["out"]
        for k, g in res["grad"].items():
            grad[k] = grad[k] + g if k in grad else g.clone()
    return {"out": out, "loss": sum(r["loss"] for r in results), "grad": grad, "ranks": results}


def hetero_model(conv: str, metadata, num_features, num_nodes, target: str, num_classes: int):
    """The zoo's HeteroNodeClassifier as the tests train it: float64, no dropout, seeded by the caller."""
    from lightning_halo.models.hetero_classifier import HeteroNodeClassifier

    return HeteroNodeClassifier(num_classes, metadata, num_features, num_nodes, target, hidden_channels=8,
                                conv=conv, heads=2, dropout=0.0, lr=0.02).double()  # fmt: skip


def train_reference(conv: str, data: HeteroData, epochs: int) -> dict:
    """Single-process PyG on the whole graph, as Lightning's loop runs it: Adam steps on the mean loss."""
    import lightning as L

    L.seed_everything(0, verbose=False)
    num_features = {t: int(data[t].x.size(1)) if "x" in data[t] else 0 for t in data.node_types}
    num_nodes = {t: int(data[t].num_nodes) for t in data.node_types}
    target = "paper"
    model = hetero_model(conv, data.metadata(), num_features, num_nodes, target, int(data[target].y.max()) + 1)
    opt = model.configure_optimizers()
    store = data[target]
    for _ in range(epochs):
        opt.zero_grad()
        out = model(data)
        torch.nn.functional.cross_entropy(out[store.train_mask], store.y[store.train_mask]).backward()
        opt.step()
    with torch.no_grad():
        model.eval()
        pred = model(data)
    return {"params": {k: v.detach().clone() for k, v in model.state_dict().items()}, "pred": pred}


def without_zero_extras(got: dict, ref: dict) -> dict:
    """``got`` without gradients the reference lacks, after checking they are zero: on partitions a layer whose
    output reaches the loss only through an exchange (tied in with weight 0, so backward reaches every peer)
    gets a zero gradient where PyG leaves None."""
    extra = set(got["grad"]) - set(ref["grad"])
    for name in extra:
        assert not got["grad"][name].any(), f"{name}: a gradient the whole graph does not have"
    return {**got, "grad": {k: v for k, v in got["grad"].items() if k not in extra}}


def lazy_model(metadata, num_nodes, target: str, num_classes: int):
    """A LightningModule as PyG's heterogeneous examples write it: ``to_hetero`` over lazy layers (``(-1, -1)``),
    an embedding for the types without features; float64. Its parameters take their shapes in the first forward."""
    import lightning as L
    from torch import nn
    from torch_geometric.nn import SAGEConv, to_hetero

    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2 = SAGEConv((-1, -1), 8), SAGEConv((-1, -1), num_classes)

        def forward(self, x, edge_index):
            return self.c2(self.c1(x, edge_index).relu(), edge_index)

    class Lazy(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.ModuleDict({t: nn.Embedding(n, 5) for t, n in num_nodes.items() if t == "venue"})
            self.net = to_hetero(Plain(), metadata, aggr="sum")

        def forward(self, batch):
            x = dict(batch.x_dict)
            for t, emb in self.emb.items():
                store = batch[t]
                x[t] = emb(store.n_id if "n_id" in store else torch.arange(store.num_nodes))
            return self.net(x, batch.edge_index_dict)[target]

        def training_step(self, batch, _):
            store = batch[target]
            return torch.nn.functional.cross_entropy(self(batch)[store.train_mask], store.y[store.train_mask])

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.02)

    return Lazy().double()
