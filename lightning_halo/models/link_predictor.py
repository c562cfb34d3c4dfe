"""A ready link predictor: a GCN or GraphSAGE encoder over the whole graph, a dot or MLP decoder."""

from __future__ import annotations

from typing import Any, Literal

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics.classification import BinaryAUROC
from typing_extensions import override

from lightning_halo.link.gather import gather_rows
from lightning_halo.link.metrics import HitsAtK
from lightning_halo.loss import global_mean

Encoder = Literal["gcn", "sage"]
Decoder = Literal["dot", "mlp"]


class LinkPredictor(pl.LightningModule):
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
        self.val_auroc, self.test_auroc = BinaryAUROC(), BinaryAUROC()
        self.val_hits, self.test_hits = HitsAtK(hits_k), HitsAtK(hits_k)

    @override
    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.encoder(x, edge_index)

    def decode(self, z_u: Tensor, z_v: Tensor) -> Tensor:
        """Logits of the pairs ``(u, v)`` from their rows."""
        if self.mlp is None:
            return (z_u * z_v).sum(-1)
        return self.mlp(z_u * z_v).view(-1)

    def score(self, batch: Any) -> Tensor:
        """Logits of the batch's pairs (``batch.edge_label_index``, global ids)."""
        z = self(batch.x, batch.edge_index)
        h = gather_rows(z, batch.edge_label_index)  # [2, M, d]: both endpoints, remote ones fetched
        return self.decode(h[0], h[1])

    @override
    def setup(self, stage: str) -> None:
        scale = getattr(self.trainer.strategy, "scale_loss", "share")
        if stage == "fit" and scale != "share":
            raise ValueError(
                f"LinkPredictor returns each rank's share of the mean over all pairs, but the strategy has "
                f"scale_loss={scale!r}; use HaloQuantStrategy(scale_loss='share') (in a config: "
                "trainer.strategy.init_args.scale_loss: share)."
            )

    @override
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        logits = self.score(batch)
        per_pair = F.binary_cross_entropy_with_logits(logits, batch.edge_label.to(logits.dtype), reduction="none")
        loss = global_mean(per_pair)
        self.log("train_loss", loss.detach(), reduce_fx="sum", sync_dist=True, prog_bar=True, batch_size=1)
        return loss

    def _evaluate(self, batch: Any, prefix: str) -> None:
        logits, label = self.score(batch), batch.edge_label.long()
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
        return batch.edge_label_index, self.score(batch).sigmoid()

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
