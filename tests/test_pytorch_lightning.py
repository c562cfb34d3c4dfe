"""PyG's Lightning examples import ``pytorch_lightning``: lightning-halo works from that namespace too."""

from __future__ import annotations

import re

import pytest

from tests.support.launch import check, run_workers


def test_mirror_builds_the_adapters_on_pytorch_lightning() -> None:
    import pytorch_lightning as pl

    import lightning_halo
    from lightning_halo.pytorch_lightning import HaloDataModule, HaloQuantStrategy, HaloSchedule, HaloTrafficLogger

    assert issubclass(HaloQuantStrategy, pl.strategies.DDPStrategy)
    assert issubclass(HaloDataModule, pl.LightningDataModule)
    assert issubclass(HaloSchedule, pl.Callback) and issubclass(HaloTrafficLogger, pl.Callback)
    assert HaloQuantStrategy is not lightning_halo.HaloQuantStrategy  # the lightning.pytorch one stays itself
    assert not issubclass(lightning_halo.HaloQuantStrategy, pl.strategies.Strategy)
    # the core (partitioning, exchange, layers) is shared, not copied
    import lightning_halo.pytorch_lightning.strategy as mirrored

    assert mirrored.HaloExchanger is __import__("lightning_halo.exchange", fromlist=["x"]).HaloExchanger
    trainer = pl.Trainer(strategy="halo_exact", accelerator="cpu", devices=1, logger=False)
    assert type(trainer.strategy) is HaloQuantStrategy and trainer.strategy.bits == 32


def test_only_modules_that_use_lightning_are_mirrored() -> None:
    from lightning_halo import _mirror

    assert {"lightning_halo.strategy", "lightning_halo.data.datamodule", "lightning_halo.callbacks.schedule"} <= _mirror.mirrored()
    assert not {"lightning_halo.exchange.exchanger", "lightning_halo.layers.hooks", "lightning_halo.partition.halo"} & _mirror.mirrored()
    with pytest.raises(ModuleNotFoundError, match="import lightning_halo.layers itself"):
        __import__("lightning_halo.pytorch_lightning.layers.hooks")
    assert _mirror.rewrite("from lightning.fabric.plugins import CheckpointIO") == "from lightning_fabric.plugins import CheckpointIO"
    assert _mirror.rewrite("from lightning_halo.callbacks import HaloSchedule") == (
        "from lightning_halo.pytorch_lightning.callbacks import HaloSchedule"
    )
    assert _mirror.rewrite("from lightning_halo.exchange import HaloExchanger") == "from lightning_halo.exchange import HaloExchanger"


def test_the_command_is_mirrored_with_the_verbs_its_table_names() -> None:
    """The dispatcher imports no Lightning, but its table names verbs that do ("module:main"): mirrored too."""
    import pytorch_lightning as pl

    from lightning_halo.pytorch_lightning.cli import HaloCLI
    from lightning_halo.pytorch_lightning.cli.dispatch import VERBS

    assert issubclass(HaloCLI, pl.cli.LightningCLI)
    assert VERBS["fit"][0] == "lightning_halo.pytorch_lightning.cli.fit:main"
    assert "lightning_halo.cli.status" not in __import__("lightning_halo._mirror", fromlist=["x"]).mirrored()


@pytest.mark.multiprocess
def test_pyg_style_pytorch_lightning_script_runs_unchanged_on_two_processes() -> None:
    """Two torchrun-style ranks forked from the tests' server (it imported ``lightning``; each rank imports
    ``pytorch_lightning`` as the script does)."""
    results = run_workers(["examples/pyg_pytorch_lightning.py", "--devices", "2", "--epochs", "30"], 2, timeout=600)
    check(results)
    output = "".join(r.stdout for r in results)
    acc = float(re.search(r"test accuracy (\d\.\d+)", output).group(1))
    assert acc > 0.7, output[-2000:]
