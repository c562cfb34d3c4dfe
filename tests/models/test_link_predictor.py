"""LinkPredictor: options checked, decoders, and a single-process fit (gather_rows is z[ids] there)."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_halo.data.link_datamodule import HaloLinkDataModule
from lightning_halo.models import LinkPredictor


def test_options_are_checked_and_decoders_score_pairs() -> None:
    with pytest.raises(ValueError, match="encoder must be"):
        LinkPredictor(4, encoder="gat")  # type: ignore[arg-type]
    z_u, z_v = torch.randn(5, 8), torch.randn(5, 8)
    dot = LinkPredictor(4, out_channels=8)
    torch.testing.assert_close(dot.decode(z_u, z_v), (z_u * z_v).sum(-1))
    assert LinkPredictor(4, out_channels=8, decoder="mlp").decode(z_u, z_v).shape == (5,)


def test_single_process_fit_learns(tmp_path) -> None:
    torch.manual_seed(0)
    dm = HaloLinkDataModule("cora", cache_dir=str(tmp_path))
    model = LinkPredictor(dm.num_features, hidden_channels=32, out_channels=32)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=30, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(model, datamodule=dm)
    got = trainer.test(model, datamodule=dm, verbose=False)[0]
    assert got["test_auroc"] > 0.75 and 0 < got["test_hits@50"] <= 1
