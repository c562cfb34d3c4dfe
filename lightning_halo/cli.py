"""The ``lightning-halo`` command: LightningCLI (fit/validate/test/predict) plus ``partition``, ``verify``, ``plan`` and ``link``.

The verbs are dispatched before anything heavy is imported: ``lightning-halo --help`` imports
Lightning (for the strategy registry) and nothing of PyG, the exchange or the quantizer;
``partition`` imports only what partitioning needs.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import traceback
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.warnings import PossibleUserWarning
from typing_extensions import override

from lightning_halo.callbacks.printer import EpochPrinter

if TYPE_CHECKING:
    from lightning_halo.data import HaloDataModule

PROG = "lightning-halo"
_SRUN_HINT = "The `srun` command is available on your system but is not used"
_CALLBACK_STATE_HINTS = ("Be aware that when using `ckpt_path`, callbacks used to create the checkpoint",
                         "The dirpath has changed from .* won't be reloaded")  # fmt: skip
_PARTITION_HELP = "Partition a graph ahead of training and print its statistics and halo traffic per bit width."
_VERIFY_HELP = "Check that the model trains on partitions exactly as on one process (one step, compared per module)."
_PLAN_HELP = "Predict per-rank memory, halo bytes and epoch time for rank counts, bit widths and modes, before a run."
_LINK_HELP = "Link prediction: 'link fit|validate|test|predict' with HaloLinkDataModule as the data (see docs)."
#: Verbs that evaluate weights: without --ckpt_path they would use the model's random initial ones.
EVALUATING = ("validate", "test", "predict")
#: The --ckpt_path value that asks for the freshly initialised weights on purpose.
UNTRAINED = "untrained"
#: Modules whose classes the command names by their short name (``--model GCN``, ``HaloSchedule``):
#: jsonargparse resolves a short class name among the imported subclasses of the expected type.
SHORT_NAMES = ("lightning_halo.models", "lightning_halo.strategy", "lightning_halo.callbacks.schedule",
               "lightning_halo.callbacks.predictions", "lightning_halo.callbacks.printer")  # fmt: skip
_PACKAGE_DIR = Path(__file__).resolve().parent


class CommandError(Exception):
    """A mistake in the command line or the configuration: printed as one line, exit status 2."""


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
        if self.subcommand in EVALUATING:
            config["ckpt_path"] = checkpoint_for(self.subcommand, config.get("ckpt_path"))
            # Restoring weights to evaluate them does not need the callbacks fit checkpointed with (that is
            # for resuming fit), but Lightning asks for them, and a configured ModelCheckpoint says that its
            # state is not restored into this run's folder: neither concerns evaluation.
            for hint in _CALLBACK_STATE_HINTS:
                warnings.filterwarnings("ignore", message=hint)

    @override
    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except Exception as err:
            # jsonargparse wraps what our classes raise (e.g. "Call to compute_fn of link ... failed"): show
            # the library's own message instead of a traceback through the parser.
            own = library_error(err)
            if own is None:
                raise
            raise CommandError(f"{type(own).__name__}: {own}") from err

    def before_predict(self) -> None:
        """The predictions of the whole graph go to a file, unless the configuration writes them itself."""
        from lightning_halo.callbacks.predictions import HaloPredictionWriter

        if not any(isinstance(cb, BasePredictionWriter) for cb in self.trainer.callbacks):
            self.trainer.callbacks.append(HaloPredictionWriter())


def checkpoint_for(verb: str, ckpt_path: Optional[str]) -> Optional[str]:
    """The ``ckpt_path`` to evaluate with; refuses none at all, which would mean random weights.

    ``--ckpt_path untrained`` asks for the model's freshly initialised weights on purpose.

    Example:
        >>> checkpoint_for("test", "untrained") is None
        True
    """
    if ckpt_path == UNTRAINED:
        return None
    if ckpt_path is None:
        raise CommandError(
            f"no --ckpt_path: {verb} would run the model with its freshly initialised, random weights. Give the "
            "checkpoint to evaluate (written by fit, e.g. --ckpt_path lightning_logs/<name>/version_0/checkpoints/"
            f"last.ckpt), or --ckpt_path {UNTRAINED} to {verb} the untrained model on purpose."
        )
    return ckpt_path


def library_error(err: BaseException) -> Optional[BaseException]:
    """The first exception in ``err``'s chain that lightning-halo raised on purpose, or None.

    On purpose: raised in the package, of the kinds its checks raise (``ValueError``,
    ``TypeError``, ``RuntimeError``, ``OSError`` and their subclasses). Anything else (an
    ``AttributeError``, an ``AssertionError``, ...) would be a bug: its traceback stays.
    """
    seen: set[int] = set()
    current: Optional[BaseException] = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = traceback.extract_tb(current.__traceback__)
        raised_here = bool(frames) and Path(frames[-1].filename).resolve().is_relative_to(_PACKAGE_DIR)
        if raised_here and isinstance(current, (ValueError, TypeError, RuntimeError, OSError)):
            return current
        current = current.__cause__ or current.__context__
    return None


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
    verbs["verify"] = _VERIFY_HELP
    verbs["plan"] = _PLAN_HELP
    verbs["link"] = _LINK_HELP
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
    if argv[0] == "plan":
        from lightning_halo.cli_plan import main as plan_main

        return plan_main(argv[1:])
    if argv[0] == "link":
        from lightning_halo.cli_link import main as link_main

        return link_main(argv[1:])
    if argv[0] == "verify":
        from lightning_halo.cli_verify import main as verify_main

        raise SystemExit(verify_main(argv[1:]))
    from lightning_halo.data import HaloDataModule

    # From the console script, LightningCLI reads sys.argv itself; args= is for calls from Python.
    run_cli(HaloCLI, HaloDataModule, argv, None if args is None else argv)
    return None


def run_cli(cli_class: type, datamodule_class: type, argv: list[str], args: Optional[list[str]]) -> None:
    """Run ``cli_class`` (a :class:`HaloCLI`) with ``datamodule_class``; ``argv`` names the verb in errors."""
    from lightning_halo.shutdown import release_process_groups

    for module in SHORT_NAMES:
        importlib.import_module(module)
    trainer_defaults: dict[str, Any] = {
        # One batch (the rank's partition) per epoch: log every step, or step-level metrics such as
        # train_loss reach the logger only every 50 epochs (and Lightning warns about it).
        "log_every_n_steps": 1,
        "callbacks": [EpochPrinter()],  # one line per epoch when the progress bar is off
    }
    try:
        cli_class(
            datamodule_class=datamodule_class,
            save_config_callback=SaveConfigBesideLogs,
            save_config_kwargs={"overwrite": True},
            trainer_defaults=trainer_defaults,
            args=args,
        )
    except CommandError as err:
        print(f"{PROG} {argv[0]}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    release_process_groups()  # before the interpreter exits: see lightning_halo.shutdown


if __name__ == "__main__":
    sys.exit(main())
