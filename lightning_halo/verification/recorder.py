"""The Lightning side of :func:`~lightning_halo.verify`: record one training step of one rank."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.data.data import BaseData
from typing_extensions import override

from lightning_halo.loss import scaled_loss
from lightning_halo.verification.options import result_options

#: The dropout functions of ``torch.nn.functional`` (``nn.Dropout`` and PyG's layers call them).
DROPOUTS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")


def _keep(input: Tensor, *args: Any, **kwargs: Any) -> Tensor:  # noqa: A002 - F.dropout's own name
    return input


@contextlib.contextmanager
def no_dropout() -> Iterator[None]:
    """Dropout (``nn.Dropout``, ``F.dropout`` in ``forward``, attention dropout in PyG's layers) as the identity.

    Its random masks are drawn per row, so one process and :math:`P` draw different ones:
    verifying needs both runs to compute the same function. The model stays in training mode.
    """
    saved = {name: getattr(F, name) for name in DROPOUTS}
    try:
        for name in DROPOUTS:
            setattr(F, name, _keep)
        yield
    finally:
        for name, fn in saved.items():
            setattr(F, name, fn)


def tensors_of(value: Any, depth: int = 2) -> list[Tensor]:
    """The tensors in ``value`` (a tensor, or tuples, lists and dicts of them, ``depth`` levels deep: a
    heterogeneous layer's ``(x_src, x_dst)`` or ``x_dict`` among its arguments), detached on the CPU."""
    if isinstance(value, Tensor):
        return [value.detach().cpu().clone()]
    if depth == 0:
        return []
    items = list(value.values()) if isinstance(value, dict) else list(value) if isinstance(value, (tuple, list)) else []
    return [t for item in items for t in tensors_of(item, depth - 1)]


def _holds_data(args: tuple, kwargs: dict) -> bool:
    return any(isinstance(a, BaseData) for a in (*args, *kwargs.values()))  # a Data or a HeteroData


class StepRecorder(pl.Callback):
    """Records the first training step of this rank and saves it to ``path`` (``torch.save``).

    The record: the global ids of the rank's rows (``batch.n_id``; per node type on a heterogeneous
    partition, ``types``), every module call of the
    step in the order they end (name, class, inputs, outputs), the loss ``training_step`` returned, what the
    rank back-propagates (:func:`~lightning_halo.loss.scaled_loss`, by the strategy's ``scale_loss``), the
    parameters' gradients, and the strategy's options that change the result (as the rank built it).
    Hooks are added after the strategy's: inputs are seen before the halo is appended, outputs
    after they are cut back to the rank's rows. The Trainer's strategy is a
    :class:`~lightning_halo.HaloQuantStrategy`.

    Args:
        path (str): where to save the record.
        dtype (torch.dtype): the floating tensors of the batch are cast to it.
    """

    def __init__(self, path: str | Path, dtype: torch.dtype) -> None:
        self.path, self.dtype = Path(path), dtype
        self.record: dict[str, Any] = {"calls": [], "grads": {}, "dtype": dtype}
        self._handles: list[Any] = []
        self._open: dict[str, list[dict[str, Any]]] = {}  # calls begun and not yet ended, by module name
        self._seq = 0  # when calls begin and end, to tell nested calls from earlier ones
        self._done = False

    def _hook(self, module: pl.LightningModule) -> None:
        for name, sub in module.named_modules():
            self._handles.append(sub.register_forward_pre_hook(self._inputs(name), prepend=True, with_kwargs=True))
            self._handles.append(sub.register_forward_hook(self._outputs(name), with_kwargs=True))

    def _inputs(self, name: str):  # noqa: ANN202 - a hook
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            if not _holds_data(args, kwargs):  # the LightningModule called by Lightning with the batch: not a layer
                call = {"name": name, "cls": type(module).__name__, "inputs": tensors_of([*args, *kwargs.values()])}
                call["start"] = self._tick()
                self._open.setdefault(name, []).append(call)

        return hook

    def _outputs(self, name: str):  # noqa: ANN202 - a hook
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if not _holds_data(args, kwargs) and self._open.get(name):
                call = self._open[name].pop()
                call["outputs"] = tensors_of(output)
                call["end"] = self._tick()
                # in the order calls *end*: a module nested in another comes first, so the innermost differing
                # call is the one named
                self.record["calls"].append(call)

        return hook

    def _tick(self) -> int:
        self._seq += 1
        return self._seq

    def _unhook(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if self._done:
            return
        batch.apply(lambda t: t.to(self.dtype) if t.is_floating_point() else t)
        if hasattr(batch, "node_types"):  # a heterogeneous partition: each type's rows, ids within the type
            self.record["types"] = {t: (batch[t].n_id[: int(batch[t].n_inner)].cpu().clone(), int(batch[t].n_inner))
                                    for t in batch.node_types}  # fmt: skip
            self.record.update(rank=trainer.global_rank)
        else:
            self.record.update(rank=trainer.global_rank, n_id=batch.n_id.cpu().clone(), n_inner=int(batch.n_inner))
        self.record["strategy"] = result_options(trainer.strategy.init_args)
        self._hook(pl_module)

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if self._done:
            return
        self._unhook()
        for name, p in pl_module.named_parameters():
            if p.grad is not None:
                self.record["grads"][name] = p.grad.detach().cpu().clone()
            elif p.requires_grad:
                self.record.setdefault("no_grad", []).append(name)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._done:
            return
        self._unhook()
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, Tensor):
            self.record["loss"] = float(loss)
            scale = trainer.strategy.scale_loss
            self.record["scaled_loss"] = float(scaled_loss(loss.detach(), scale, trainer.world_size, batch))
        torch.save(self.record, self.path)
        self._done = True


def trainer_options(root: Path) -> dict[str, Any]:
    """One step, nothing else: no validation, logger, checkpoint, progress bar or summary."""
    return dict(
        max_steps=1, limit_val_batches=0, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root),
    )  # fmt: skip

