"""``lightning-halo link fit --config x.yaml``: the LightningCLI verbs with :class:`~lightning_halo.HaloLinkDataModule`.

The same command as ``fit`` / ``validate`` / ``test`` / ``predict`` / ``verify``, whose ``data`` section
takes :class:`~lightning_halo.HaloLinkDataModule`'s options (``num_val``, ``num_test``,
``neg_ratio``, ...). ``data.num_features`` is linked to the model's ``in_channels``; nothing is
linked to ``out_channels`` (a link predictor's embedding size is the user's choice).
"""

from __future__ import annotations

import sys

from lightning_halo.cli.lightning_cli import HaloCLI, num_features, run_cli
from lightning_halo.cli.status import ExitStatus

_USAGE = "usage: lightning-halo link {fit,validate,test,predict,verify} --config x.yaml [--section.key value ...]"


class HaloLinkCLI(HaloCLI):
    """:class:`~lightning_halo.cli.HaloCLI` for link prediction: links only ``in_channels``.

    Example:
        $ lightning-halo link fit --config examples/configs/link_gcn.yaml
    """

    linked_sizes = {"in_channels": num_features}


def main(argv: list[str]) -> ExitStatus:
    """Entry point of ``lightning-halo link VERB ...`` (``argv``: ``link`` first).

    Example:
        $ lightning-halo link fit --config examples/configs/link_gcn.yaml
    """
    rest = argv[1:]
    if not rest or rest[0] in ("-h", "--help"):
        print(_USAGE, file=sys.stdout if rest else sys.stderr)
        return ExitStatus.OK if rest else ExitStatus.USAGE
    if rest[0] == "verify":  # one training step on one process and on several, compared (as `lightning-halo verify`)
        from lightning_halo.cli.verify import main as verify

        return verify(rest, link=True)
    from lightning_halo.data.link_datamodule import HaloLinkDataModule

    return run_cli(HaloLinkCLI, HaloLinkDataModule, rest)
