"""Link prediction on one edge type of a heterogeneous graph: the graph, a plain PyG model, the single-process
reference and the worker runs."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import HeteroData
from torchmetrics.classification import BinaryAUROC

from lightning_halo.link import gather_rows, link_split, negative_sampling
from lightning_halo.loss import global_mean
from lightning_halo.models.hetero_classifier import needed_relations
from lightning_halo.partition.hetero import local_features
from tests.support.hetero import generated_hetero
from tests.support.launch import check, run_workers

EDGE, REV = ("author", "writes", "paper"), ("paper", "rev_writes", "author")
#: The split of the workers and the reference (RandomLinkSplit's positives for the seed).
SPLIT = dict(num_val=0.1, num_test=0.1, neg_ratio=1.0, seed=2)
HIDDEN, LR, MODEL_SEED = 8, 0.02, 0


def link_graph() -> HeteroData:
    """The generated heterogeneous graph without labels (the data module adds placeholders), with venue -> paper
    edges so that the featureless venue type feeds the encoder (its embedding looked up by ``n_id``)."""
    g = generated_hetero()
    for key in ("y", "train_mask", "val_mask", "test_mask"):
        del g["paper"][key]
    g["venue", "rev_in", "paper"].edge_index = g["paper", "in", "venue"].edge_index.flip(0)
    return g


class HeteroLinkModel(L.LightningModule):
    """Plain PyG: per node type a projection (an embedding by ``n_id`` for a featureless type), two ``HeteroConv``
    layers of ``SAGEConv`` over the relations that reach the predicted edge type's two node types, a dot
    decoder over :func:`~lightning_halo.gather_rows` of both endpoints. The same code runs on one process on the
    whole graph (``gather_rows`` is then ``z[ids]``)."""

    def __init__(self, metadata, num_features: dict, num_nodes: dict, edge_type=EDGE, hidden: int = HIDDEN,
                 lr: float = LR) -> None:  # fmt: skip
        super().__init__()
        from torch_geometric.nn import HeteroConv, SAGEConv

        self.edge_type, self.lr = tuple(edge_type), lr
        edge_types = [tuple(e) for e in metadata[1]]
        ends = {self.edge_type[0], self.edge_type[2]}
        per_end = [needed_relations(edge_types, t, 2) for t in ends]
        layers = [sorted({e for rel in per_end for e in rel[i]}) for i in range(2)]
        read = {t for e in layers[0] for t in (e[0], e[2])}
        self.inputs = nn.ModuleDict({t: nn.Linear(num_features[t], hidden) if num_features[t]
                                     else nn.Embedding(num_nodes[t], hidden) for t in metadata[0] if t in read})  # fmt: skip
        self.convs = nn.ModuleList([HeteroConv({e: SAGEConv((hidden, hidden), hidden) for e in chosen}, aggr="sum")
                                    for chosen in layers])  # fmt: skip
        self.auroc = nn.ModuleDict({"val": BinaryAUROC(), "test": BinaryAUROC()})

    def encode(self, batch) -> dict:
        x = {}
        for t, module in self.inputs.items():
            store = batch[t]
            if isinstance(module, nn.Embedding):
                ids = store.n_id if "n_id" in store else torch.arange(store.num_nodes)
                x[t] = module(ids)
            else:
                x[t] = module(local_features(store))
        for i, conv in enumerate(self.convs):
            x = conv(x, batch.edge_index_dict)
            if i == 0:
                x = {t: v.relu() for t, v in x.items()}
        return x

    def score(self, batch) -> torch.Tensor:
        src, _, dst = self.edge_type
        z = self.encode(batch)
        index = batch[self.edge_type].edge_label_index
        u = gather_rows(z[src], index[0], node_type=src)
        v = gather_rows(z[dst], index[1], node_type=dst)
        return (u * v).sum(-1)

    def training_step(self, batch, _):
        store = batch[self.edge_type]
        logits = self.score(batch)
        per_pair = F.binary_cross_entropy_with_logits(logits, store.edge_label.to(logits.dtype), reduction="none")
        return global_mean(per_pair)

    def _evaluate(self, batch, stage: str) -> None:
        store = batch[self.edge_type]
        self.auroc[stage](self.score(batch), store.edge_label.long())
        self.log(f"{stage}_auroc", self.auroc[stage], batch_size=1)

    def validation_step(self, batch, _):
        self._evaluate(batch, "val")

    def test_step(self, batch, _):
        self._evaluate(batch, "test")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def build_model(data: HeteroData, kind: str = "plain") -> L.LightningModule:
    """``plain``: :class:`HeteroLinkModel`; ``zoo``: the zoo's HeteroLinkPredictor (GATConv per relation, an MLP
    decoder). float64, seeded."""
    from lightning_halo.models import HeteroLinkPredictor

    torch.manual_seed(MODEL_SEED)
    num_features = {t: int(data[t].x.size(1)) if "x" in data[t] else 0 for t in data.node_types}
    num_nodes = {t: int(data[t].num_nodes) for t in data.node_types}
    if kind == "zoo":
        return HeteroLinkPredictor(data.metadata(), num_features, num_nodes, EDGE, hidden_channels=HIDDEN, conv="gat",
                                   decoder="mlp", lr=LR, hits_k=10).double()  # fmt: skip
    return HeteroLinkModel(data.metadata(), num_features, num_nodes).double()


def stage_graph(data: HeteroData, edges: torch.Tensor, pairs: torch.Tensor) -> HeteroData:
    """What RandomLinkSplit's stage data holds: EDGE's message-passing edges, REV their reverse, the pairs."""
    out = data.clone()
    out[EDGE].edge_index, out[REV].edge_index = edges, edges.flip(0)
    out[EDGE].edge_label_index = pairs
    return out


def reference(epochs: int, kind: str = "plain") -> dict:
    """Plain single-process PyG: the same split and negatives, Adam on the whole graph; then val/test ROC-AUC."""
    data = link_graph()
    sizes = (int(data["author"].num_nodes), int(data["paper"].num_nodes))
    split = link_split(data[EDGE].edge_index, sizes, **SPLIT)
    model = build_model(data, kind)
    opt = model.configure_optimizers()
    losses = []
    for epoch in range(epochs):
        neg = negative_sampling(split.edge_index, sizes, split.train_pos.size(1), seed=SPLIT["seed"], epoch=epoch)
        index = torch.cat([split.train_pos, neg], 1)
        label = torch.cat([torch.ones(split.train_pos.size(1)), torch.zeros(neg.size(1))]).double()
        loss = F.binary_cross_entropy_with_logits(model.score(stage_graph(data, split.edge_index, index)), label)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    out = {"params": {k: p.detach().clone() for k, p in model.named_parameters()}, "losses": losses, "split": split}
    with torch.no_grad():
        for stage, edges in (("val", split.edge_index), ("test", split.test_edge_index)):
            index, label = split.labelled(stage)
            out[f"{stage}_auroc"] = float(BinaryAUROC()(model.score(stage_graph(data, edges, index)), label.long()))
    return out


def run_hetero_link_workers(world_size: int, out: Path, epochs: int, kind: str = "plain", bits: int = 32) -> list[dict]:
    """Run tests/workers/hetero_link_worker.py; the records of every rank."""
    check(run_workers(["tests/workers/hetero_link_worker.py", "--out", str(out), "--epochs", str(epochs),
                       "--model", kind, "--bits", str(bits)], world_size, timeout=600))  # fmt: skip
    return [torch.load(out / f"rank{r}.pt") for r in range(world_size)]
