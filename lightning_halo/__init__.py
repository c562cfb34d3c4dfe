"""lightning-halo: distributed full-graph GNN training for PyTorch Lightning and PyG.

Partition the graph (:class:`HaloDataModule`), exchange halo rows around every
message-passing layer (:class:`HaloQuantStrategy`), keep the LightningModule ordinary PyG code.
"""

from lightning.pytorch.strategies import StrategyRegistry

from lightning_halo.callbacks import HaloSchedule, HaloStateCallback, HaloTrafficLogger
from lightning_halo.data import GraphValidationError, HaloDataModule, load_graph
from lightning_halo.exchange import HaloExchangeError
from lightning_halo.layers import (
    UnsupportedEdgesError,
    UnsupportedLayerError,
    register_layer,
    supported_layers,
    unsupported_layers,
    wrapper_layers,
)
from lightning_halo.loss import global_mean
from lightning_halo.partition import build_halo_partitions, partition_graph, partition_stats, sparse_adjacency
from lightning_halo.partition.halo_partition import HaloPartition
from lightning_halo.strategy import HaloQuantStrategy

__version__ = "0.1.0"

# Lightning only scans its own modules; register our names once (a second registration raises).
HaloQuantStrategy.register_strategies(StrategyRegistry)

__all__ = [
    "GraphValidationError",
    "HaloDataModule",
    "HaloExchangeError",
    "HaloPartition",
    "HaloQuantStrategy",
    "HaloSchedule",
    "HaloStateCallback",
    "HaloTrafficLogger",
    "UnsupportedEdgesError",
    "UnsupportedLayerError",
    "build_halo_partitions",
    "global_mean",
    "load_graph",
    "partition_graph",
    "partition_stats",
    "register_layer",
    "sparse_adjacency",
    "supported_layers",
    "unsupported_layers",
    "wrapper_layers",
]
