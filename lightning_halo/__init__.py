"""lightning-halo: distributed full-graph GNN training for PyTorch Lightning and PyG.

Partition the graph (:class:`HaloDataModule`), exchange halo rows around every
message-passing layer (:class:`HaloQuantStrategy`), keep the LightningModule ordinary PyG code.

The public names are imported on first use (``lightning_halo.HaloQuantStrategy`` imports the
strategy, PyG and the exchange then), so that ``import lightning_halo`` and
``lightning-halo --help`` import neither torch nor Lightning. Importing the package
registers the strategy names of :data:`lightning_halo.names.STRATEGY_NAMES` with Lightning
(``"halo_exact"``, ``"halo_1bit"``, ``"halo_8bit"``, ``"halo_quant"``, ``"halo_quant_spawn"``)
as soon as Lightning's strategies are imported (at once, if they already are).
"""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any

import lightning_halo._mirror as _mirror
from lightning_halo._after_import import when_imported
from lightning_halo._lazy import lazy_module_attributes
from lightning_halo.names import register_names

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = lazy_module_attributes(
    __name__,
    {
        "lightning_halo.callbacks": [
            "EpochPrinter",
            "HaloPredictionWriter",
            "HaloRequeue",
            "HaloSchedule",
            "HaloStateCallback",
            "HaloTrafficLogger",
        ],
        "lightning_halo.data": ["GraphValidationError", "HaloDataModule", "load_graph"],
        "lightning_halo.data.link_datamodule": ["HaloLinkDataModule"],
        "lightning_halo.link": ["gather_rows"],
        "lightning_halo.exchange": ["HaloExchangeError"],
        "lightning_halo.layers": [
            "UnsupportedEdgesError",
            "UnsupportedLayerError",
            "register_aggregation",
            "register_layer",
            "supported_layers",
            "unsupported_layers",
            "wrapper_layers",
        ],
        "lightning_halo.layers.dropedge": ["dropout_edge"],
        "lightning_halo.loss": ["global_mean"],
        "lightning_halo.partition": ["build_halo_partitions", "partition_graph", "partition_stats", "sparse_adjacency"],
        "lightning_halo.partition.halo_partition": ["HaloPartition"],
        "lightning_halo.planner.plan": ["plan"],
        "lightning_halo.strategy": ["HaloQuantStrategy"],
        "lightning_halo.verification": ["VerifyError", "VerifyReport", "verify"],
    },
)

if TYPE_CHECKING:  # for type checkers and the API docs (griffe reads these statically)
    from lightning_halo.callbacks import (
        EpochPrinter,
        HaloPredictionWriter,
        HaloRequeue,
        HaloSchedule,
        HaloStateCallback,
        HaloTrafficLogger,
    )
    from lightning_halo.data import GraphValidationError, HaloDataModule, load_graph
    from lightning_halo.data.link_datamodule import HaloLinkDataModule
    from lightning_halo.link import gather_rows
    from lightning_halo.exchange import HaloExchangeError
    from lightning_halo.layers import (
        UnsupportedEdgesError,
        UnsupportedLayerError,
        register_aggregation,
        register_layer,
        supported_layers,
        unsupported_layers,
        wrapper_layers,
    )
    from lightning_halo.layers.dropedge import dropout_edge
    from lightning_halo.loss import global_mean
    from lightning_halo.partition import build_halo_partitions, partition_graph, partition_stats, sparse_adjacency
    from lightning_halo.partition.halo_partition import HaloPartition
    from lightning_halo.planner.plan import plan
    from lightning_halo.strategy import HaloQuantStrategy
    from lightning_halo.verification import VerifyError, VerifyReport, verify


def _make_strategy(**init_params: Any) -> Any:
    """What ``strategy="halo_quant"`` calls: imports the strategy only when a Trainer asks for it."""
    from lightning_halo.strategy import HaloQuantStrategy

    return HaloQuantStrategy(**init_params)


def _register(strategies: ModuleType) -> None:
    register_names(strategies.StrategyRegistry, _make_strategy)


# Lightning only scans its own modules, so we register our names (lightning_halo.names). The
# registry calls ``_make_strategy(**init_params)``, exactly as it would call the class. A Trainer
# looks names up in ``lightning.pytorch.strategies``: registering as soon as that module is loaded
# (now, if it is) means ``import lightning_halo`` alone, and ``lightning-halo --help``, import no
# Lightning and no torch.
when_imported("lightning.pytorch.strategies", _register)
_mirror.install()  # lightning_halo.pytorch_lightning: the same classes on the classic namespace

# Lightning 2.6 builds `torch.utils._pytree.LeafSpec()` in its own batch handling, which torch >= 2.9
# deprecates with a FutureWarning on every fit/validate/test (Lightning-AI/pytorch-lightning#21326).
# Nothing a user can change causes or fixes it; hide exactly that call site, nothing else.
warnings.filterwarnings(
    "ignore",
    message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    category=FutureWarning,
    module=r"lightning\.pytorch\.utilities\._pytree",
)
