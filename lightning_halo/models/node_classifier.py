"""Ready node-classification LightningModules on PyG's BasicGNN models (GCN, GraphSAGE, GAT, GIN)."""

from __future__ import annotations

from typing import Any, Literal, Optional

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import BinaryAUROC, MulticlassAccuracy
from typing_extensions import override

Norm = Optional[Literal["batch", "layer"]]


def check_norm(norm: Any) -> None:
    """The zoo's ``norm`` option, checked once for every model that takes it."""
    if norm not in (None, "batch", "layer"):
        raise ValueError(f"norm must be None, 'batch' or 'layer', got {norm!r}")


def row_norm(norm: str, channels: int) -> nn.Module:
    """PyG's normalisation layer for ``norm`` as ``BasicGNN`` builds it, ``"layer"`` per node (``mode="node"``: each
    row normalised alone, exact on partitions); ``"batch"``'s statistics are whole-graph ones under the strategy."""
    from torch_geometric.nn.resolver import normalization_resolver

    kwargs = {"mode": "node"} if norm == "layer" else {}
    return normalization_resolver(norm, channels, **kwargs)


class NodeClassifier(pl.LightningModule):
    r"""Full-graph node classification: a PyG ``BasicGNN``, cross-entropy, torchmetrics metrics.

    Written as ordinary PyG code (nothing here knows about partitions), so it trains on one
    process or with :class:`~lightning_halo.HaloQuantStrategy`. Each rank updates its metrics
    with its own nodes and logs the Metric objects, so ``val_acc`` / ``test_acc`` (micro
    accuracy) and, for two classes, ``val_auroc`` / ``test_auroc`` are exact global values.
    ``train_loss`` is the mean over all train nodes of the graph.

    Args:
        in_channels (int): input feature size (link to ``data.num_features`` in the CLI).
        out_channels (int): number of classes (link to ``data.num_classes``).
        hidden_channels (int, optional): hidden size. (default: ``64``)
        num_layers (int, optional): message-passing layers. (default: ``2``)
        dropout (float, optional): dropout between layers. (default: ``0.5``)
        norm (str, optional): ``"batch"`` (BatchNorm: whole-graph statistics under the strategy) or
            ``"layer"`` (node-wise LayerNorm, exact on partitions). (default: ``None``)
        lr (float, optional): Adam learning rate. (default: ``0.01``)
        weight_decay (float, optional): Adam weight decay. (default: ``5e-4``)
        sparse (bool, optional): pass the layers a sparse adjacency
            (:func:`~lightning_halo.sparse_adjacency`, built once and cached) instead of
            ``edge_index``. Under :class:`~lightning_halo.HaloQuantStrategy` this is not
            needed (its default ``aggregation="auto"`` fuses the aggregation of these layers
            by itself); it makes the fused path available to plain single-process runs. Not
            for attention layers (GAT), nor with 16-bit precision (refused at setup).
            (default: ``False``)

    Example:
        >>> model = GCN(in_channels=1433, out_channels=7, hidden_channels=64)
        >>> model.hparams.hidden_channels
        64
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        hidden_channels: int = 64,
        num_layers: int = 2,
        dropout: float = 0.5,
        norm: Norm = None,
        lr: float = 0.01,
        weight_decay: float = 5e-4,
        sparse: bool = False,
    ) -> None:
        super().__init__()
        if out_channels < 2:
            raise ValueError(f"out_channels must be the number of classes (>= 2), got {out_channels}")
        check_norm(norm)
        self.save_hyperparameters()
        self.gnn = self.build_gnn()
        self._reduce = self._aggregation() if sparse else "sum"
        self._adj_cache: Optional[tuple[Tensor, int, torch.dtype, Tensor]] = None
        self.val_acc = MulticlassAccuracy(out_channels, average="micro")
        self.test_acc = MulticlassAccuracy(out_channels, average="micro")
        self.binary = out_channels == 2
        if self.binary:
            self.val_auroc, self.test_auroc = BinaryAUROC(), BinaryAUROC()

    #: Name of the model class in :mod:`torch_geometric.nn.models`; subclasses choose it.
    pyg_model: str = ""

    def build_gnn(self) -> nn.Module:
        """The PyG model (``torch_geometric.nn.models.<pyg_model>``)."""
        import torch_geometric.nn.models as models

        if not self.pyg_model:
            raise NotImplementedError("subclass NodeClassifier and set pyg_model (or override build_gnn)")
        return getattr(models, self.pyg_model)(**self._gnn_kwargs())

    def _gnn_kwargs(self) -> dict[str, Any]:
        h = self.hparams
        kwargs: dict[str, Any] = dict(
            in_channels=h.in_channels,
            hidden_channels=h.hidden_channels,
            num_layers=h.num_layers,
            out_channels=h.out_channels,
            dropout=h.dropout,
        )
        if h.norm == "layer":
            kwargs.update(norm="layer", norm_kwargs={"mode": "node"})  # per node: exact on partitions
        elif h.norm == "batch":
            kwargs.update(norm="batch")
        return kwargs

    def _aggregation(self) -> str:
        """The one aggregation all layers use, as :func:`sparse_adjacency`'s ``reduce``."""
        from torch_geometric.nn import MessagePassing

        aggrs = {getattr(m, "aggr", None) for m in self.gnn.modules() if isinstance(m, MessagePassing)}
        aggrs = {"sum" if a == "add" else a for a in aggrs}
        if len(aggrs) != 1 or not aggrs <= {"sum", "mean", "max", "min"}:
            raise ValueError(
                f"sparse=True needs every layer to aggregate with one of sum/mean/max/min, found {sorted(map(str, aggrs))}; "
                "use sparse=False"
            )
        return aggrs.pop()

    @override
    def setup(self, stage: str) -> None:
        precision = str(getattr(self.trainer, "precision", "32-true"))
        if self.hparams.get("sparse", False) and "16" in precision:
            # PyG's sum path calls torch.sparse.mm, whose CPU (MKL) kernel has no bfloat16/float16 version
            raise ValueError(
                f"sparse=True cannot run with precision={precision!r}: PyG's sparse-dense product has no 16-bit CPU "
                "kernel. Use sparse=False: HaloQuantStrategy fuses the aggregation by itself, in 16 bits too."
            )

    def adjacency(self, batch: Any) -> Tensor:
        """What the layers get as ``edge_index``: ``batch.edge_index``, or its cached sparse form.

        With ``sparse=True`` this is :func:`~lightning_halo.sparse_adjacency` of the batch,
        built on the first call and reused while ``batch.edge_index`` is the same, unchanged
        tensor (the partition is the same object every epoch).
        """
        if not self.hparams.get("sparse", False):
            return batch.edge_index
        from lightning_halo.partition.adjacency import sparse_adjacency

        ei, dtype = batch.edge_index, batch.x.dtype
        hit = self._adj_cache
        if hit is not None and hit[0] is ei and hit[1] == ei._version and hit[2] == dtype:
            return hit[3]
        adj = sparse_adjacency(batch, reduce=self._reduce, dtype=dtype)  # type: ignore[arg-type]
        self._adj_cache = (ei, ei._version, dtype, adj)
        return adj

    @override
    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.gnn(x, edge_index)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        out = self(batch.x, self.adjacency(batch))
        mask = batch.train_mask
        loss = F.cross_entropy(out[mask], batch.y[mask])
        # global mean for the log: every rank contributes its share n_r / N (0 without train nodes)
        total = int(getattr(batch, "num_train_global", 0)) or int(mask.sum()) or 1
        share = torch.nan_to_num(loss.detach()) * (int(mask.sum()) / total)
        self.log("train_loss", share, reduce_fx="sum", sync_dist=True, prog_bar=True, batch_size=1)
        return loss

    def _evaluate(self, batch: Any, mask: Tensor, acc: MulticlassAccuracy, prefix: str) -> None:
        out = self(batch.x, self.adjacency(batch))
        acc(out[mask], batch.y[mask])
        self.log(f"{prefix}_acc", acc, prog_bar=prefix == "val", batch_size=1)
        if self.binary:
            auroc = self.val_auroc if prefix == "val" else self.test_auroc
            auroc(out[mask].softmax(-1)[:, 1], batch.y[mask])
            self.log(f"{prefix}_auroc", auroc, batch_size=1)

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, batch.val_mask, self.val_acc, "val")

    @override
    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, batch.test_mask, self.test_acc, "test")

    @override
    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        """The logits ``[n_inner, C]`` of this rank's nodes, in the partition's order.

        ``HaloDataModule.gather_predictions`` (or :class:`~lightning_halo.HaloPredictionWriter`)
        puts every rank's rows together in global node order: ``[N, C]``.
        """
        return self(batch.x, self.adjacency(batch))

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)




class GCN(NodeClassifier):
    """Two or more ``GCNConv`` layers (`Kipf & Welling <https://arxiv.org/abs/1609.02907>`_).

    Args:
        in_channels (int): input feature size.
        out_channels (int): number of classes.
        hidden_channels (int, optional): hidden size. (default: ``64``)
        num_layers (int, optional): message-passing layers. (default: ``2``)
        dropout (float, optional): dropout between layers. (default: ``0.5``)
        norm (str, optional): ``None``, ``"batch"`` or ``"layer"``. (default: ``None``)
        lr (float, optional): Adam learning rate. (default: ``0.01``)
        weight_decay (float, optional): Adam weight decay. (default: ``5e-4``)
        sparse (bool, optional): pass the layers a cached sparse adjacency (see
            :class:`NodeClassifier`). (default: ``False``)

    Example:
        >>> GCN(in_channels=1433, out_channels=7).gnn
        GCN(1433, 7, num_layers=2)
    """

    pyg_model = "GCN"


class GraphSAGE(NodeClassifier):
    """``SAGEConv`` layers with mean aggregation (`Hamilton et al. <https://arxiv.org/abs/1706.02216>`_).

    Args:
        in_channels (int): input feature size.
        out_channels (int): number of classes.
        hidden_channels (int, optional): hidden size. (default: ``64``)
        num_layers (int, optional): message-passing layers. (default: ``2``)
        dropout (float, optional): dropout between layers. (default: ``0.5``)
        norm (str, optional): ``None``, ``"batch"`` or ``"layer"``. (default: ``None``)
        lr (float, optional): Adam learning rate. (default: ``0.01``)
        weight_decay (float, optional): Adam weight decay. (default: ``5e-4``)
        sparse (bool, optional): pass the layers a cached sparse adjacency (see
            :class:`NodeClassifier`). (default: ``False``)

    Example:
        >>> GraphSAGE(in_channels=1433, out_channels=7, num_layers=3).gnn
        GraphSAGE(1433, 7, num_layers=3)
    """

    pyg_model = "GraphSAGE"


class GAT(NodeClassifier):
    """``GATConv`` layers (Veličković et al., https://arxiv.org/abs/1710.10903).

    Args:
        in_channels (int): as :class:`NodeClassifier`.
        out_channels (int): as :class:`NodeClassifier`.
        hidden_channels (int, optional): as :class:`NodeClassifier`. (default: ``64``)
        num_layers (int, optional): as :class:`NodeClassifier`. (default: ``2``)
        dropout (float, optional): as :class:`NodeClassifier`. (default: ``0.5``)
        norm (str, optional): as :class:`NodeClassifier`. (default: ``None``)
        lr (float, optional): Adam learning rate. (default: ``0.005``)
        weight_decay (float, optional): as :class:`NodeClassifier`. (default: ``5e-4``)
        heads (int, optional): attention heads of the hidden layers (their outputs are
            concatenated, so ``hidden_channels`` must be divisible by it). (default: ``4``)

    Example:
        >>> GAT(in_channels=1433, out_channels=7, hidden_channels=64, heads=8).gnn
        GAT(1433, 7, num_layers=2)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        hidden_channels: int = 64,
        num_layers: int = 2,
        dropout: float = 0.5,
        norm: Norm = None,
        lr: float = 0.005,
        weight_decay: float = 5e-4,
        heads: int = 4,
    ) -> None:
        if hidden_channels % heads:
            raise ValueError(f"hidden_channels={hidden_channels} must be divisible by heads={heads}")
        self._heads = heads
        super().__init__(in_channels, out_channels, hidden_channels, num_layers, dropout, norm, lr, weight_decay, sparse=False)

    pyg_model = "GAT"

    def _gnn_kwargs(self) -> dict[str, Any]:
        return {**super()._gnn_kwargs(), "heads": self._heads}


class GIN(NodeClassifier):
    """``GINConv`` layers with 2-layer MLPs (`Xu et al. <https://arxiv.org/abs/1810.00826>`_).

    Args:
        in_channels (int): input feature size.
        out_channels (int): number of classes.
        hidden_channels (int, optional): hidden size. (default: ``64``)
        num_layers (int, optional): message-passing layers. (default: ``2``)
        dropout (float, optional): dropout between layers. (default: ``0.5``)
        norm (str, optional): ``None``, ``"batch"`` or ``"layer"``. (default: ``None``)
        lr (float, optional): Adam learning rate. (default: ``0.01``)
        weight_decay (float, optional): Adam weight decay. (default: ``5e-4``)
        sparse (bool, optional): pass the layers a cached sparse adjacency (see
            :class:`NodeClassifier`). (default: ``False``)

    Example:
        >>> GIN(in_channels=1433, out_channels=7).gnn
        GIN(1433, 7, num_layers=2)
    """

    pyg_model = "GIN"
