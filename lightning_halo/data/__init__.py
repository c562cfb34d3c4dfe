"""Graph sources, validation, partition directories and the cache, and the Lightning DataModule."""

from lightning_halo.data.datamodule import HaloDataModule
from lightning_halo.data.datasets import BUNDLED, load_bundled
from lightning_halo.data.partition_dir import PartitionDirectory, PartitionFileError
from lightning_halo.data.sources import load_graph, load_npy_graph, save_npy_graph
from lightning_halo.data.validation import GraphValidationError, validate_graph

__all__ = [
    "BUNDLED",
    "GraphValidationError",
    "HaloDataModule",
    "PartitionDirectory",
    "PartitionFileError",
    "load_bundled",
    "load_graph",
    "load_npy_graph",
    "save_npy_graph",
    "validate_graph",
]
