"""HaloPredictionWriter: one file in global node order, where the run's logs go, its path said."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from lightning_halo import HaloDataModule, HaloPredictionWriter
from lightning_halo.data.predictions import PredictionError
from lightning_halo.models import GCN
from tests.support.graphs import awkward_graph


class TwoOutputs(GCN):
    def predict_step(self, batch, batch_idx):
        out = super().predict_step(batch, batch_idx)
        return {"logits": out, "classes": out.argmax(-1)}


def _trainer(tmp_path: Path, **kwargs) -> L.Trainer:
    options = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                   default_root_dir=str(tmp_path / "root"))  # fmt: skip
    options.update(kwargs)
    return L.Trainer(**options)


def test_predictions_of_the_whole_graph_in_one_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = awkward_graph(1, dtype=torch.float32)
    dm = HaloDataModule(data, cache_dir=str(tmp_path / "cache"))
    model = TwoOutputs(dm.num_features, dm.num_classes, hidden_channels=8)
    writer = HaloPredictionWriter(output_dir=str(tmp_path / "out"))
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):  # whatever an earlier test left as its level
        _trainer(tmp_path, callbacks=[writer]).predict(model, datamodule=dm, return_predictions=False)
    path = tmp_path / "out" / "predictions.pt"
    assert writer.path == path
    saved = torch.load(path, weights_only=True)
    model.eval()
    expected = model(data.x, data.edge_index).detach()
    torch.testing.assert_close(saved["logits"], expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(saved["classes"], saved["logits"].argmax(-1)) and saved["classes"].dtype == torch.int64
    said = f"predictions of {data.num_nodes} nodes ({{'logits': float32 [{data.num_nodes}, 3], 'classes': int64 [{data.num_nodes}]}}) written to {path}"
    assert said in caplog.text
    assert sorted(p.name for p in path.parent.iterdir()) == ["predictions.pt"], "no partial file left behind"


def test_default_file_is_in_the_log_directory(tmp_path: Path) -> None:
    dm = HaloDataModule(awkward_graph(1, dtype=torch.float32), cache_dir=str(tmp_path / "cache"))
    model = GCN(dm.num_features, dm.num_classes, hidden_channels=8)
    for logger, where in ((False, tmp_path / "root"), (CSVLogger(str(tmp_path / "logs"), name="run"), None)):
        trainer = _trainer(tmp_path, logger=logger, callbacks=[HaloPredictionWriter(filename="p.pt")])
        trainer.predict(model, datamodule=dm)
        expected = (where or Path(trainer.log_dir)) / "p.pt"
        assert expected.is_file() and (where is not None or "logs/run/version_0" in str(expected))


def test_more_than_one_batch_per_rank_is_refused(tmp_path: Path) -> None:
    dm = HaloDataModule(awkward_graph(1, dtype=torch.float32), cache_dir=str(tmp_path / "cache"))
    dm.setup("predict")
    two = DataLoader([dm.partition, dm.partition], batch_size=None, collate_fn=lambda b: b)
    model = GCN(dm.num_features, dm.num_classes, hidden_channels=8)
    with pytest.raises(PredictionError, match="one batch per rank"):
        _trainer(tmp_path, callbacks=[HaloPredictionWriter(output_dir=str(tmp_path))]).predict(model, dataloaders=two)


def test_filename_is_a_name() -> None:
    with pytest.raises(ValueError, match="without a directory"):
        HaloPredictionWriter(filename="out/p.pt")
