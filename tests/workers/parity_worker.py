"""Worker for the parity tests: trains each config for 5 steps with HaloQuantStrategy and records.

    python tests/workers/parity_worker.py --out DIR --configs gcn:2:cora sage:3:awkward ...

Run as one rank of a job (see tests/support/launch.py). Writes DIR/<config>/rank<r>.pt.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

from lightning_halo import HaloDataModule, HaloQuantStrategy
from tests.support.graphs import graph_by_name
from tests.support.models import build_any


class Recorder(L.LightningModule):
    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net
        self.rec: dict[str, object] = {}

    def training_step(self, batch, _):
        out = self.net(batch.x, batch.edge_index, batch.get("edge_attr"))
        loss = F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])
        if self.global_step == 0:
            self.rec["out0"] = out.detach().clone()
            self.rec["loss0"] = float(loss) if batch.train_mask.any() else float("nan")
            self.rec["n_train"] = int(batch.train_mask.sum())
            self.rec["inner_global_id"] = batch.inner_global_id.clone()
        return loss

    def on_before_optimizer_step(self, optimizer):
        if self.global_step == 0:
            self.rec["grad0"] = {k: p.grad.detach().clone() for k, p in self.net.named_parameters()}

    def on_train_end(self):
        self.rec["params"] = {k: p.detach().clone() for k, p in self.net.named_parameters()}

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--configs", nargs="+", required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--bits", type=int, default=32)
    args = parser.parse_args()
    world_size = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    warnings.filterwarnings("ignore")
    for config in args.configs:
        kind, depth, graph = config.split(":")
        data = graph_by_name(graph, world_size)
        net = build_any(f"{kind}:{depth}", data)
        module = Recorder(net)
        dm = HaloDataModule(data, cache_dir=str(Path(args.out) / "cache"))
        trainer = L.Trainer(
            strategy=HaloQuantStrategy(bits=args.bits),
            accelerator="cpu",
            devices=world_size,
            max_epochs=args.steps,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            logger=False,
        )
        trainer.fit(module, datamodule=dm)
        target = Path(args.out) / config.replace(":", "_")
        target.mkdir(parents=True, exist_ok=True)
        torch.save(module.rec, target / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
