"""``lightning-halo link fit --config x.yaml``: the LightningCLI verbs with :class:`~lightning_halo.HaloLinkDataModule`.

The same command as ``fit`` / ``validate`` / ``test`` / ``predict``, whose ``data`` section
takes :class:`~lightning_halo.HaloLinkDataModule`'s options (``num_val``, ``num_test``,
``neg_ratio``, ...). ``data.num_features`` is linked to the model's ``in_channels``; nothing is
linked to ``out_channels`` (a link predictor's embedding size is the user's choice).
"""

from __future__ import annotations

import warnings
from typing import Optional

from lightning_halo.cli import PROG, HaloCLI, run_cli


class HaloLinkCLI(HaloCLI):
    """:class:`~lightning_halo.cli.HaloCLI` for link prediction: links only ``in_channels``."""

    def add_arguments_to_parser(self, parser) -> None:  # type: ignore[no-untyped-def]
        parser.link_arguments("data", "model.init_args.in_channels", compute_fn=_num_features, apply_on="instantiate")


def _num_features(dm) -> int:  # type: ignore[no-untyped-def]
    return dm.num_features


def main(argv: list[str]) -> Optional[int]:
    """Entry point of ``lightning-halo link VERB ...``."""
    from lightning_halo.data.link_datamodule import HaloLinkDataModule

    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: {PROG} link {{fit,validate,test,predict}} --config x.yaml [--section.key value ...]")
        return 0 if argv else 2
    # LightningCLI parses sys.argv[1:] itself unless given args, and sys.argv[1] is "link" here. Its
    # warning about args given beside sys.argv does not apply: args are sys.argv's own rest, which the
    # ranks Lightning launches (re-running sys.argv) derive again.
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended to run from within Python")
    run_cli(HaloLinkCLI, HaloLinkDataModule, argv, argv)
    return None
