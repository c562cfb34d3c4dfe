"""The ``lightning-halo`` command: LightningCLI (fit/validate/test/predict) plus ``partition``, ``verify``, ``plan`` and ``link``.

One module per verb, each with its ``main(argv)``: :mod:`~lightning_halo.cli.fit` (the
LightningCLI verbs), :mod:`~lightning_halo.cli.partition`, :mod:`~lightning_halo.cli.verify`,
:mod:`~lightning_halo.cli.plan`, :mod:`~lightning_halo.cli.link`. :mod:`~lightning_halo.cli.dispatch`
names them in one table and imports a verb's module only when it runs, so ``lightning-halo
--help`` imports none of them; :mod:`~lightning_halo.cli.lightning_cli` holds the LightningCLI
helpers (:class:`HaloCLI`, :func:`checkpoint_for`, ...), :mod:`~lightning_halo.cli.status` the
exit statuses and :class:`CommandError`. The helpers are imported from here on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_halo._lazy import lazy_module_attributes
from lightning_halo.cli.dispatch import PROG, VERBS, main, top_level_parser
from lightning_halo.cli.status import CommandError, ExitStatus, library_error

__getattr__, __dir__, _LAZY = lazy_module_attributes(
    __name__,
    {
        "lightning_halo.cli.lightning_cli": [
            "EVALUATING", "SHORT_NAMES", "UNTRAINED", "HaloCLI", "SaveConfigBesideLogs", "checkpoint_for", "run_cli",
        ],
        "lightning_halo.cli.link": ["HaloLinkCLI"],
    },
)  # fmt: skip
__all__ = sorted(["PROG", "VERBS", "CommandError", "ExitStatus", "library_error", "main", "top_level_parser", *_LAZY])

if TYPE_CHECKING:
    from lightning_halo.cli.link import HaloLinkCLI
    from lightning_halo.cli.lightning_cli import (
        EVALUATING,
        SHORT_NAMES,
        UNTRAINED,
        HaloCLI,
        SaveConfigBesideLogs,
        checkpoint_for,
        run_cli,
    )
