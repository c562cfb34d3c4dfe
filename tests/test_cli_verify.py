"""lightning-halo verify --config x.yaml: the report, exit 0 when exact and 1 when not, 2 for a bad command."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli import ROOT, cli

pytestmark = pytest.mark.multiprocess

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


def test_a_shipped_config_is_exact(tmp_path: Path) -> None:
    result = cli("verify", "--config", str(ROOT / "examples" / "configs" / "gcn.yaml"), tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("lightning-halo verify: exact: one training step on 2 processes vs one process (float64)")
    assert "GPU available" not in result.stdout + result.stderr


def test_user_code_that_reads_all_nodes_fails_with_the_module_named(tmp_path: Path) -> None:
    """The config's devices (3) are used; the pooled model is named at conv2, exit status 1."""
    config = tmp_path / "pool.yaml"
    config.write_text(CONFIG.format(mode="pool"))
    result = cli("verify", "--config", str(config), tmp_path=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "NOT exact: one training step on 3 processes" in result.stdout
    assert "`conv2` (GCNConv), call 1, and its input differs already" in result.stdout
    result = cli("verify", "--config", str(config), "--devices", "2", "--model.init_args.mode", "n_id", tmp_path=tmp_path)
    assert result.returncode == 0 and "exact: one training step on 2 processes" in result.stdout, result.stdout + result.stderr


def test_bad_command_is_one_line_and_status_2(tmp_path: Path) -> None:
    result = cli("verify", "--config", str(ROOT / "examples" / "configs" / "gcn.yaml"), "--devices", "1", tmp_path=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("lightning-halo verify: error: ValueError: verify compares")


def test_help_lists_verify() -> None:
    from lightning_halo.cli import top_level_parser

    assert "verify" in top_level_parser().format_help()
