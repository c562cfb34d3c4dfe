"""A ready node-classification LightningModule for heterogeneous graphs: ``to_hetero`` (SAGE, GAT), ``HGTConv`` or
``HANConv``."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Literal, Optional

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import HeteroConv
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

from lightning_halo.models.node_classifier import Norm, check_norm, row_norm
from lightning_halo.partition.hetero import local_features

HeteroConvKind = Literal["sage", "gat", "hgt", "han"]
#: How a node type without features starts: a learned row per node, or one learned row for the type.
Featureless = Literal["embedding", "type"]
EdgeType = tuple[str, str, str]


def needed_relations(edge_types: list[EdgeType], target: str | Sequence[str], layers: int) -> list[list[EdgeType]]:
    """Per layer, the edge types whose messages reach the output of ``target`` (one node type or several) (the
    others' weights would get no gradient, which DDP refuses): layer :math:`L` reads the relations into the
    targets, layer :math:`l` those into the types layer :math:`l+1` reads (its relations' sources and targets).

    Example:
        >>> needed_relations([("a", "to", "p"), ("p", "to", "a"), ("p", "to", "v")], "p", 2)
        [[('a', 'to', 'p'), ('p', 'to', 'a')], [('a', 'to', 'p')]]
        >>> needed_relations([("a", "to", "p"), ("p", "to", "a"), ("p", "to", "v")], ["a", "p"], 1)
        [[('a', 'to', 'p'), ('p', 'to', 'a')]]
    """
    per_layer: list[list[EdgeType]] = []
    wanted = {target} if isinstance(target, str) else set(target)
    for _ in range(layers):
        chosen = [e for e in edge_types if e[2] in wanted]
        per_layer.append(chosen)
        wanted = {t for e in chosen for t in (e[0], e[2])}  # what it reads: sources, and targets' own rows
    return per_layer[::-1]


def graph_given(graph: tuple, last: str, source: str) -> bool:
    """Whether a zoo model's graph arguments ``(metadata, num_features, num_nodes, <last>)`` are all given (build now)
    or none (build from the Trainer's data module at ``configure_model``); a few of them is an error."""
    if all(v is not None for v in graph):
        return True
    if any(v is not None for v in graph):
        raise ValueError(f"give metadata, num_features, num_nodes and {last} together ({source}), or none: then they "
                         "come from the Trainer's data module")  # fmt: skip
    return False


def check_hetero_options(conv: str, featureless: str, hidden_channels: int, heads: int,
                         kinds: tuple[str, ...] = ("sage", "gat", "hgt", "han")) -> None:  # fmt: skip
    """The zoo's heterogeneous encoder options, checked once for every model that builds one."""
    if featureless not in ("embedding", "type"):
        raise ValueError(f"featureless must be 'embedding' or 'type', got {featureless!r}")
    if conv not in kinds:
        raise ValueError(f"conv must be one of {list(kinds)}, got {conv!r}")
    if conv != "sage" and hidden_channels % heads:
        raise ValueError(f"hidden_channels={hidden_channels} must be a multiple of heads={heads}")


class RelationSum(HeteroConv):
    r"""PyG's :class:`~torch_geometric.nn.conv.HeteroConv` with ``aggr="sum"`` that adds each relation's output
    to its target type's sum as the relation runs.

    ``HeteroConv`` keeps every relation's output and then stacks them (``torch.stack(xs).sum(0)``): for
    :math:`R` relations into a type, :math:`2R + 1` blocks of ``[n_dst, hidden]`` at once, where a step on
    the MAG-shaped graph of docs/heterogeneous.md peaked (four relations into papers). Summed as they come,
    at most three. The same modules, parameters and state dict; the relations' outputs are added in order, so the sums
    agree with PyG's to float rounding (bitwise where its reduction adds in order too).

    Args:
        convs (dict): one layer per edge type, as for ``HeteroConv``.

    Shapes:
        - **input:** ``x_dict`` (node type to ``[n, F]``), ``edge_index_dict`` (edge type to ``[2, E]``)
        - **output:** target type to ``[n_dst, hidden]``, for the target types of the edge types given

    Example:
        >>> from torch_geometric.nn import SAGEConv
        >>> conv = RelationSum({("a", "to", "b"): SAGEConv((4, 4), 8), ("b", "to", "b"): SAGEConv(4, 8)})
        >>> x = {"a": torch.randn(3, 4), "b": torch.randn(2, 4)}
        >>> edges = {("a", "to", "b"): torch.tensor([[0, 2], [1, 1]]), ("b", "to", "b"): torch.tensor([[0], [1]])}
        >>> conv(x, edges)["b"].shape
        torch.Size([2, 8])
    """

    def __init__(self, convs: dict) -> None:
        super().__init__(convs, aggr="sum")

    def forward(self, x_dict: dict[str, Tensor], edge_index_dict: dict[Any, Tensor]) -> dict[str, Tensor]:  # type: ignore[override]
        out: dict[str, Tensor] = {}
        for edge_type, conv in self.convs.items():
            src, _, dst = edge_type
            if edge_type not in edge_index_dict:  # as HeteroConv: a relation without edges does not run
                continue
            x = x_dict[src] if src == dst and src in x_dict else (x_dict.get(src), x_dict.get(dst))
            y = conv(x, edge_index_dict[edge_type])
            out[dst] = y if dst not in out else out[dst] + y
        return out


def hetero_layers(metadata: tuple[list[str], list[EdgeType]], num_features: dict[str, int], num_nodes: dict[str, int],
                  targets: Sequence[str], *, hidden: int, num_layers: int, conv: str, heads: int,
                  featureless: str, norm: Optional[str] = None) -> tuple[nn.ModuleDict, nn.ModuleList, nn.ModuleList]:  # fmt: skip
    """The zoo's heterogeneous encoder: an input module per node type the first layer reads (a projection, or an
    embedding for a type without features), ``num_layers`` layers whose outputs reach ``targets``
    (:func:`needed_relations`; ``"hgt"`` and ``"han"`` update every type) and, with ``norm``, one normalisation per
    layer and type it outputs (:func:`~lightning_halo.models.node_classifier.row_norm`; the last layer's for
    ``targets`` only: the others' would get no gradient). Without ``norm`` the third list is empty."""
    node_types, edge_types = list(metadata[0]), [tuple(e) for e in metadata[1]]
    for t in targets:
        if t not in node_types:
            raise ValueError(f"{t!r} is not a node type of the graph ({node_types})")
    missing = [t for t in node_types if t not in num_features or t not in num_nodes]
    if missing:
        raise ValueError(f"num_features and num_nodes must name every node type; missing {missing}")
    every_type = conv in ("hgt", "han")  # one layer over all types
    layers = [edge_types] if every_type else needed_relations(edge_types, targets, num_layers)  # type: ignore[arg-type]
    read = set(node_types) if every_type else {t for e in layers[0] for t in (e[0], e[2])}
    inputs = nn.ModuleDict({
        t: nn.Linear(num_features[t], hidden) if num_features[t]
        else nn.Embedding(num_nodes[t] if featureless == "embedding" else 1, hidden)
        for t in node_types if t in read
    })  # fmt: skip
    from torch_geometric.nn import GATConv, HANConv, HGTConv, SAGEConv

    def relation() -> nn.Module:
        if conv == "sage":
            return SAGEConv((hidden, hidden), hidden)
        # a relation joins two node types: PyG's GATConv takes (x_src, x_dst) without self-loops
        return GATConv((hidden, hidden), hidden // heads, heads=heads, add_self_loops=False)

    norms = nn.ModuleList()
    if norm is not None:
        for i, chosen in enumerate(layers * num_layers if every_type else layers):
            outputs = {e[2] for e in chosen} & set(targets) if i == num_layers - 1 else {e[2] for e in chosen}
            norms.append(nn.ModuleDict({t: row_norm(norm, hidden) for t in node_types if t in outputs}))
    if every_type:
        layer = HGTConv if conv == "hgt" else HANConv
        meta = (node_types, edge_types)
        return inputs, nn.ModuleList([layer(hidden, hidden, meta, heads=heads) for _ in range(num_layers)]), norms
    with warnings.catch_warnings():  # PyG warns of types a layer does not update: pruned on purpose
        warnings.filterwarnings("ignore", message="There exist node types")
        return inputs, nn.ModuleList([RelationSum({e: relation() for e in chosen}) for chosen in layers]), norms


def hetero_embed(inputs: nn.ModuleDict, batch: Any, featureless: str) -> dict[str, Tensor]:
    """Every node type's first hidden rows: features projected, or embeddings of ``batch[type].n_id``; on a
    partition for its halo rows too (:func:`~lightning_halo.partition.hetero.local_features`), so the first
    layer needs no exchange."""
    out = {}
    for t, module in inputs.items():
        store = batch[t]
        if isinstance(module, nn.Embedding) and featureless == "type":
            out[t] = module.weight.expand(int(store.num_nodes), -1)  # every local row: the type's one row
        elif isinstance(module, nn.Embedding):
            ids = store.n_id if "n_id" in store else torch.arange(store.num_nodes, device=module.weight.device)
            out[t] = module(ids)
        else:  # every local row (halo too, on a partition): the projection needs no exchange
            out[t] = module(local_features(store))
    return out


def hetero_propagate(convs: nn.ModuleList, x: dict[str, Tensor], edges: Any, dropout: float, training: bool,
                     norms: Sequence[nn.ModuleDict] = ()) -> dict[str, Tensor]:  # fmt: skip
    """The layers over ``edges`` (``batch.edge_index_dict``), each output normalised per type when ``norms`` has a
    module for it (:func:`hetero_layers`), ReLU and dropout between them."""
    for i, conv in enumerate(convs):
        x = conv(x, edges)
        if norms:
            x = {t: norms[i][t](v) if t in norms[i] and v is not None else v for t, v in x.items()}
        if i < len(convs) - 1:
            x = {t: F.dropout(F.relu(v), p=dropout, training=training) for t, v in x.items() if v is not None}
    return x


class HeteroNodeClassifier(pl.LightningModule):
    r"""Full-graph node classification on a heterogeneous graph: every node type projected (or embedded),
    message passing over every edge type, cross-entropy on the labelled type.

    Ordinary PyG code (nothing here knows about partitions): ``conv="sage"`` or ``"gat"`` is a
    :class:`~torch_geometric.nn.conv.HeteroConv` per layer (:class:`RelationSum`: summed as the relations run)
    with one ``SAGEConv`` or ``GATConv(add_self_loops=False)`` per relation, summed per target type (the model
    ``to_hetero`` builds, `Schlichtkrull et al. <https://arxiv.org/abs/1703.06103>`_), keeping
    only the relations whose messages reach the target type (:func:`needed_relations`: DDP
    refuses weights without gradient); ``conv="hgt"`` stacks
    :class:`~torch_geometric.nn.conv.HGTConv` (`Hu et al. <https://arxiv.org/abs/2003.01332>`_)
    and ``conv="han"`` :class:`~torch_geometric.nn.conv.HANConv` (`Wang et al.
    <https://arxiv.org/abs/1903.07293>`_: each edge type a metapath, e.g. made with
    ``T.AddMetaPaths`` before the data module), whose last layer updates every type: train them
    with ``find_unused_parameters=True``. A node
    type without features gets a learned embedding looked up by ``batch[type].n_id`` (on a
    partition: its inner and halo nodes; on one process every node), exact on partitions too;
    with ``featureless="type"`` one learned row for all its nodes instead, so that the model has
    no parameter per node (DDP all-reduces every parameter's gradient each step: a per-node
    embedding of a type with millions of nodes moves more bytes than its halos).

    .. math::
        \mathbf{h}^{(0)}_v = \mathbf{W}_{\tau(v)} \mathbf{x}_v \text{ or } \mathbf{E}_{\tau(v)}[v], \qquad
        \mathbf{h}^{(l+1)}_v = \sum_{r=(s,\cdot,\tau(v))} \mathrm{conv}_r\big(\mathbf{h}^{(l)}_s, \mathbf{h}^{(l)}_v\big)

    The graph's types and sizes are given, or, all four left out (a CLI config), read from the
    Trainer's :class:`~lightning_halo.HaloDataModule` when the model is configured (and recorded
    in the hyperparameters, so a checkpoint rebuilds the model alone).

    Args:
        out_channels (int): number of classes (``HaloDataModule.num_classes``).
        metadata (tuple, optional): ``(node_types, edge_types)``, ``HaloDataModule.metadata`` (or
            ``data.metadata()``). (default: ``None``, from the data module)
        num_features (dict, optional): input features per node type, 0 for a type without
            (``HaloDataModule.num_features``). (default: ``None``)
        num_nodes (dict, optional): nodes per type (``HaloDataModule.num_nodes``; sizes the embeddings).
            (default: ``None``)
        target (str, optional): the labelled node type (``HaloDataModule.labelled_type``). (default: ``None``)
        hidden_channels (int, optional): hidden size. (default: ``64``)
        num_layers (int, optional): message-passing layers. (default: ``2``)
        conv (str, optional): ``"sage"``, ``"gat"``, ``"hgt"`` or ``"han"``. (default: ``"sage"``)
        heads (int, optional): attention heads of ``"gat"``, ``"hgt"`` and ``"han"`` (divides ``hidden_channels``).
            (default: ``2``)
        dropout (float, optional): dropout between layers. (default: ``0.5``)
        lr (float, optional): Adam learning rate. (default: ``0.01``)
        weight_decay (float, optional): Adam weight decay. (default: ``5e-4``)
        featureless (str, optional): ``"embedding"`` (a learned row per node of a type without
            features) or ``"type"`` (one learned row per such type). (default: ``"embedding"``)
        norm (str, optional): ``None``, ``"layer"`` (a LayerNorm per node type after each layer, each
            row alone: HGT's own recipe, which steadies its training; see docs/heterogeneous.md) or
            ``"batch"`` (BatchNorm per node type, whole-graph statistics under the strategy).
            (default: ``None``)

    Shapes:
        - **input:** a :class:`~torch_geometric.data.HeteroData` (or its partition) with ``x`` per featured type.
        - **output:** ``[n_target, out_channels]`` logits of the target type's (inner) nodes.

    Example:
        >>> model = HeteroNodeClassifier(3, (["paper", "author"], [("author", "writes", "paper")]),
        ...                              {"paper": 8, "author": 0}, {"paper": 10, "author": 5}, "paper")
        >>> model.hparams.conv
        'sage'
    """

    def __init__(
        self,
        out_channels: int,
        metadata: Optional[tuple[list[str], list[EdgeType]]] = None,
        num_features: Optional[dict[str, int]] = None,
        num_nodes: Optional[dict[str, int]] = None,
        target: Optional[str] = None,
        hidden_channels: int = 64,
        num_layers: int = 2,
        conv: HeteroConvKind = "sage",
        heads: int = 2,
        dropout: float = 0.5,
        lr: float = 0.01,
        weight_decay: float = 5e-4,
        featureless: Featureless = "embedding",
        norm: Norm = None,
    ) -> None:
        super().__init__()
        check_hetero_options(conv, featureless, hidden_channels, heads)
        check_norm(norm)
        self.save_hyperparameters()
        self.val_acc = MulticlassAccuracy(out_channels, average="micro")
        self.test_acc = MulticlassAccuracy(out_channels, average="micro")
        graph = (metadata, num_features, num_nodes, target)
        if graph_given(graph, "target", "HaloDataModule's metadata, num_features, num_nodes and labelled_type"):
            self._build(*graph)  # type: ignore[arg-type]

    @override
    def configure_model(self) -> None:
        """Build the layers from the Trainer's data module when the graph's types were not given (a CLI config)."""
        if hasattr(self, "head"):
            return
        dm = getattr(self.trainer, "datamodule", None)
        if dm is None or not getattr(dm, "hetero", False):
            raise ValueError("HeteroNodeClassifier without metadata needs a HaloDataModule of a heterogeneous graph "
                             "in trainer.fit(..., datamodule=dm), or metadata, num_features, num_nodes and target")  # fmt: skip
        graph = {"metadata": dm.metadata, "num_features": dm.num_features, "num_nodes": dm.num_nodes,
                 "target": dm.labelled_type}  # fmt: skip
        self.hparams.update(graph)  # a checkpoint then rebuilds the model without the data module
        self._build(**graph)

    def _build(self, metadata: tuple[list[str], list[EdgeType]], num_features: dict[str, int], num_nodes: dict[str, int],
               target: str) -> None:  # fmt: skip
        h = self.hparams
        if target not in metadata[0]:
            raise ValueError(f"target={target!r} is not a node type of the graph ({list(metadata[0])})")
        self.target = target
        self.meta = (list(metadata[0]), [tuple(e) for e in metadata[1]])
        self.inputs, self.convs, self.norms = hetero_layers(
            metadata, num_features, num_nodes, [target], hidden=h.hidden_channels, num_layers=h.num_layers,
            conv=h.conv, heads=h.heads, featureless=h.featureless, norm=h.get("norm"))  # fmt: skip
        self.head = nn.Linear(h.hidden_channels, h.out_channels)

    def embed(self, batch: Any) -> dict[str, Tensor]:
        """Every node type's first hidden rows (:func:`hetero_embed`)."""
        return hetero_embed(self.inputs, batch, self.hparams.featureless)

    @override
    def forward(self, batch: Any) -> Tensor:
        x = hetero_propagate(self.convs, self.embed(batch), batch.edge_index_dict, self.hparams.dropout, self.training,
                             self.norms)  # fmt: skip
        return self.head(x[self.target])

    @override
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        store = batch[self.target]
        out = self(batch)
        mask = store.train_mask
        loss = F.cross_entropy(out[mask], store.y[mask])
        total = int(getattr(batch, "num_train_global", 0) or 0) or int(mask.sum()) or 1
        share = torch.nan_to_num(loss.detach()) * (int(mask.sum()) / total)
        self.log("train_loss", share, reduce_fx="sum", sync_dist=True, prog_bar=True, batch_size=1)
        return loss

    def _evaluate(self, batch: Any, split: str, acc: MulticlassAccuracy) -> None:
        store = batch[self.target]
        mask = store[f"{split}_mask"]
        acc(self(batch)[mask], store.y[mask])
        self.log(f"{split}_acc", acc, prog_bar=split == "val", batch_size=1)

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_acc)

    @override
    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "test", self.test_acc)

    @override
    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        """The target type's logits ``[n_inner, C]`` (``HaloDataModule.gather_predictions`` orders them globally)."""
        return self(batch)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
