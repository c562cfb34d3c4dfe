"""``lightning-halo VERB ...``: the table of verbs, and ``main``, which imports a verb's module when it runs.

argparse only: ``lightning-halo --help`` imports no verb, nothing of Lightning's CLI
(jsonargparse) and nothing of PyG. Each verb is ``main(argv)`` of its own module in
:mod:`lightning_halo.cli`, given the command line after the program name (the verb first);
it returns an :class:`~lightning_halo.cli.status.ExitStatus`, or raises what
:func:`~lightning_halo.cli.status.exit_status` turns into one.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional

PROG = "lightning-halo"

#: verb -> (its ``module:main``, its one-line help). fit, validate, test and predict are LightningCLI's
#: verbs, the Trainer methods of those names: their help is the first sentence of the method's docstring
#: (tests/cli/test_dispatch.py keeps it so), written here so that ``--help`` needs no Lightning.
VERBS: dict[str, tuple[str, str]] = {
    "fit": ("lightning_halo.cli.fit:main", "Runs the full optimization routine."),
    "validate": ("lightning_halo.cli.fit:main", "Perform one evaluation epoch over the validation set."),
    "test": ("lightning_halo.cli.fit:main", "Perform one evaluation epoch over the test set."),
    "predict": ("lightning_halo.cli.fit:main", "Run inference on your data."),
    "partition": (
        "lightning_halo.cli.partition:main",
        "Partition a graph ahead of training and print its statistics and halo traffic per bit width.",
    ),
    "verify": (
        "lightning_halo.cli.verify:main",
        "Check that the model trains on partitions exactly as on one process (one step, compared per module).",
    ),
    "plan": (
        "lightning_halo.cli.plan:main",
        "Predict per-rank memory, halo bytes and epoch time for rank counts, bit widths and modes, before a run.",
    ),
    "link": (
        "lightning_halo.cli.link:main",
        "Link prediction: 'link fit|validate|test|predict|verify' with HaloLinkDataModule as the data (see docs).",
    ),
}


def top_level_parser() -> argparse.ArgumentParser:
    """The parser behind ``lightning-halo --help``: the verbs, without building any verb's parser.

    Example:
        >>> "partition" in top_level_parser().format_help()
        True
    """
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Distributed full-graph GNN training with PyTorch Lightning and PyG.",
        epilog=(
            f"'{PROG} VERB --help' shows a verb's options. fit, validate, test and predict are LightningCLI "
            "commands: --config file.yaml, --section.key value overrides, --print_config. Exit status: 0 done, "
            "1 verify found a difference, 2 a mistake in the command or config, 3 a timeout, 4 another error."
        ),
    )
    sub = parser.add_subparsers(title="verbs", dest="verb", required=True)
    for name, (_, text) in VERBS.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(args: Optional[list[str]] = None) -> int:
    """Entry point of the ``lightning-halo`` console script: runs the verb, returns its exit status.

    Args:
        args (list, optional): the command line after the program name. (default: ``sys.argv[1:]``)

    Example:
        $ lightning-halo fit --config examples/configs/gcn.yaml --trainer.max_epochs 2
        $ lightning-halo partition cora --parts 4 --hidden 256
    """
    argv = sys.argv[1:] if args is None else list(args)
    if not argv or argv[0] not in VERBS:
        top_level_parser().parse_args(argv[:1])  # the help (exit 0), or the missing or unknown verb (exit 2)
    from lightning_halo.cli.status import exit_status

    module, _, function = VERBS[argv[0]][0].partition(":")
    verb_main = getattr(importlib.import_module(module), function)
    try:
        return int(verb_main(argv))
    except Exception as err:  # noqa: BLE001 - every error leaves with its status (lightning_halo.cli.status)
        return int(exit_status(f"{PROG} {argv[0]}", err))
