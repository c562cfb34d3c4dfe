"""Train a plain PyG GCN on the bundled Cora graph with 2 CPU processes and the halo strategy.

    python examples/train_cora.py --devices 2 --bits 32 --epochs 100

Prints, per epoch: training loss, validation accuracy and the halo traffic (MB sent by all
ranks); at the end the traffic summary and the test accuracy.
"""

from __future__ import annotations

import argparse
import warnings

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.warnings import PossibleUserWarning
from torch_geometric.nn import GCNConv
from torchmetrics.classification import MulticlassAccuracy

from lightning_halo import EpochPrinter, HaloDataModule, HaloQuantStrategy


class GCN(L.LightningModule):
    """Ordinary PyG full-graph code: nothing here knows about partitions."""

    def __init__(self, d_in: int, hidden: int, n_cls: int, lr: float = 0.01, dropout: float = 0.5) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.conv1, self.conv2 = GCNConv(d_in, hidden), GCNConv(hidden, n_cls)
        self.val_acc = MulticlassAccuracy(n_cls, average="micro")
        self.test_acc = MulticlassAccuracy(n_cls, average="micro")

    def forward(self, x, edge_index):
        h = F.dropout(self.conv1(x, edge_index).relu(), self.hparams.dropout, self.training)
        return self.conv2(h, edge_index)

    def training_step(self, batch, _):
        out = self(batch.x, batch.edge_index)
        loss = F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])
        self.log("train_loss", loss, batch_size=int(batch.train_mask.sum()), prog_bar=True)
        return loss

    def validation_step(self, batch, _):
        out = self(batch.x, batch.edge_index)
        self.val_acc(out[batch.val_mask], batch.y[batch.val_mask])  # each rank: its own nodes
        self.log("val_acc", self.val_acc, batch_size=1, prog_bar=True)  # Metric object: global value

    def test_step(self, batch, _):
        out = self(batch.x, batch.edge_index)
        self.test_acc(out[batch.test_mask], batch.y[batch.test_mask])
        self.log("test_acc", self.test_acc, batch_size=1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=5e-4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="processes per node")
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--bits", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    if args.num_nodes == 1:
        # Where SLURM is installed, Lightning hints that `srun` is not used. On one node Lightning's own
        # launcher starts the processes and needs no srun (multi-node runs do: docs/slurm.md).
        warnings.filterwarnings("ignore", message="The `srun` command is available", category=PossibleUserWarning)
    L.seed_everything(args.seed, workers=True)
    dm = HaloDataModule("cora")
    model = GCN(dm.num_features, args.hidden, dm.num_classes)
    trainer = L.Trainer(
        strategy=HaloQuantStrategy(bits=args.bits),
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        max_epochs=args.epochs,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        callbacks=[EpochPrinter()],  # one line per epoch on rank 0 (no progress bar)
    )
    trainer.fit(model, datamodule=dm)
    result = trainer.test(model, datamodule=dm, verbose=False)
    if trainer.is_global_zero:
        print(f"test_acc {result[0]['test_acc']:.4f}")
    # No destroy_process_group() needed: the strategy releases the process groups at exit.


if __name__ == "__main__":
    main()
