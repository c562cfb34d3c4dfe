"""LightningModules with multi-step layers (APPNP, GCNII) written as plain PyG code, for accuracy and resume tests."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import APPNP, GCN2Conv
from torchmetrics.classification import MulticlassAccuracy

from examples.train_cora import GCN


class _Base(L.LightningModule):
    def __init__(self, n_cls: int, lr: float = 0.01) -> None:
        super().__init__()
        self.lr = lr
        self.val_acc = MulticlassAccuracy(n_cls, average="micro")
        self.test_acc = MulticlassAccuracy(n_cls, average="micro")

    def training_step(self, batch, _):
        out = self(batch.x, batch.edge_index)
        return F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])

    def validation_step(self, batch, _):
        self.val_acc(self(batch.x, batch.edge_index)[batch.val_mask], batch.y[batch.val_mask])
        self.log("val_acc", self.val_acc, batch_size=1)

    def test_step(self, batch, _):
        self.test_acc(self(batch.x, batch.edge_index)[batch.test_mask], batch.y[batch.test_mask])
        self.log("test_acc", self.test_acc, batch_size=1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr, weight_decay=5e-4)


class APPNPNet(_Base):
    """Predict then propagate (Gasteiger et al. 2019): an MLP, then 10 propagation steps in one layer."""

    def __init__(self, d_in: int, hidden: int, n_cls: int, k: int = 10, alpha: float = 0.1, dropout: float = 0.5,
                 input_dropout: float = 0.0):  # fmt: skip
        super().__init__(n_cls)
        self.lin1, self.lin2 = nn.Linear(d_in, hidden), nn.Linear(hidden, n_cls)
        self.prop, self.dropout, self.input_dropout = APPNP(K=k, alpha=alpha), dropout, input_dropout

    def forward(self, x, edge_index):
        x = F.dropout(x, self.input_dropout, self.training)
        x = F.dropout(self.lin1(x).relu(), self.dropout, self.training)
        return self.prop(self.lin2(x), edge_index)


class GCNIINet(_Base):
    """GCNII (Chen et al. 2020): initial residual and identity mapping over 8 GCN2Conv layers."""

    def __init__(self, d_in: int, hidden: int, n_cls: int, layers: int = 8, alpha: float = 0.1, theta: float = 0.5,
                 dropout: float = 0.6, input_dropout: float = 0.0):  # fmt: skip
        super().__init__(n_cls)
        self.lin1, self.lin2 = nn.Linear(d_in, hidden), nn.Linear(hidden, n_cls)
        self.convs = nn.ModuleList(GCN2Conv(hidden, alpha, theta, layer=i + 1) for i in range(layers))
        self.dropout, self.input_dropout = dropout, input_dropout

    def forward(self, x, edge_index):
        x = F.dropout(x, self.input_dropout, self.training)
        x0 = h = self.lin1(x).relu()
        for conv in self.convs:
            h = F.dropout(h, self.dropout, self.training)
            h = conv(h, x0, edge_index).relu()
        return self.lin2(F.dropout(h, self.dropout, self.training))


MODELS = {"gcn": GCN, "appnp": APPNPNet, "gcnii": GCNIINet}
