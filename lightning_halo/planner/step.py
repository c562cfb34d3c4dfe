"""The fixed cost of one training step through Lightning and the strategy, on a tiny graph.

What an epoch costs beyond its kernels at any size (Lightning's loop, the strategy's hooks,
the optimizer's Python, logging) is measured by training a 2-layer GCN of hidden 16 on a random
graph of 2,000 nodes for a few epochs in this process (one rank, no peers): its kernels take
well under a millisecond, so its shortest epoch is that fixed cost.
"""

from __future__ import annotations

import contextlib
import io
import logging
import statistics
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any


def tiny_graph(nodes: int = 2000, degree: int = 8, features: int = 16, classes: int = 4) -> Any:
    """A random graph with features, labels and masks, the size :func:`measure_step_seconds` trains on."""
    import torch
    from torch_geometric.data import Data
    from torch_geometric.utils import to_undirected

    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, nodes, (nodes * degree // 2,), generator=g)
    dst = torch.randint(0, nodes, (nodes * degree // 2,), generator=g)
    keep = src != dst
    edge_index = to_undirected(torch.stack([src[keep], dst[keep]]), num_nodes=nodes)
    mask = torch.rand(nodes, generator=g)
    return Data(x=torch.randn(nodes, features, generator=g), edge_index=edge_index,
                y=torch.randint(0, classes, (nodes,), generator=g), train_mask=mask < 0.6,
                val_mask=(mask >= 0.6) & (mask < 0.8), test_mask=mask >= 0.8)  # fmt: skip


@contextlib.contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Lightning's info lines off while the tiny run trains, and its logger's level as it was afterwards (also on error)."""
    logger = logging.getLogger("lightning.pytorch")
    before = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(before)


def measure_step_seconds(epochs: int = 12) -> float:
    """Shortest training step of the tiny model after two warm-up epochs (the noise of a busy host only adds).

    Args:
        epochs (int, optional): epochs trained; the first two are not counted. (default: ``12``)
    """
    import lightning as L

    from lightning_halo import HaloDataModule, HaloQuantStrategy
    from lightning_halo.models import GCN

    times: list[float] = []

    class Clock(L.Callback):
        start = 0.0

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            times.append(time.perf_counter() - self.start)

    quiet = contextlib.redirect_stdout(io.StringIO())  # the run's own report would corrupt `plan --json`
    with tempfile.TemporaryDirectory(prefix="halo-calibrate-") as tmp, warnings.catch_warnings(), quiet, _quiet_lightning():
        warnings.simplefilter("ignore")
        dm = HaloDataModule(tiny_graph(), num_parts=1, cache_dir=tmp)
        model = GCN(16, 4, hidden_channels=16)
        trainer = L.Trainer(
            strategy=HaloQuantStrategy(bits=32), accelerator="cpu", devices=1, max_epochs=epochs, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, limit_val_batches=0, callbacks=[Clock()], default_root_dir=tmp,
        )  # fmt: skip
        trainer.fit(model, datamodule=dm)
    return min(times[2:]) if len(times) > 2 else statistics.median(times)
