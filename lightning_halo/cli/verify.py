"""``lightning-halo verify --config x.yaml``: is the configured model exact on partitions?

Builds the model, the data module and the Trainer's strategy from the config as ``fit`` does,
then runs :func:`~lightning_halo.verify` with that strategy: one training step on one process
and on ``--devices`` processes (the config's ``trainer.devices`` by default), compared module by
module. Prints the report. Exit status (:class:`~lightning_halo.cli.status.ExitStatus`): 0 when
exact, 1 when not (or when something could not be compared), 2 for a mistake in the command or
the config, 3 when a run timed out, 4 when the check could not run (the one-process run failed:
its traceback is printed).
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import torch

from lightning_halo.cli.status import ExitStatus, input_errors_are_command_errors

PROG = "lightning-halo verify"


def _process_count(text: str) -> int:
    """``--devices``: the processes to compare with one, 2 or more."""
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 2:
        raise argparse.ArgumentTypeError(
            f"{text!r}: verify compares one process with --devices processes; give 2 or more"
        )
    return count


def _seconds(text: str) -> float:
    """``--timeout``: positive seconds."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give the seconds each run may take, a positive number")
    return seconds


def parser() -> argparse.ArgumentParser:
    """The options of ``lightning-halo verify`` (every other argument is the fit command's).

    Example:
        >>> parser().parse_known_args(["--devices", "3", "--config", "x.yaml"])[0].devices
        3
    """
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Run one training step of the configured model on one process and on --devices processes, and "
        "compare loss, logits and gradients; name the first module whose output differs. The config's "
        "strategy is what is checked (at bits=32).",
        epilog="Every other argument is the fit command's: --config x.yaml, --section.key value overrides. Exit "
        "status: 0 exact, 1 not exact (or not compared), 2 a mistake in the command or config, 3 a run timed out, "
        "4 the check could not run.",
    )
    p.add_argument("--devices", type=_process_count, default=None, help="processes to compare with one, 2 or more "
                   "(default: the config's trainer.devices if it is 2 or more, else 2)")  # fmt: skip
    p.add_argument("--dtype", choices=("float64", "float32"), default=None, help="default: float64 if the model runs in it")
    p.add_argument("--timeout", type=_seconds, default=600.0, help="seconds each run may take (default: 600)")
    return p


@contextmanager
def _report_only() -> Iterator[None]:
    """The report is the output: not the Trainer's banners or the seed. The levels and warning filters
    are restored after, so that ``main`` called in a user's process (a notebook) leaves its logging as it was."""
    from lightning_halo.cli.lightning_cli import ARGS_AND_ARGV

    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=ARGS_AND_ARGV)
        try:
            for logger in loggers:
                logger.setLevel(logging.WARNING)
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


#: Options only :class:`~lightning_halo.HaloLinkDataModule` takes: a config's ``data`` section with one is link prediction.
LINK_OPTIONS = ("num_val", "num_test", "neg_ratio", "undirected", "test_with_val_edges", "edge_type", "rev_edge_type")


def link_config(args: list[str]) -> Optional[str]:
    """The ``--config`` among ``args`` if it configures link prediction (a link option in ``data``), else ``None``.

    Example:
        >>> link_config(["--config", "examples/configs/link_gcn.yaml"])  # doctest: +SKIP
        'examples/configs/link_gcn.yaml'
    """
    import yaml

    for i, arg in enumerate(args):
        path = args[i + 1] if arg == "--config" and i + 1 < len(args) else arg.split("=", 1)[1] if arg.startswith("--config=") else None
        if path is None or not Path(path).is_file():
            continue
        try:
            config = yaml.safe_load(Path(path).read_text())
        except yaml.YAMLError:
            return None  # the Lightning CLI reports it
        data = config.get("data") if isinstance(config, dict) else None
        args_of = data.get("init_args", data) if isinstance(data, dict) else {}
        if isinstance(args_of, dict) and any(key in args_of for key in LINK_OPTIONS):
            return path
    return None


def main(argv: list[str], link: bool = False) -> ExitStatus:
    """Entry point of ``lightning-halo verify ...`` (``argv``: ``verify`` first); ``link``: ``lightning-halo link
    verify``, whose configs take :class:`~lightning_halo.HaloLinkDataModule`'s options.

    Example:
        $ lightning-halo verify --config examples/configs/gcn.yaml
        $ lightning-halo link verify --config examples/configs/link_gcn.yaml
    """
    own, rest = parser().parse_known_args(argv[1:])
    from lightning_halo import verification
    from lightning_halo.cli.lightning_cli import HaloCLI
    from lightning_halo.cli.link import HaloLinkCLI
    from lightning_halo.data import HaloDataModule
    from lightning_halo.data.link_datamodule import HaloLinkDataModule
    from lightning_halo.shutdown import release_process_groups

    found = None if link else link_config(rest)
    if found is not None:
        print(f"{PROG}: {found} configures link prediction (its data section has HaloLinkDataModule's options); "
              f"check it with `lightning-halo link verify --config {found}`", file=sys.stderr)  # fmt: skip
        return ExitStatus.USAGE
    cli_class, data_class = (HaloLinkCLI, HaloLinkDataModule) if link else (HaloCLI, HaloDataModule)
    with _report_only():
        cli = cli_class(datamodule_class=data_class, save_config_callback=None, run=False, args=rest)
        trainer = cli.trainer
        configured = trainer.num_devices * trainer.num_nodes
        devices = own.devices if own.devices is not None else configured if configured > 1 else 2
        with input_errors_are_command_errors():  # verify's checks of its arguments, before anything runs
            report = verification.verify(
                cli.model, cli.datamodule, devices, strategy=trainer.strategy,
                dtype=getattr(torch, own.dtype) if own.dtype else None, timeout=own.timeout,
            )  # fmt: skip
    print(report)
    release_process_groups()
    return ExitStatus.OK if report.ok else ExitStatus.NOT_EXACT
