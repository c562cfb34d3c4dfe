"""A PyG-style Lightning script written against ``pytorch_lightning`` (as PyG's own examples are).

    python examples/pyg_pytorch_lightning.py --devices 2 --epochs 50

Plain PyG code on the classic namespace: the only lightning-halo lines are the data module
and the strategy name, taken from ``lightning_halo.pytorch_lightning`` (the same classes, built
on ``pytorch_lightning``).
"""

from __future__ import annotations

import argparse

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch_geometric.nn import GraphSAGE
from torchmetrics import Accuracy

from lightning_halo.pytorch_lightning import HaloDataModule


class Model(pl.LightningModule):
    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 64, num_layers: int = 2):
        super().__init__()
        self.gnn = GraphSAGE(in_channels, hidden_channels, num_layers, out_channels, dropout=0.5)
        self.val_acc = Accuracy(task="multiclass", num_classes=out_channels)
        self.test_acc = Accuracy(task="multiclass", num_classes=out_channels)

    def forward(self, x, edge_index):
        return self.gnn(x, edge_index)

    def training_step(self, data, batch_idx):
        y_hat = self(data.x, data.edge_index)[data.train_mask]
        return F.cross_entropy(y_hat, data.y[data.train_mask])

    def validation_step(self, data, batch_idx):
        y_hat = self(data.x, data.edge_index)[data.val_mask]
        self.val_acc(y_hat.softmax(dim=-1), data.y[data.val_mask])
        self.log("val_acc", self.val_acc, prog_bar=True, batch_size=1)

    def test_step(self, data, batch_idx):
        y_hat = self(data.x, data.edge_index)[data.test_mask]
        self.test_acc(y_hat.softmax(dim=-1), data.y[data.test_mask])
        self.log("test_acc", self.test_acc, prog_bar=True, batch_size=1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01, weight_decay=5e-4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=50)
    args = parser.parse_args()
    pl.seed_everything(0)
    datamodule = HaloDataModule("cora")
    model = Model(datamodule.num_features, datamodule.num_classes)
    trainer = pl.Trainer(
        strategy="halo_exact",  # registered with pytorch_lightning too: bits=32, equals one process
        accelerator="cpu",
        devices=args.devices,
        max_epochs=args.epochs,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(model, datamodule)
    result = trainer.test(model, datamodule, verbose=False)[0]
    if trainer.is_global_zero:
        print(f"test accuracy {result['test_acc']:.4f}")


if __name__ == "__main__":
    main()
