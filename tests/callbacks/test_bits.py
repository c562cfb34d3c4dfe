"""The monitored metric of bits="adaptive" reaches the exchange after each validation of a fit, first among the
callbacks (a ModelCheckpoint saving at the same hook keeps it), and a metric the module does not log is refused
naming what it logs."""

from __future__ import annotations

import lightning as L
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_halo import HaloDataModule, HaloQuantStrategy
from lightning_halo.callbacks.bits import HaloBitMonitor
from tests.support.lightning_models import MODELS


def _fit(strategy: HaloQuantStrategy, tmp_path, epochs: int = 2) -> L.Trainer:
    L.seed_everything(0)
    dm = HaloDataModule("cora", cache_dir=str(tmp_path / "cache"))
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_epochs=epochs, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=1,
                        callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_on_train_epoch_end=False)])  # fmt: skip
    trainer.fit(MODELS["gcn"](dm.num_features, 16, dm.num_classes), datamodule=dm)
    return trainer


def test_each_validation_of_the_fit_hands_its_value_over_first(tmp_path) -> None:
    strategy = HaloQuantStrategy(bits="adaptive", bit_monitor="val_acc", bit_mode="max", bit_patience=2)
    seen = []
    strategy.exchanger.observe_progress = seen.append  # type: ignore[method-assign]
    trainer = _fit(strategy, tmp_path, epochs=3)
    assert isinstance(trainer.callbacks[0], HaloBitMonitor)
    assert sum(isinstance(cb, HaloBitMonitor) for cb in trainer.callbacks) == 1
    # not the sanity check: one value per epoch, the one logged
    assert len(seen) == 3 and seen[-1] == pytest.approx(float(trainer.callback_metrics["val_acc"]))


def test_no_monitor_adds_no_callback(tmp_path) -> None:
    trainer = _fit(HaloQuantStrategy(bits="adaptive"), tmp_path, epochs=1)
    assert not any(isinstance(cb, HaloBitMonitor) for cb in trainer.callbacks)


def test_a_metric_the_module_does_not_log_is_refused_naming_what_it_logs(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"bit_monitor='val_f1' was not logged in validation; the module logs "
                                         r"\[.*'val_acc'.*\]\. Log it in validation_step"):  # fmt: skip
        _fit(HaloQuantStrategy(bits="adaptive", bit_monitor="val_f1"), tmp_path, epochs=1)
