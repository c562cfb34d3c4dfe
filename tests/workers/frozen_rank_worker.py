"""Two local ranks started by Lightning's own launcher; rank 1 freezes inside ``training_step``.

    python tests/workers/frozen_rank_worker.py HALO_TIMEOUT_S

Rank 0 waits for rank 1's halo rows and fails with HaloExchangeError after ``halo_timeout``;
every rank writes its pid to ``pid-<rank>`` in the working directory first.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv

from lightning_halo import HaloDataModule, HaloQuantStrategy


class FreezesOnRank1(L.LightningModule):
    def __init__(self, d_in: int, n_cls: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = GCNConv(d_in, 16), GCNConv(16, n_cls)

    def training_step(self, batch, _):
        Path(f"pid-{self.global_rank}").write_text(str(os.getpid()))
        if self.global_rank == 1:
            time.sleep(3600)  # frozen in user code: never reaches the exchange its peer waits for
        h = self.conv1(batch.x, batch.edge_index).relu()
        out = self.conv2(h, batch.edge_index)
        return F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    dm = HaloDataModule("cora")
    trainer = L.Trainer(
        strategy=HaloQuantStrategy(bits=32, halo_timeout=float(sys.argv[1])),
        accelerator="cpu",
        devices=2,
        max_epochs=1,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    trainer.fit(FreezesOnRank1(dm.num_features, dm.num_classes), datamodule=dm)


if __name__ == "__main__":
    main()
