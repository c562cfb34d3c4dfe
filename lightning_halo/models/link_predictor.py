"""Ready link predictors: a GCN or GraphSAGE encoder over the whole graph (or, on a heterogeneous graph, the zoo's
heterogeneous encoder), a dot or MLP decoder."""

from __future__ import annotations

from typing import Any, Literal, Optional

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import BinaryAUROC
from typing_extensions import override

from lightning_halo.link.gather import gather_rows
from lightning_halo.link.metrics import HitsAtK
from lightning_halo.loss import global_mean
from lightning_halo.models.node_classifier import Norm, check_norm

Encoder = Literal["gcn", "sage"]
Decoder = Literal["dot", "mlp"]
EdgeType = tuple[str, str, str]


class _PairScorer(pl.LightningModule):
    """What the zoo's link predictors share: each rank's share of the mean binary cross-entropy over all pairs,
    ROC-AUC and Hits@K counted once per pair over the ranks, Adam. A subclass says where a batch keeps its pairs
    (:meth:`pairs`) and scores them (:meth:`score`)."""

    mlp: Optional[nn.Module]

    def _metrics(self, hits_k: int) -> None:
        self.val_auroc, self.test_auroc = BinaryAUROC(), BinaryAUROC()
        self.val_hits, self.test_hits = HitsAtK(hits_k), HitsAtK(hits_k)

    def decode(self, z_u: Tensor, z_v: Tensor) -> Tensor:
        """Logits of the pairs ``(u, v)`` from their rows: the dot product, or the decoder MLP (``self.mlp``) on
        :math:`z_u \\odot z_v`."""
        if self.mlp is None:
            return (z_u * z_v).sum(-1)
        return self.mlp(z_u * z_v).view(-1)

    def pairs(self, batch: Any) -> tuple[Tensor, Tensor]:
        """``(edge_label_index, edge_label)`` of the batch."""
        return batch.edge_label_index, batch.edge_label

    def score(self, batch: Any) -> Tensor:
        raise NotImplementedError

    @override
    def setup(self, stage: str) -> None:
        scale = getattr(self.trainer.strategy, "scale_loss", "share")
        if stage == "fit" and scale != "share":
            raise ValueError(
                f"{type(self).__name__} returns each rank's share of the mean over all pairs, but the strategy has "
                f"scale_loss={scale!r}; use HaloQuantStrategy(scale_loss='share') (in a config: "
                "trainer.strategy.init_args.scale_loss: share)."
            )

    @override
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        logits, label = self.score(batch), self.pairs(batch)[1]
        per_pair = F.binary_cross_entropy_with_logits(logits, label.to(logits.dtype), reduction="none")
        loss = global_mean(per_pair)
        self.log("train_loss", loss.detach(), reduce_fx="sum", sync_dist=True, prog_bar=True, batch_size=1)
        return loss

    def _evaluate(self, batch: Any, prefix: str) -> None:
        logits, label = self.score(batch), self.pairs(batch)[1].long()
        auroc, hits = (self.val_auroc, self.val_hits) if prefix == "val" else (self.test_auroc, self.test_hits)
        auroc(logits, label)
        hits(logits, label)
        self.log(f"{prefix}_auroc", auroc, prog_bar=prefix == "val", batch_size=1)
        self.log(f"{prefix}_hits@{self.hparams.hits_k}", hits, batch_size=1)

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    @override
    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    @override
    def predict_step(self, batch: Any, batch_idx: int) -> tuple[Tensor, Tensor]:
        """``(edge_label_index, probability)`` of this rank's test pairs (global ids)."""
        return self.pairs(batch)[0], self.score(batch).sigmoid()

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class LinkPredictor(_PairScorer):
    r"""Full-graph link prediction (GAE-style, as PyG's ``examples/link_pred.py``), trained on partitions.

    The encoder (PyG's ``GCN`` or ``GraphSAGE``) runs on the message-passing graph; the rows of
    both endpoints of every pair this rank scores come from :func:`~lightning_halo.gather_rows`
    (fetched from their owners when remote); the decoder scores them: ``"dot"``
    (:math:`z_u^\top z_v`) or ``"mlp"`` (an MLP on :math:`z_u \odot z_v`). The loss is binary
    cross-entropy, averaged over all pairs of all ranks (:func:`~lightning_halo.global_mean`), so
    train with ``HaloQuantStrategy(scale_loss="share")`` (checked at setup). ``val_auroc`` /
    ``test_auroc`` (ROC-AUC) and ``val_hits@K`` / ``test_hits@K`` (OGB's Hits@K) count each pair
    once over all ranks. Use with :class:`~lightning_halo.HaloLinkDataModule`.

    Args:
        in_channels (int): input feature size (``dm.num_features``).
        hidden_channels (int, optional): hidden size. (default: ``64``)
        out_channels (int, optional): embedding size. (default: ``64``)
        num_layers (int, optional): message-passing layers. (default: ``2``)
        encoder (str, optional): ``"gcn"`` or ``"sage"``. (default: ``"gcn"``)
        decoder (str, optional): ``"dot"`` or ``"mlp"``. (default: ``"dot"``)
        dropout (float, optional): dropout between encoder layers. (default: ``0.0``)
        lr (float, optional): Adam learning rate. (default: ``0.01``)
        hits_k (int, optional): :math:`K` of Hits@K. (default: ``50``)

    Shapes:
        - **forward:** ``x`` :math:`(n, F)`, ``edge_index`` :math:`(2, E)` → :math:`(n, d)`
        - **decode:** ``z_u``, ``z_v`` :math:`(M, d)` → :math:`(M,)` logits

    Example:
        >>> model = LinkPredictor(1433, hidden_channels=32, out_channels=16, decoder="mlp")
        >>> model.decode(torch.ones(3, 16), torch.ones(3, 16)).shape
        torch.Size([3])
    """

    def __init__(
        self,
        in_channels: int,
        hidden_channels: int = 64,
        out_channels: int = 64,
        num_layers: int = 2,
        encoder: Encoder = "gcn",
        decoder: Decoder = "dot",
        dropout: float = 0.0,
        lr: float = 0.01,
        hits_k: int = 50,
    ) -> None:
        super().__init__()
        if encoder not in ("gcn", "sage") or decoder not in ("dot", "mlp"):
            raise ValueError(f"encoder must be 'gcn' or 'sage' and decoder 'dot' or 'mlp', got {encoder!r}, {decoder!r}")
        self.save_hyperparameters()
        from torch_geometric.nn.models import GCN, MLP, GraphSAGE

        cls = GCN if encoder == "gcn" else GraphSAGE
        self.encoder = cls(in_channels, hidden_channels, num_layers, out_channels, dropout=dropout)
        self.mlp = MLP([out_channels, hidden_channels, 1], norm=None) if decoder == "mlp" else None
        self._metrics(hits_k)

    @override
    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.encoder(x, edge_index)

    @override
    def score(self, batch: Any) -> Tensor:
        """Logits of the batch's pairs (``batch.edge_label_index``, global ids)."""
        z = self(batch.x, batch.edge_index)
        h = gather_rows(z, batch.edge_label_index)  # [2, M, d]: both endpoints, remote ones fetched
        return self.decode(h[0], h[1])


class HeteroLinkPredictor(_PairScorer):
    r"""Full-graph link prediction on one edge type of a heterogeneous graph, trained on partitions.

    The encoder is :class:`~lightning_halo.models.HeteroNodeClassifier`'s (every node type
    projected, or embedded by ``batch[type].n_id`` when it has no features; ``SAGEConv`` or
    ``GATConv`` per relation summed per type, or ``HGTConv`` / ``HANConv``), keeping the
    relations whose messages reach the edge type's two node types. Both endpoints of every pair
    the rank scores come from :func:`~lightning_halo.gather_rows` (``node_type=`` the source
    type, then the target type); the decoder is ``"dot"`` or ``"mlp"`` (an MLP on
    :math:`z_u \odot z_v`). Loss and metrics as :class:`LinkPredictor` (train with
    ``HaloQuantStrategy(scale_loss="share")``). Use with
    ``HaloLinkDataModule(hetero_data, edge_type=..., rev_edge_type=...)``: the pairs are
    ``batch[edge_type].edge_label_index``, as ``RandomLinkSplit`` places them.

    The graph's types, sizes and edge type are given, or, all four left out (a CLI config),
    read from the Trainer's data module when the model is configured (and recorded in the
    hyperparameters).

    Args:
        metadata (tuple, optional): ``(node_types, edge_types)`` (``dm.metadata``). (default: ``None``)
        num_features (dict, optional): features per node type, 0 for none (``dm.num_features``). (default: ``None``)
        num_nodes (dict, optional): nodes per type (``dm.num_nodes``). (default: ``None``)
        edge_type (tuple, optional): the edge type whose links are predicted (``dm.edge_type``). (default: ``None``)
        hidden_channels (int, optional): hidden and embedding size. (default: ``64``)
        num_layers (int, optional): message-passing layers. (default: ``2``)
        conv (str, optional): ``"sage"``, ``"gat"``, ``"hgt"`` or ``"han"``. (default: ``"sage"``)
        heads (int, optional): attention heads (divides ``hidden_channels``). (default: ``2``)
        decoder (str, optional): ``"dot"`` or ``"mlp"``. (default: ``"dot"``)
        featureless (str, optional): ``"embedding"`` or ``"type"``, as for ``HeteroNodeClassifier``.
            (default: ``"embedding"``)
        dropout (float, optional): dropout between layers. (default: ``0.0``)
        lr (float, optional): Adam learning rate. (default: ``0.01``)
        hits_k (int, optional): :math:`K` of Hits@K. (default: ``50``)
        norm (str, optional): ``None``, ``"layer"`` or ``"batch"``, as for ``HeteroNodeClassifier``. (default: ``None``)

    Shapes:
        - **score:** a batch with ``batch[edge_type].edge_label_index`` :math:`(2, M)` → :math:`(M,)` logits

    Example:
        >>> meta = (["paper", "author"], [("author", "writes", "paper"), ("paper", "rev_writes", "author")])
        >>> model = HeteroLinkPredictor(meta, {"paper": 8, "author": 0}, {"paper": 10, "author": 5},
        ...                             ("author", "writes", "paper"), hidden_channels=16)
        >>> sorted(model.inputs)
        ['author', 'paper']
    """

    def __init__(
        self,
        metadata: Optional[tuple[list[str], list[EdgeType]]] = None,
        num_features: Optional[dict[str, int]] = None,
        num_nodes: Optional[dict[str, int]] = None,
        edge_type: Optional[EdgeType] = None,
        hidden_channels: int = 64,
        num_layers: int = 2,
        conv: Literal["sage", "gat", "hgt", "han"] = "sage",
        heads: int = 2,
        decoder: Decoder = "dot",
        featureless: Literal["embedding", "type"] = "embedding",
        dropout: float = 0.0,
        lr: float = 0.01,
        hits_k: int = 50,
        norm: Norm = None,
    ) -> None:
        super().__init__()
        from lightning_halo.models.hetero_classifier import check_hetero_options, graph_given

        check_hetero_options(conv, featureless, hidden_channels, heads)
        check_norm(norm)
        if decoder not in ("dot", "mlp"):
            raise ValueError(f"decoder must be 'dot' or 'mlp', got {decoder!r}")
        self.save_hyperparameters()
        self._metrics(hits_k)
        graph = (metadata, num_features, num_nodes, edge_type)
        if graph_given(graph, "edge_type", "the HaloLinkDataModule's metadata, num_features, num_nodes and edge_type"):
            self._build(*graph)  # type: ignore[arg-type]

    @override
    def configure_model(self) -> None:
        """Build the layers from the Trainer's data module when the graph was not given (a CLI config)."""
        if hasattr(self, "convs"):
            return
        dm = getattr(self.trainer, "datamodule", None)
        if dm is None or getattr(dm, "edge_type", None) is None:
            raise ValueError("HeteroLinkPredictor without metadata needs HaloLinkDataModule(hetero_data, edge_type=...) "
                             "in trainer.fit(..., datamodule=dm), or metadata, num_features, num_nodes and edge_type")  # fmt: skip
        graph = {"metadata": dm.metadata, "num_features": dm.num_features, "num_nodes": dm.num_nodes,
                 "edge_type": dm.edge_type}  # fmt: skip
        self.hparams.update(graph)  # a checkpoint then rebuilds the model without the data module
        self._build(**graph)  # type: ignore[arg-type]

    def _build(self, metadata: tuple[list[str], list[EdgeType]], num_features: dict[str, int], num_nodes: dict[str, int],
               edge_type: EdgeType) -> None:  # fmt: skip
        from torch_geometric.nn.models import MLP

        from lightning_halo.models.hetero_classifier import hetero_layers

        h = self.hparams
        edge_type = tuple(edge_type)  # type: ignore[assignment]
        if edge_type not in [tuple(e) for e in metadata[1]]:
            raise ValueError(f"edge_type={edge_type!r} is not an edge type of the graph ({list(metadata[1])})")
        self.edge_type = edge_type
        ends = list(dict.fromkeys((edge_type[0], edge_type[2])))
        self.inputs, self.convs, self.norms = hetero_layers(
            metadata, num_features, num_nodes, ends, hidden=h.hidden_channels, num_layers=h.num_layers, conv=h.conv,
            heads=h.heads, featureless=h.featureless, norm=h.get("norm"))  # fmt: skip
        hidden = h.hidden_channels
        self.mlp: Optional[nn.Module] = MLP([hidden, hidden, 1], norm=None) if h.decoder == "mlp" else None

    @override
    def forward(self, batch: Any) -> dict[str, Tensor]:
        """Every node type's embeddings (of the rank's inner nodes on a partition)."""
        from lightning_halo.models.hetero_classifier import hetero_embed, hetero_propagate

        x = hetero_embed(self.inputs, batch, self.hparams.featureless)
        return hetero_propagate(self.convs, x, batch.edge_index_dict, self.hparams.dropout, self.training, self.norms)

    @override
    def pairs(self, batch: Any) -> tuple[Tensor, Tensor]:
        store = batch[self.edge_type]
        return store.edge_label_index, store.edge_label

    @override
    def score(self, batch: Any) -> Tensor:
        """Logits of the batch's pairs of :attr:`edge_type` (global ids within the source and target types)."""
        src, _, dst = self.edge_type
        z = self(batch)
        index = batch[self.edge_type].edge_label_index
        return self.decode(gather_rows(z[src], index[0], node_type=src), gather_rows(z[dst], index[1], node_type=dst))
