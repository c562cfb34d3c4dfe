"""HaloPredictionWriter: the predictions of the whole graph, in global node order, in one file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from lightning_halo.data.predictions import PredictionError, gather_predictions


def describe(prediction: Any) -> str:
    """A short description of a gathered prediction, for the line the writer prints.

    Example:
        >>> describe({"logits": torch.zeros(5, 3), "ids": torch.arange(5)})
        "{'logits': float32 [5, 3], 'ids': int64 [5]}"
    """
    if isinstance(prediction, torch.Tensor):
        return f"{str(prediction.dtype).replace('torch.', '')} {list(prediction.shape)}"
    if isinstance(prediction, dict):
        return "{" + ", ".join(f"{k!r}: {describe(v)}" for k, v in prediction.items()) + "}"
    inner = ", ".join(describe(v) for v in prediction)
    return f"[{inner}]" if isinstance(prediction, list) else f"({inner})"


class HaloPredictionWriter(BasePredictionWriter):
    r"""Writes ``trainer.predict``'s output for the whole graph to one file, in global node order.

    Each rank predicts the nodes of its partition; at the end of its (single) predict batch
    the rows of all ranks are gathered to rank 0 (:func:`~lightning_halo.data.predictions.gather_predictions`),
    which saves them with ``torch.save`` and prints the path. The file holds what
    ``predict_step`` returns, with every tensor ``[n_inner, ...]`` replaced by ``[N, ...]``
    (row ``i`` is node ``i`` of the graph), on the CPU:
    ``torch.load(path, weights_only=True)`` gives the tensor (or the dict, tuple or list of
    tensors). The ``lightning-halo predict`` command adds this writer unless the configuration
    has a prediction writer of its own.

    Args:
        output_dir (str, optional): the directory of the file. Defaults to the Trainer's
            ``log_dir`` (the logger's run folder, or ``default_root_dir`` without a logger).
        filename (str, optional): the file's name. (default: ``"predictions.pt"``)

    Example:
        >>> trainer = L.Trainer(strategy=HaloQuantStrategy(bits=32), devices=2,
        ...                     callbacks=[HaloPredictionWriter()])
        >>> trainer.predict(model, datamodule=dm, ckpt_path="last.ckpt")  # doctest: +SKIP
        predictions of 2708 nodes (float32 [2708, 7]) written to lightning_logs/predictions.pt
    """

    def __init__(self, output_dir: Optional[str] = None, filename: str = "predictions.pt") -> None:
        super().__init__(write_interval="batch")
        if not filename or Path(filename).name != filename:
            raise ValueError(f"filename must be a file name without a directory, got {filename!r}; use output_dir")
        self.output_dir = output_dir
        self.filename = filename
        #: Where the last predictions were written (rank 0; ``None`` elsewhere and before).
        self.path: Optional[Path] = None

    def target(self, trainer: pl.Trainer) -> Path:
        """The file the predictions go to (a collective without ``output_dir``: call it on every rank)."""
        directory = self.output_dir if self.output_dir is not None else (trainer.log_dir or trainer.default_root_dir)
        return Path(directory) / self.filename

    @override
    def write_on_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        prediction: Any,
        batch_indices: Optional[Any],
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        if batch_idx > 0 or dataloader_idx > 0:  # the same on every rank: no rank is left in the collective
            raise PredictionError(
                "HaloPredictionWriter writes one batch per rank, the rank's whole partition (as HaloDataModule yields); "
                f"this predict run has another (dataloader {dataloader_idx}, batch {batch_idx})"
            )
        gathered = gather_predictions(prediction, batch, dst=0)
        path = self.target(trainer)  # on every rank: Trainer.log_dir is a broadcast from rank 0
        if not trainer.is_global_zero:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        torch.save(gathered, partial)
        os.replace(partial, path)  # never a half-written file under the final name
        self.path = path
        rank_zero_info(f"predictions of {int(batch.num_nodes_global)} nodes ({describe(gathered)}) written to {path}")
