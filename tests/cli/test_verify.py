"""lightning-halo verify --config x.yaml: the report, exit 0 when exact and 1 when not, 2 for a bad command."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import ROOT, cli

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
    code, out, err = lightning_halo_cli("verify", "--config", str(config), "--devices", "2", "--model.init_args.mode", "n_id")
    assert code == 0 and "exact: one training step on 2 processes" in out, out + err


def test_bad_command_is_one_line_and_status_2(lightning_halo_cli) -> None:
    code, _, err = lightning_halo_cli("verify", "--config", str(ROOT / "examples" / "configs" / "gcn.yaml"), "--devices", "1")
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("lightning-halo verify: error: ValueError: verify compares")


def test_help_of_verify(lightning_halo_cli) -> None:
    code, out, _ = lightning_halo_cli("verify", "--help")
    assert code == 0 and "usage: lightning-halo verify" in out
