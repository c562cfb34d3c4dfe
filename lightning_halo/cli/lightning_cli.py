"""The LightningCLI side of ``lightning-halo``: :class:`HaloCLI` and what the fit/validate/test/predict verbs share.

:mod:`lightning_halo.cli.fit` and :mod:`lightning_halo.cli.link` run :func:`run_cli` with their
CLI class and data module; :mod:`lightning_halo.cli.verify` builds the model and the data module
with :class:`HaloCLI` without running it.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any, Callable, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.warnings import PossibleUserWarning
from typing_extensions import override

from lightning_halo.callbacks.printer import EpochPrinter
from lightning_halo.cli.status import CommandError, ExitStatus, library_error

if TYPE_CHECKING:
    from lightning_halo.data import HaloDataModule

__all__ = ["ARGS_AND_ARGV", "EVALUATING", "SHORT_NAMES", "UNTRAINED", "CommandError", "HaloCLI", "SaveConfigBesideLogs", "checkpoint_for",
           "library_error", "num_classes", "num_features", "run_cli"]  # fmt: skip

_SRUN_HINT = "The `srun` command is available on your system but is not used"
_CALLBACK_STATE_HINTS = ("Be aware that when using `ckpt_path`, callbacks used to create the checkpoint",
                         "The dirpath has changed from .* won't be reloaded")  # fmt: skip
#: LightningCLI's warning when it is given args while sys.argv has some: here the args are sys.argv's own rest
#: (the verb first), which the ranks Lightning launches (re-running sys.argv) derive again.
ARGS_AND_ARGV = "LightningCLI's args parameter is intended to run from within Python"
#: Verbs that evaluate weights: without --ckpt_path they would use the model's random initial ones.
EVALUATING = ("validate", "test", "predict")
#: The --ckpt_path value that asks for the freshly initialised weights on purpose.
UNTRAINED = "untrained"
#: Modules whose classes the command names by their short name (``--model GCN``, ``HaloSchedule``):
#: jsonargparse resolves a short class name among the imported subclasses of the expected type.
SHORT_NAMES = ("lightning_halo.models", "lightning_halo.strategy", "lightning_halo.callbacks.schedule",
               "lightning_halo.callbacks.predictions", "lightning_halo.callbacks.printer")  # fmt: skip


def num_features(dm: HaloDataModule) -> int:
    """The data module's feature count: the model's ``in_channels`` in a config.

    Example:
        >>> num_features(HaloDataModule("cora"))  # doctest: +SKIP
        1433
    """
    return dm.num_features


def num_classes(dm: HaloDataModule) -> int:
    """The data module's class count: the model's ``out_channels`` in a config.

    Example:
        >>> num_classes(HaloDataModule("cora"))  # doctest: +SKIP
        7
    """
    return dm.num_classes


class HaloCLI(LightningCLI):
    """LightningCLI whose ``data`` is a :class:`HaloDataModule` and whose model is any LightningModule.

    ``data.num_features`` and ``data.num_classes`` are linked to the model's ``in_channels``
    and ``out_channels`` when it has them (the :mod:`lightning_halo.models` do), so a config
    needs no dataset sizes (:attr:`linked_sizes`). A library error while the configured classes
    are built is a :class:`CommandError` (one line, exit status 2).

    Example:
        >>> cli = HaloCLI(datamodule_class=HaloDataModule, run=False, args=["--config", "gcn.yaml"])  # doctest: +SKIP
    """

    #: The model's arguments filled from the data module when it has them, each with what reads it.
    linked_sizes: dict[str, Callable[[Any], int]] = {"in_channels": num_features, "out_channels": num_classes}

    def add_arguments_to_parser(self, parser) -> None:  # type: ignore[no-untyped-def]
        for argument, size in self.linked_sizes.items():
            parser.link_arguments("data", f"model.init_args.{argument}", compute_fn=size, apply_on="instantiate")

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


class SaveConfigBesideLogs(SaveConfigCallback):
    """Saves the run's ``config.yaml`` into its logger's folder, next to metrics and checkpoints.

    LightningCLI saves it into ``trainer.log_dir``, which without a logger is the working
    directory; a run without a logger has no run folder, so nothing is saved then.
    """

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.loggers:  # the same on every rank, so the broadcasts inside stay matched
            super().setup(trainer, pl_module, stage)


def run_cli(cli_class: type, datamodule_class: type, argv: list[str]) -> ExitStatus:
    """Run ``cli_class`` (a :class:`HaloCLI`) with ``datamodule_class`` on ``argv`` (its verb first).

    A mistake in the configuration found while its classes are built raises :class:`CommandError`.

    Example:
        >>> run_cli(HaloCLI, HaloDataModule, ["fit", "--config", "gcn.yaml"])  # doctest: +SKIP
        <ExitStatus.OK: 0>
    """
    from lightning_halo.shutdown import release_process_groups

    for module in SHORT_NAMES:
        importlib.import_module(module)
    trainer_defaults: dict[str, Any] = {
        # One batch (the rank's partition) per epoch: log every step, or step-level metrics such as
        # train_loss reach the logger only every 50 epochs (and Lightning warns about it).
        "log_every_n_steps": 1,
        "callbacks": [EpochPrinter()],  # one line per epoch when the progress bar is off
    }
    warnings.filterwarnings("ignore", message=ARGS_AND_ARGV)
    cli_class(
        datamodule_class=datamodule_class,
        save_config_callback=SaveConfigBesideLogs,
        save_config_kwargs={"overwrite": True},
        trainer_defaults=trainer_defaults,
        args=argv,
    )
    release_process_groups()  # before the interpreter exits: see lightning_halo.shutdown
    return ExitStatus.OK
