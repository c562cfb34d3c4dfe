"""The model zoo: plain PyG node classifiers that train on one process and log global metrics."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_halo import HaloDataModule
from lightning_halo.models import GAT, GCN, GIN, GraphSAGE, NodeClassifier
from tests.support.graphs import awkward_graph


@pytest.mark.parametrize("cls", [GCN, GraphSAGE, GAT, GIN])
@pytest.mark.parametrize("norm", [None, "layer", "batch"])
def test_models_train_and_log(cls, norm, tmp_path) -> None:
    L.seed_everything(0)
    data = awkward_graph(1, dtype=torch.float32)
    dm = HaloDataModule(data, cache_dir=str(tmp_path))
    model = cls(in_channels=dm.num_features, out_channels=dm.num_classes, hidden_channels=16, norm=norm)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(model, datamodule=dm)
    metrics = trainer.callback_metrics
    assert 0.0 <= float(metrics["val_acc"]) <= 1.0 and torch.isfinite(metrics["train_loss"])
    test = trainer.test(model, datamodule=dm, verbose=False)[0]
    assert "test_acc" in test
    ids, logits = trainer.predict(model, datamodule=dm)[0]
    assert logits.shape == (data.num_nodes, dm.num_classes) and torch.equal(ids, torch.arange(data.num_nodes))


def test_binary_task_logs_auroc(tmp_path) -> None:
    data = awkward_graph(1, num_classes=2, dtype=torch.float32)
    dm = HaloDataModule(data, cache_dir=str(tmp_path))
    model = GCN(in_channels=dm.num_features, out_channels=2, hidden_channels=8)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(model, datamodule=dm)
    assert "val_auroc" in trainer.callback_metrics


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="number of classes"):
        GCN(in_channels=4, out_channels=1)
    with pytest.raises(ValueError, match="norm"):
        GCN(in_channels=4, out_channels=3, norm="group")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="divisible by heads"):
        GAT(in_channels=4, out_channels=3, hidden_channels=10, heads=4)
    with pytest.raises(NotImplementedError, match="pyg_model"):
        NodeClassifier(in_channels=4, out_channels=3)
