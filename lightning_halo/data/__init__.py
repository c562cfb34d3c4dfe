"""Graph loading, validation, caching and the Lightning DataModule."""

from lightning_halo.data.datamodule import HaloDataModule, load_graph
from lightning_halo.data.datasets import BUNDLED, load_bundled
from lightning_halo.data.validation import GraphValidationError, validate_graph

__all__ = ["BUNDLED", "GraphValidationError", "HaloDataModule", "load_bundled", "load_graph", "validate_graph"]
