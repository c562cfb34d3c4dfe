"""lightning-halo verify --config x.yaml: the report, exit 0 when exact and 1 when not, 2 for a bad command only;
the config's strategy is what is checked; a timeout or a failure keeps its traceback and status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.cli import ROOT, cli
from tests.verification.test_options import CARRIED_VALUES

GCN = str(ROOT / "examples" / "configs" / "gcn.yaml")

CONFIG = """
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 3
  strategy:
    class_path: lightning_halo.HaloQuantStrategy
    init_args:
      bits: 32
  logger: false
model:
  class_path: tests.support.verify_models.VerifyGCN
  init_args:
    mode: {mode}
data:
  data: cora
"""


@pytest.mark.multiprocess
def test_a_shipped_config_is_exact(tmp_path: Path) -> None:
    """The installed command (the verb family's one fresh interpreter)."""
    result = cli("verify", "--config", str(ROOT / "examples" / "configs" / "gcn.yaml"), tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("lightning-halo verify: exact: one training step on 2 processes vs one process (float64)")
    assert "GPU available" not in result.stdout + result.stderr


@pytest.mark.multiprocess
def test_user_code_that_reads_all_nodes_fails_with_the_module_named(tmp_path: Path, lightning_halo_cli) -> None:
    """The config's devices (3) are used; the pooled model is named at conv2, exit status 1."""
    config = tmp_path / "pool.yaml"
    config.write_text(CONFIG.format(mode="pool"))
    code, out, err = lightning_halo_cli("verify", "--config", str(config))
    assert code == 1, out + err
    assert "NOT exact: one training step on 3 processes" in out
    assert "`conv2` (GCNConv), call 1, and its input differs already" in out
    code, out, err = lightning_halo_cli("verify", "--config", str(config), "--devices", "2", "--model.init_args.mode", "n_id",
                                        "--trainer.strategy.init_args.halo_reduction", "none")  # fmt: skip
    assert code == 0 and "exact: one training step on 2 processes" in out, out + err
    assert "strategy: HaloQuantStrategy(bits=32, halo_reduction='none')" in out, "what the ranks ran with"


@pytest.fixture
def fake_verify(monkeypatch: pytest.MonkeyPatch):
    """``lightning_halo.verify`` replaced: records what the command hands it, returns ``result`` (or raises it)."""
    import lightning_halo.verification as verification
    from lightning_halo.verification import VerifyReport

    calls: list[dict[str, Any]] = []
    result: dict[str, Any] = {"value": VerifyReport(devices=2, dtype=torch.float64)}

    def verify(model, datamodule, devices, **kwargs):  # noqa: ANN001, ANN202
        calls.append(dict(kwargs, model=model, datamodule=datamodule, devices=devices))
        if isinstance(result["value"], BaseException):
            raise result["value"]
        return result["value"]

    monkeypatch.setattr(verification, "verify", verify)
    return calls, result


@pytest.mark.parametrize("devices", ["1", "0", "-2", "two"])
def test_bad_devices_are_one_line_and_status_2(devices: str, lightning_halo_cli, fake_verify) -> None:
    code, _, err = lightning_halo_cli("verify", "--config", GCN, "--devices", devices)
    assert code == 2, err
    assert "lightning-halo verify: error: argument --devices: " in err and "2 or more" in err, err
    assert "Traceback" not in err and fake_verify[0] == [], "refused before anything runs"


def test_every_strategy_option_of_the_config_is_what_verify_checks(lightning_halo_cli, fake_verify) -> None:
    """The config's strategy object itself is handed over, with every option (not a chosen few)."""
    overrides = [arg for name, value in CARRIED_VALUES.items()
                 for arg in (f"--trainer.strategy.init_args.{name}", str(value).lower())]  # fmt: skip
    code, out, err = lightning_halo_cli("verify", "--config", GCN, *overrides, "--trainer.strategy.init_args.bits", "4")
    assert code == 0, err
    (call,) = fake_verify[0]
    options = call["strategy"].init_args
    assert {name: options[name] for name in CARRIED_VALUES} == CARRIED_VALUES
    assert options["bits"] == 4 and call["devices"] == 2 and call["dtype"] is None and call["timeout"] == 600.0


def test_called_in_process_it_leaves_the_logging_as_it_was(lightning_halo_cli, monkeypatch) -> None:
    """The command quiets Lightning's banners for its report, and restores the levels after: ``main`` called
    in a user's process (a notebook) must not silence Lightning's INFO lines for the rest of the session."""
    import logging

    import lightning_halo.verification as verification
    from lightning_halo.verification import VerifyReport

    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    seen: list[list[int]] = []

    def verify(*args, **kwargs):
        seen.append([logger.level for logger in loggers])
        return VerifyReport(devices=2, dtype=torch.float64)

    monkeypatch.setattr(verification, "verify", verify)
    for level in (logging.DEBUG, logging.NOTSET):
        for logger in loggers:
            monkeypatch.setattr(logger, "level", level)
        code, _, err = lightning_halo_cli("verify", "--config", GCN)
        assert code == 0, err
        assert [logger.level for logger in loggers] == [level, level], "the levels were not restored"
    assert seen == [[logging.WARNING] * 2] * 2, "quiet while the check runs"


def test_only_a_mistake_in_the_command_is_status_2(lightning_halo_cli, fake_verify) -> None:
    """A timeout (3) and a failure while running (4) keep their traceback; the check's own verdict is 1."""
    from lightning_halo.verification import VerifyError, VerifyReport
    from lightning_halo.verification.run import VerifyTimeout

    _, result = fake_verify
    for raised, status, line in [
        (VerifyTimeout("the 2-process run did not finish within 1 s"), 3, "VerifyTimeout: the 2-process run did not"),
        (VerifyError("the model does not train one step on one process"), 4, "VerifyError: the model does not train"),
        (RuntimeError("an internal error"), 4, "RuntimeError: an internal error"),
    ]:  # fmt: skip
        result["value"] = raised
        code, _, err = lightning_halo_cli("verify", "--config", GCN)
        assert code == status and "Traceback (most recent call last)" in err and line in err.strip().splitlines()[-1], err
    result["value"] = VerifyReport(devices=2, dtype=torch.float64, ok=False)
    code, out, _ = lightning_halo_cli("verify", "--config", GCN)
    assert code == 1 and out.startswith("lightning-halo verify: NOT exact")


def test_a_strategy_that_is_not_halo_is_refused_before_anything_runs(lightning_halo_cli) -> None:
    code, _, err = lightning_halo_cli("verify", "--config", GCN, "--trainer.strategy", "ddp")
    assert code == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("lightning-halo verify: error: TypeError: verify checks a HaloQuantStrategy")


def test_help_of_verify(lightning_halo_cli) -> None:
    code, out, _ = lightning_halo_cli("verify", "--help")
    assert code == 0 and "usage: lightning-halo verify" in out
