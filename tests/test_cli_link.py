"""``lightning-halo link``: listed, explained, and a config with the wrong loss scaling refused.

That examples/configs/link_gcn.yaml trains on two processes is tested with every config (tests/test_cli.py).
"""

from __future__ import annotations

from tests.test_cli import ROOT, cli

CONFIG = str(ROOT / "examples" / "configs" / "link_gcn.yaml")


def test_link_verb_is_listed_and_explains_itself(tmp_path) -> None:
    usage = cli("link", "--help", tmp_path=tmp_path)
    assert usage.returncode == 0 and "link {fit,validate,test,predict}" in usage.stdout


def test_link_config_with_wrong_loss_scaling_is_refused(tmp_path) -> None:
    got = cli("link", "fit", "--config", CONFIG, "--trainer.devices", "1", "--trainer.max_epochs", "1",
              "--trainer.strategy.init_args.scale_loss", "train_mean", tmp_path=tmp_path)  # fmt: skip
    assert got.returncode != 0 and "scale_loss='share'" in got.stderr
