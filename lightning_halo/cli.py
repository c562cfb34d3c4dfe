"""The ``lightning-halo`` command: LightningCLI (fit/validate/test/predict) plus ``partition``."""

from __future__ import annotations

import sys
from typing import Optional

from lightning.pytorch.cli import LightningCLI

from lightning_halo.data import HaloDataModule


class HaloCLI(LightningCLI):
    """LightningCLI whose ``data`` is a :class:`HaloDataModule` and whose model is any LightningModule.

    ``data.num_features`` and ``data.num_classes`` are linked to the model's ``in_channels``
    and ``out_channels`` when it has them (the :mod:`lightning_halo.models` do), so a config
    needs no dataset sizes.
    """

    def add_arguments_to_parser(self, parser) -> None:  # type: ignore[no-untyped-def]
        parser.link_arguments("data", "model.init_args.in_channels", compute_fn=_num_features, apply_on="instantiate")
        parser.link_arguments("data", "model.init_args.out_channels", compute_fn=_num_classes, apply_on="instantiate")


def _num_features(dm: HaloDataModule) -> int:
    return dm.num_features


def _num_classes(dm: HaloDataModule) -> int:
    return dm.num_classes


def main(args: Optional[list[str]] = None) -> Optional[int]:
    """Entry point of the ``lightning-halo`` console script.

    Example:
        $ lightning-halo fit --config examples/configs/gcn.yaml --trainer.max_epochs 2
        $ lightning-halo partition --data cora --num-parts 4 --hidden 256
    """
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] == "partition":
        from lightning_halo.cli_partition import main as partition_main

        return partition_main(argv[1:])
    import lightning_halo  # noqa: F401  (registers the strategy names)

    HaloCLI(
        datamodule_class=HaloDataModule,
        save_config_kwargs={"overwrite": True},
        args=argv,
    )
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # before interpreter exit: see docs/faq.md
    return None


if __name__ == "__main__":
    sys.exit(main())
