"""``lightning-halo link fit``: the link-prediction config trains, validates and reports the pair traffic."""

from __future__ import annotations

import pytest

from tests.test_cli import ROOT, cli

CONFIG = str(ROOT / "examples" / "configs" / "link_gcn.yaml")


def test_link_verb_is_listed_and_explains_itself(tmp_path) -> None:
    usage = cli("link", "--help", tmp_path=tmp_path)
    assert usage.returncode == 0 and "link {fit,validate,test,predict}" in usage.stdout


def test_link_config_with_wrong_loss_scaling_is_refused(tmp_path) -> None:
    got = cli("link", "fit", "--config", CONFIG, "--trainer.devices", "1", "--trainer.max_epochs", "1",
              "--trainer.strategy.init_args.scale_loss", "train_mean", tmp_path=tmp_path)  # fmt: skip
    assert got.returncode != 0 and "scale_loss='share'" in got.stderr


@pytest.mark.slow
@pytest.mark.multiprocess
def test_link_config_trains_on_two_processes(tmp_path) -> None:
    got = cli("link", "fit", "--config", CONFIG, "--trainer.max_epochs", "10", tmp_path=tmp_path)
    assert got.returncode == 0, got.stderr[-3000:]
    text = got.stdout + got.stderr
    assert "gather_rows/fwd" in text and "val_auroc" in text
