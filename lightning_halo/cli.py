"""The ``lightning-halo`` command: LightningCLI (fit/validate/test/predict) plus ``partition``.

The verbs are dispatched before anything heavy is imported: ``lightning-halo --help`` imports
Lightning (for the strategy registry) and nothing of PyG, the exchange or the quantizer;
``partition`` imports only what partitioning needs.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import warnings
from typing import TYPE_CHECKING, Any, Optional

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.warnings import PossibleUserWarning
from typing_extensions import override

from lightning_halo.callbacks.printer import EpochPrinter

if TYPE_CHECKING:
    from lightning_halo.data import HaloDataModule

PROG = "lightning-halo"
_SRUN_HINT = "The `srun` command is available on your system but is not used"
_PARTITION_HELP = "Partition a graph ahead of training and print its statistics and halo traffic per bit width."


class HaloCLI(LightningCLI):
    """LightningCLI whose ``data`` is a :class:`HaloDataModule` and whose model is any LightningModule.

    ``data.num_features`` and ``data.num_classes`` are linked to the model's ``in_channels``
    and ``out_channels`` when it has them (the :mod:`lightning_halo.models` do), so a config
    needs no dataset sizes.
    """

    def add_arguments_to_parser(self, parser) -> None:  # type: ignore[no-untyped-def]
        parser.link_arguments("data", "model.init_args.in_channels", compute_fn=_num_features, apply_on="instantiate")
        parser.link_arguments("data", "model.init_args.out_channels", compute_fn=_num_classes, apply_on="instantiate")

    @override
    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if int(config.get("trainer.num_nodes") or 1) == 1:
            # Where SLURM is installed but no job runs, Lightning hints (at Trainer creation and again
            # in fit) that `srun` is not used: a multi-node run would wait for nodes that never come.
            # One node needs no srun. This process is the command's own, so the filter is global.
            warnings.filterwarnings("ignore", message=_SRUN_HINT, category=PossibleUserWarning)


class SaveConfigBesideLogs(SaveConfigCallback):
    """Saves the run's ``config.yaml`` into its logger's folder, next to metrics and checkpoints.

    LightningCLI saves it into ``trainer.log_dir``, which without a logger is the working
    directory; a run without a logger has no run folder, so nothing is saved then.
    """

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.loggers:  # the same on every rank, so the broadcasts inside stay matched
            super().setup(trainer, pl_module, stage)


def _num_features(dm: HaloDataModule) -> int:
    return dm.num_features


def _num_classes(dm: HaloDataModule) -> int:
    return dm.num_classes


def _verbs() -> dict[str, str]:
    """Each verb and its one-line help; LightningCLI's verbs are the Trainer methods of those names (as there)."""
    verbs = {}
    for name in LightningCLI.subcommands():
        first_paragraph = " ".join((inspect.getdoc(getattr(pl.Trainer, name)) or "").split("\n\n")[0].split())
        verbs[name] = first_paragraph.split(". ")[0].rstrip(".") + "."
    verbs["partition"] = _PARTITION_HELP
    return verbs


def top_level_parser() -> argparse.ArgumentParser:
    """The parser behind ``lightning-halo --help``: the verbs, without building LightningCLI's parsers."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Distributed full-graph GNN training with PyTorch Lightning and PyG.",
        epilog=(
            f"'{PROG} VERB --help' shows a verb's options. fit, validate, test and predict are LightningCLI "
            "commands: --config file.yaml, --section.key value overrides, --print_config."
        ),
    )
    sub = parser.add_subparsers(title="verbs", dest="verb", required=True)
    for name, text in _verbs().items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(args: Optional[list[str]] = None) -> Optional[int]:
    """Entry point of the ``lightning-halo`` console script.

    Example:
        $ lightning-halo fit --config examples/configs/gcn.yaml --trainer.max_epochs 2
        $ lightning-halo partition --data cora --num-parts 4 --hidden 256
    """
    argv = sys.argv[1:] if args is None else list(args)
    if not argv or argv[0] in ("-h", "--help"):
        top_level_parser().parse_args(argv)  # prints the help (exit 0) or the missing-verb error (exit 2)
    if argv[0] == "partition":
        from lightning_halo.cli_partition import main as partition_main

        return partition_main(argv[1:])
    from lightning_halo.data import HaloDataModule

    trainer_defaults: dict[str, Any] = {
        # One batch (the rank's partition) per epoch: log every step, or step-level metrics such as
        # train_loss reach the logger only every 50 epochs (and Lightning warns about it).
        "log_every_n_steps": 1,
        "callbacks": [EpochPrinter()],  # one line per epoch when the progress bar is off
    }
    HaloCLI(
        datamodule_class=HaloDataModule,
        save_config_callback=SaveConfigBesideLogs,
        save_config_kwargs={"overwrite": True},
        trainer_defaults=trainer_defaults,
        # From the console script, LightningCLI reads sys.argv itself; args= is for calls from Python.
        args=None if args is None else argv,
    )
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # before interpreter exit: see docs/faq.md
    return None


if __name__ == "__main__":
    sys.exit(main())
