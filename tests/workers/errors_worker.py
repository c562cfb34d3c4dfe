"""Worker for error-path tests: runs named scenarios that must fail cleanly on every rank.

    python tests/workers/errors_worker.py --out DIR --scenarios no_mp tuple_gcn ...

Writes DIR/<scenario>/rank<r>.txt with "<ExceptionType>: <message>" or "OK".
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
import warnings
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import DirGNNConv, EGConv, GCNConv, SAGEConv

from tests.support.exit import shutdown
from tests.support.trainer import quiet_trainer
from lightning_halo import HaloDataModule, HaloQuantStrategy
from tests.support.graphs import awkward_graph
from tests.support.cache import shared_cache


class Module(L.LightningModule):
    def __init__(self, body: nn.Module, call: str = "plain", return_none: bool = False) -> None:
        super().__init__()
        self.body, self.call, self.return_none = body, call, return_none

    def forward(self, x, edge_index):
        if self.call == "tuple":
            return self.body(F.relu(self.body.lin(x)) if hasattr(self.body, "lin") else x, edge_index)
        if self.call == "rows":
            return self.body(x[:10], edge_index)
        return self.body(x, edge_index)

    def training_step(self, batch, _):
        out = self(batch.x, batch.edge_index)
        loss = F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])
        return None if self.return_none else loss

    def validation_step(self, batch, _):
        from torchmetrics.functional.classification import multiclass_accuracy

        out = self(batch.x, batch.edge_index)
        self.log("val_n", float(batch.val_mask.sum()), reduce_fx="sum", sync_dist=True, batch_size=1)
        if batch.val_mask.any():
            self.log("val_acc", multiclass_accuracy(out[batch.val_mask], batch.y[batch.val_mask], out.size(1)), batch_size=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class TupleGCN(nn.Module):
    def __init__(self, d: int, c: int) -> None:
        super().__init__()
        self.conv = GCNConv(d, c)

    def forward(self, x, edge_index):
        return self.conv((x, x), edge_index)


class NoGraph(nn.Module):
    def __init__(self, d: int, c: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, c)

    def forward(self, x, edge_index):
        return self.lin(x)


def scenario(name: str, world_size: int, cache: str):
    data = awkward_graph(world_size, dtype=torch.float32)
    d, c = data.num_features, int(data.y.max()) + 1
    strategy: object = HaloQuantStrategy()
    dm = HaloDataModule(data, cache_dir=cache)
    if name == "no_mp":
        module = Module(NoGraph(d, c))
    elif name == "unsupported_layer":
        module = Module(EGConv(d, c, num_heads=1, num_bases=1))
    elif name == "tuple_gcn":
        module = Module(TupleGCN(d, c))
    elif name == "wrong_rows":
        module = Module(SAGEConv(d, c), call="rows")
    elif name == "return_none":
        module = Module(SAGEConv(d, c), return_none=True)
    elif name == "num_parts":
        module = Module(SAGEConv(d, c))
        dm = HaloDataModule(data, cache_dir=cache, num_parts=world_size + 1)
    elif name == "plan_mismatch":  # a different graph on one rank (e.g. a stale copy on one node)
        if int(os.environ["RANK"]) == 1:
            data.edge_index = torch.cat([data.edge_index, torch.tensor([[0], [world_size * 40]])], dim=1)
            dm = HaloDataModule(data, cache_dir=cache)
        module = Module(SAGEConv(d, c))
    elif name == "empty_masks":  # no validation node anywhere, and one rank without train nodes
        data.val_mask[:] = False
        dm = HaloDataModule(data, cache_dir=cache)
        module = Module(SAGEConv(d, c))
    elif name == "unused_parameter":  # DirGNNConv switches its inner layers' root weight off: lin_r gets no gradient
        module = Module(DirGNNConv(SAGEConv(d, c)))
    elif name == "registered_name":
        module = Module(SAGEConv(d, c))
        strategy = "halo_quant"
    else:
        raise KeyError(name)
    return module, dm, strategy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenarios", nargs="+", required=True)
    args = parser.parse_args()
    world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    warnings.filterwarnings("ignore")
    for name in args.scenarios:
        module, dm, strategy = scenario(name, world_size, shared_cache(Path(args.out) / "cache"))
        val = {} if name == "empty_masks" else {"limit_val_batches": 0}
        trainer = quiet_trainer(world_size, strategy=strategy, max_epochs=2, **val)
        t0 = time.time()
        try:
            trainer.fit(module, datamodule=dm)
            msg = f"OK {type(trainer.strategy).__name__}"
        except Exception as err:  # noqa: BLE001 - the message is the test subject
            msg = f"{type(err).__name__}: {err}"
            if os.environ.get("HALO_TEST_TRACEBACK"):
                traceback.print_exc()
        target = Path(args.out) / name
        target.mkdir(parents=True, exist_ok=True)
        (target / f"rank{rank}.txt").write_text(msg)
        print(f"scenario {name}: {time.time() - t0:.1f}s {msg[:100]}", flush=True)


if __name__ == "__main__":
    main()
    shutdown()
