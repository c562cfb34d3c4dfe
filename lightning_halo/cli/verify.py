"""``lightning-halo verify --config x.yaml``: is the configured model exact on partitions?

Builds the model and the data module from the config as ``fit`` does, then runs
:func:`~lightning_halo.verify`: one training step on one process and on ``--devices``
processes (the config's ``trainer.devices`` by default), compared module by module. Prints the
report; exit status 0 when exact, 1 when not, 2 for a mistake in the command or the config.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from typing import Any

import torch

PROG = "lightning-halo verify"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Run one training step of the configured model on one process and on --devices processes, and "
        "compare loss, logits and gradients; name the first module whose output differs.",
        epilog="Every other argument is the fit command's: --config x.yaml, --section.key value overrides.",
    )
    p.add_argument("--devices", type=int, default=None, help="processes to compare with one (default: the config's "
                   "trainer.devices if it is 2 or more, else 2)")  # fmt: skip
    p.add_argument("--dtype", choices=("float64", "float32"), default=None, help="default: float64 if the model runs in it")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each run may take (default: 600)")
    return p


def strategy_options(strategy: Any, config: Any) -> dict[str, Any]:
    """The configured strategy's options that change the result (the defaults for another strategy)."""
    from lightning_halo.strategy import HaloQuantStrategy

    if not isinstance(strategy, HaloQuantStrategy):
        return {}
    find_unused = config.get("trainer.strategy.init_args.find_unused_parameters") if hasattr(config, "get") else None
    return {"scale_loss": strategy.scale_loss, "aggregation": strategy.aggregation,
            "find_unused_parameters": bool(find_unused)}  # fmt: skip


def main(argv: list[str]) -> int:
    """Entry point of ``lightning-halo verify ...`` (``argv``: ``verify`` first).

    Example:
        $ lightning-halo verify --config examples/configs/gcn.yaml
    """
    from lightning_halo.cli.lightning_cli import CommandError, HaloCLI, library_error
    from lightning_halo.data import HaloDataModule
    from lightning_halo.shutdown import release_process_groups
    from lightning_halo.verification import verify

    own, rest = parser().parse_known_args(argv[1:])
    # The report is the output: not the Trainer's banners, the seed or LightningCLI's note that this command
    # hands it its own arguments (args=) while sys.argv also holds the verb.
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    try:
        cli = HaloCLI(datamodule_class=HaloDataModule, save_config_callback=None, run=False, args=rest)
        trainer = cli.trainer
        devices = own.devices or (trainer.num_devices * trainer.num_nodes if trainer.num_devices * trainer.num_nodes > 1 else 2)
        report = verify(
            cli.model, cli.datamodule, devices, dtype=getattr(torch, own.dtype) if own.dtype else None,
            timeout=own.timeout, **strategy_options(trainer.strategy, cli.config),
        )  # fmt: skip
    except (CommandError, ValueError, RuntimeError, OSError) as err:
        cause = library_error(err) or err
        print(f"{PROG}: error: {type(cause).__name__}: {cause}", file=sys.stderr)
        return 2
    print(report)
    release_process_groups()
    return 0 if report.ok else 1
