"""PyG's examples/link_pred.py (GCN encoder, dot-product decoder, negatives each epoch) on partitions.

    python examples/link_pred.py --devices 2 --bits 32 --epochs 100
    python examples/link_pred.py --devices 2 --bits 1 --epochs 100 --data pyg:Actor:../shared/datasets/Actor

The model is ordinary PyG code plus one call: ``lightning_halo.gather_rows(z, pairs)`` fetches
the rows of both endpoints of every pair (remote ones from their owners). Prints, per epoch, the
training loss and validation ROC-AUC; at the end the traffic summary (the pair exchange is the
``gather_rows`` rows) and the test ROC-AUC / Hits@50.
"""

from __future__ import annotations

import argparse
import warnings

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.warnings import PossibleUserWarning
from torch_geometric.nn import GCNConv
from torchmetrics.classification import BinaryAUROC

from lightning_halo import EpochPrinter, HaloLinkDataModule, HaloQuantStrategy, gather_rows, global_mean
from lightning_halo.link.metrics import HitsAtK


class Net(L.LightningModule):
    """The encoder and decoder of PyG's example; each rank scores the pairs it owns."""

    def __init__(self, d_in: int, hidden: int = 128, out: int = 64, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.conv1, self.conv2 = GCNConv(d_in, hidden), GCNConv(hidden, out)
        self.val_auc, self.test_auc, self.test_hits = BinaryAUROC(), BinaryAUROC(), HitsAtK(50)

    def forward(self, x, edge_index, edge_label_index):
        z = self.conv2(self.conv1(x, edge_index).relu(), edge_index)
        h = gather_rows(z, edge_label_index)  # [2, M, d]: global ids, any rank's nodes
        return (h[0] * h[1]).sum(-1)

    def training_step(self, batch, _):
        logits = self(batch.x, batch.edge_index, batch.edge_label_index)
        per_pair = F.binary_cross_entropy_with_logits(logits, batch.edge_label, reduction="none")
        loss = global_mean(per_pair)  # this rank's share of the mean over all pairs: scale_loss="share"
        self.log("train_loss", loss.detach(), reduce_fx="sum", sync_dist=True, batch_size=1, prog_bar=True)
        return loss

    def validation_step(self, batch, _):
        self.val_auc(self(batch.x, batch.edge_index, batch.edge_label_index), batch.edge_label.long())
        self.log("val_auroc", self.val_auc, batch_size=1, prog_bar=True)  # Metric object: every pair once

    def test_step(self, batch, _):
        logits, label = self(batch.x, batch.edge_index, batch.edge_label_index), batch.edge_label.long()
        self.test_auc(logits, label)
        self.test_hits(logits, label)
        self.log_dict({"test_auroc": self.test_auc, "test_hits@50": self.test_hits}, batch_size=1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="cora", help="a graph source, as for HaloDataModule")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--bits", type=int, default=32, help="bits of halo and pair rows in training")
    parser.add_argument("--epochs", type=int, default=100)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=PossibleUserWarning)
    L.seed_everything(0, verbose=False)
    dm = HaloLinkDataModule(args.data, num_val=0.05, num_test=0.1)  # RandomLinkSplit's split, seeded
    trainer = L.Trainer(
        accelerator="cpu", devices=args.devices, max_epochs=args.epochs, check_val_every_n_epoch=10,
        strategy=HaloQuantStrategy(bits=args.bits, scale_loss="share"), logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1, callbacks=[EpochPrinter()],
    )  # fmt: skip
    model = Net(dm.num_features)
    trainer.fit(model, datamodule=dm)
    trainer.test(model, datamodule=dm)


if __name__ == "__main__":
    main()
