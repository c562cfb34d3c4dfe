"""``lightning-halo link``: listed, explained, and a config with the wrong loss scaling refused.

That examples/configs/link_gcn.yaml trains on two processes is tested with every config (tests/cli/test_fit.py).
"""

from __future__ import annotations

from tests.support.cli import ROOT

CONFIG = str(ROOT / "examples" / "configs" / "link_gcn.yaml")


def test_link_verb_explains_itself(lightning_halo_cli) -> None:
    code, out, _ = lightning_halo_cli("link", "--help")
    assert code == 0 and "usage: lightning-halo link {fit,validate,test,predict}" in out
    code, out, err = lightning_halo_cli("link")
    assert code == 2 and out == "" and "usage: lightning-halo link {fit,validate,test,predict}" in err


def test_link_config_with_wrong_loss_scaling_is_refused(lightning_halo_cli) -> None:
    code, _, err = lightning_halo_cli("link", "fit", "--config", CONFIG, "--trainer.devices", "1", "--trainer.max_epochs", "1",
                                      "--trainer.strategy.init_args.scale_loss", "train_mean")  # fmt: skip
    # found while the run sets up, not while the config is read: an error of the run, with its traceback
    assert code == 4 and "scale_loss='share'" in err and "Traceback" in err, err[-3000:]
