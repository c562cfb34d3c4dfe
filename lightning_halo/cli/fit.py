"""``lightning-halo fit|validate|test|predict --config x.yaml``: LightningCLI with :class:`~lightning_halo.HaloDataModule`.

The four verbs are LightningCLI's (``--config``, ``--section.key value`` overrides,
``--print_config``), run by :class:`~lightning_halo.cli.lightning_cli.HaloCLI`: the model's
sizes come from the data, ``validate``/``test``/``predict`` need ``--ckpt_path``, ``predict``
writes the whole graph's predictions to one file.
"""

from __future__ import annotations

from lightning_halo.cli.lightning_cli import HaloCLI, run_cli
from lightning_halo.cli.status import ExitStatus


def main(argv: list[str]) -> ExitStatus:
    """Entry point of ``lightning-halo fit|validate|test|predict ...`` (``argv``: the verb first).

    Example:
        $ lightning-halo fit --config examples/configs/gcn.yaml --trainer.max_epochs 2
    """
    from lightning_halo.data import HaloDataModule

    return run_cli(HaloCLI, HaloDataModule, argv)
