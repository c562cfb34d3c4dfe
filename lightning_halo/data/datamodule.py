"""HaloDataModule: partition once per node, hand each rank its own partition every epoch."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any, Literal, Optional, Union

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, IterableDataset
from torch_geometric.data import Data
from typing_extensions import override

from lightning_halo.data.cache import (
    CacheCorruptError,
    PartitionCache,
    cache_key,
    default_cache_dir,
    graph_fingerprint,
)
from lightning_halo.data.datasets import BUNDLED, load_bundled
from lightning_halo.data.pyg_datasets import PREFIX as PYG_PREFIX
from lightning_halo.data.pyg_datasets import load_pyg_dataset
from lightning_halo.data.validation import GraphValidationError, infer_num_classes, validate_graph
from lightning_halo.partition import build_halo_partitions, partition_graph, partition_stats
from lightning_halo.partition.halo_partition import HaloPartition

log = logging.getLogger(__name__)


class _OnePartition(IterableDataset):
    """Yields this rank's partition once per epoch.

    An ``IterableDataset`` (with ``batch_size=None``) is never wrapped in a
    ``DistributedSampler``, so the Trainer's default ``use_distributed_sampler=True`` is
    harmless, and the object yielded is the device-resident partition itself: no
    host-to-device copy per epoch.
    """

    def __init__(self, partition: HaloPartition) -> None:
        self.partition = partition

    def __iter__(self):  # type: ignore[override]
        yield self.partition

    def __len__(self) -> int:
        return 1


def _identity(batch: Any) -> Any:
    return batch


def load_graph(source: Union[str, os.PathLike, Data]) -> Data:
    """Resolve a graph source: a ``Data``, a ``torch.save``'d ``Data`` file, or a bundled name.

    Files are read with ``torch.load(weights_only=True)`` and only PyG's ``Data`` classes
    allow-listed: a file holding anything else is rejected, never unpickled.

    Args:
        source (Data or str): a :class:`~torch_geometric.data.Data`, a path to
            ``torch.save(data, path)``, a bundled name (``"cora"``) or
            ``"pyg:<Class>:<root>[:<name>]"``.

    Returns:
        The validated graph.

    Example:
        >>> load_graph("cora").num_nodes
        2708
    """
    if isinstance(source, Data):
        return validate_graph(source)
    if not isinstance(source, (str, os.PathLike)):
        raise GraphValidationError(
            f"data must be a torch_geometric Data, a file path or a bundled dataset name, got {type(source).__name__}"
        )
    path = Path(source)
    if path.is_file():
        from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
        from torch_geometric.data.storage import GlobalStorage

        try:
            with torch.serialization.safe_globals([Data, DataEdgeAttr, DataTensorAttr, GlobalStorage]):
                obj = torch.load(path, weights_only=True, map_location="cpu")
        except Exception as err:  # pickle errors, zip errors, truncated files
            raise GraphValidationError(
                f"{path} is not a torch.save'd torch_geometric Data that loads safely ({type(err).__name__}: "
                f"{str(err).splitlines()[0][:200]}). Save the graph with torch.save(data, path)."
            ) from err
        return validate_graph(obj, source=str(path))
    if isinstance(source, str) and source.startswith(PYG_PREFIX):
        return validate_graph(load_pyg_dataset(source), source=source)
    if isinstance(source, str) and source.lower() in BUNDLED:
        return validate_graph(load_bundled(source), source=f"bundled dataset {source!r}")
    raise GraphValidationError(
        f"data={str(source)!r} is neither an existing file nor a bundled dataset name "
        f"(bundled: {sorted(BUNDLED)}). Pass a torch_geometric Data, a path to torch.save(data, path), a bundled "
        "name, or pyg:<Class>:<root>[:<name>] for a PyG dataset folder."
    )


class HaloDataModule(pl.LightningDataModule):
    r"""Partitions a graph for distributed full-graph training and serves each rank its part.

    In ``prepare_data`` (once per node) the graph is split into ``num_parts`` parts with METIS
    (pymetis, on the symmetrised graph without self-loops, seeded) or a random baseline, each
    part gets its halo and exchange plan (:func:`~lightning_halo.partition.build_halo_partitions`),
    and the result is cached on disk under a content hash of the graph and the parameters.
    In ``setup`` each rank loads only its own :class:`HaloPartition`, moves it to its device
    once, and every dataloader yields it as the epoch's single batch.

    Args:
        data (Data or str): the graph: a :class:`~torch_geometric.data.Data` with ``x``,
            ``edge_index``, ``y`` and ``train_mask`` / ``val_mask`` / ``test_mask``; a path to
            a file written with ``torch.save(data, path)``; a bundled dataset name
            (``"cora"``); or ``"pyg:<Class>:<root>[:<name>]"`` for a PyG dataset folder with its
            raw files (see :func:`~lightning_halo.data.pyg_datasets.load_pyg_dataset`).
            (default: ``"cora"``)
        num_parts (int, optional): number of parts; must equal the world size. Defaults to
            the world size.
        partitioner (str, optional): ``"metis"`` or ``"random"``. (default: ``"metis"``)
        balance (str, optional): METIS balances ``"nodes"`` or ``"edges"`` per part.
            (default: ``"nodes"``)
        seed (int, optional): partitioner seed. (default: ``0``)
        cache_dir (str, optional): partition cache root. Defaults to
            ``$LIGHTNING_HALO_CACHE`` or ``~/.cache/lightning_halo``.

    Example:
        >>> dm = HaloDataModule("cora")
        >>> dm.num_features, dm.num_classes
        (1433, 7)
        >>> trainer = L.Trainer(strategy=HaloQuantStrategy(), devices=2)  # doctest: +SKIP
        >>> trainer.fit(model, datamodule=dm)  # doctest: +SKIP
    """

    def __init__(
        self,
        data: Union[str, Data] = "cora",
        num_parts: Optional[int] = None,
        partitioner: Literal["metis", "random"] = "metis",
        balance: Literal["nodes", "edges"] = "nodes",
        seed: int = 0,
        cache_dir: Optional[str] = None,
    ) -> None:
        super().__init__()
        if partitioner not in ("metis", "random"):
            raise ValueError(f"unknown partitioner {partitioner!r}; choose 'metis' or 'random'")
        if balance not in ("nodes", "edges"):
            raise ValueError(f"unknown balance {balance!r}; choose 'nodes' or 'edges'")
        if num_parts is not None and (not isinstance(num_parts, int) or num_parts < 1):
            raise ValueError(f"num_parts must be a positive integer or None, got {num_parts!r}")
        self._source = data
        self.num_parts = num_parts
        self.partitioner = partitioner
        self.balance = balance
        self.seed = seed
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._data: Optional[Data] = data if isinstance(data, Data) else None
        self._validated = False
        self._fingerprint: Optional[str] = None
        self._num_features: Optional[int] = None
        self._num_classes: Optional[int] = None
        self.partition: Optional[HaloPartition] = None
        self.stats: Optional[dict[str, Any]] = None
        self._logged_key: Optional[str] = None

    # ------------------------------------------------------------------ graph access
    @property
    def data(self) -> Data:
        """The whole graph (loaded and validated on first access)."""
        if self._data is None or not self._validated:
            self._data = load_graph(self._source if self._data is None else self._data)
            self._validated = True
            self._num_features = int(self._data.x.size(1))
            self._num_classes = infer_num_classes(self._data.y)
        return self._data

    @property
    def num_features(self) -> int:
        """Input feature dimension, available before ``setup``."""
        if self._num_features is None:
            _ = self.data
        assert self._num_features is not None
        return self._num_features

    @property
    def num_classes(self) -> int:
        """Number of classes (``y.max() + 1``, or ``y.size(1)`` for 2-D targets), available before ``setup``."""
        if self._num_classes is None:
            _ = self.data
        assert self._num_classes is not None
        return self._num_classes

    # ------------------------------------------------------------------ partitioning
    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 1, 0
        return int(trainer.world_size), int(trainer.global_rank)

    def _resolve_num_parts(self, world_size: int) -> int:
        num_parts = self.num_parts if self.num_parts is not None else world_size
        if num_parts != world_size:
            raise ValueError(
                f"HaloDataModule(num_parts={num_parts}) but the Trainer runs {world_size} processes "
                f"(devices x num_nodes); each process owns one part, so they must be equal. "
                f"Leave num_parts unset to follow the Trainer, or launch {num_parts} processes."
            )
        n = self._num_nodes()
        if num_parts > n:
            raise ValueError(
                f"num_parts={num_parts} exceeds the graph's {n} nodes: every part needs at least one node. "
                f"Use at most {n} processes."
            )
        return num_parts

    def _num_nodes(self) -> int:
        return int(self.data.x.size(0))

    def _cache(self, num_parts: int) -> PartitionCache:
        if self._fingerprint is None:
            self._fingerprint = graph_fingerprint(self.data)
        key = cache_key(
            self._fingerprint, num_parts=num_parts, partitioner=self.partitioner, balance=self.balance, seed=self.seed
        )
        return PartitionCache(self.cache_dir, key)

    def partitions(self, num_parts: Optional[int] = None) -> list[HaloPartition]:
        """Compute (or load from the cache) all partitions, e.g. for inspection; not used in training."""
        num_parts = num_parts or self.num_parts or 1
        self._resolve_num_parts(num_parts)
        cache = self._cache(num_parts)
        if not cache.is_complete():
            self._build(cache, num_parts)
        return [cache.load_part(p) for p in range(num_parts)]

    def _build(self, cache: PartitionCache, num_parts: int) -> dict[str, Any]:
        data = self.data
        parts = partition_graph(
            data.edge_index,
            data.num_nodes,
            num_parts,
            partitioner=self.partitioner,
            seed=self.seed,
            balance=self.balance,
        )
        partitions = build_halo_partitions(data, parts, num_parts)
        meta = {
            "num_parts": num_parts,
            "partitioner": self.partitioner,
            "balance": self.balance,
            "seed": self.seed,
            "graph_fingerprint": self._fingerprint,
            "num_features": self.num_features,
            "num_classes": self.num_classes,
            "stats": partition_stats(partitions),
        }
        cache.write(partitions, meta)
        return meta

    @override
    def prepare_data(self) -> None:
        """Partition and cache (runs on one process per node while the other ranks wait).

        Errors are not raised here: only this process would stop, leaving its peers waiting in
        Lightning's next barrier. ``setup`` (run by every rank) meets the same error and raises
        it everywhere.
        """
        world_size, _ = self._world()
        try:
            num_parts = self._resolve_num_parts(world_size)
            cache = self._cache(num_parts)
            if cache.is_complete():
                log.info("lightning-halo: reusing cached partition %s", cache.dir)
                return
            self._build(cache, num_parts)
        except Exception as err:  # noqa: BLE001 - re-raised by setup() on every rank
            log.warning("lightning-halo: partitioning failed in prepare_data (%s); setup() will report it", err)

    @override
    def setup(self, stage: str) -> None:
        """Load this rank's partition (verified against the cache's hashes) onto its device."""
        world_size, rank = self._world()
        num_parts = self._resolve_num_parts(world_size)
        cache = self._cache(num_parts)
        if not cache.is_complete():  # e.g. setup() called without prepare_data()
            self._build(cache, num_parts)
        try:
            part = cache.load_part(rank)
        except CacheCorruptError as err:
            rank_zero_warn(f"lightning-halo: partition cache is corrupt ({err}); rebuilding it.")
            warnings.warn(f"rank {rank}: partition cache corrupt ({err}); rebuilding", stacklevel=2)
            self._build(cache, num_parts)
            part = cache.load_part(rank)
        meta = cache.read_meta()
        self.stats = meta["stats"]
        device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        self.partition = part.to(device)
        self._log_stats(meta)
        if not isinstance(self._source, Data):
            self._data = None  # the full graph is no longer needed on this rank; reload lazily if asked
            self._validated = False

    def _log_stats(self, meta: dict[str, Any]) -> None:
        if self._logged_key == meta["key"]:
            return  # once per partitioning, not again for validate/test/predict
        self._logged_key = meta["key"]
        stats = meta["stats"]
        lines = [
            f"lightning-halo partition ({meta['partitioner']}, {stats['num_parts']} parts, cache {self._cache(stats['num_parts']).dir}):",
            f"  edge cut {stats['edge_cut']}, halo rows {stats['halo_rows']}, balance {stats['balance']:.3f}, "
            f"replication {stats['replication']:.3f}",
        ]
        for p in range(stats["num_parts"]):
            lines.append(
                f"  rank {p}: owns {stats['nodes'][p]} nodes, {stats['edges'][p]} in-edges, "
                f"{stats['halo_nodes'][p]} halo nodes, sends {stats['send_rows'][p]} rows"
            )
        rank_zero_info("\n".join(lines))
        trainer = self.trainer
        if trainer is not None and trainer.logger is not None and trainer.global_rank == 0:
            trainer.logger.log_metrics(
                {
                    "partition/edge_cut": float(stats["edge_cut"]),
                    "partition/halo_rows": float(stats["halo_rows"]),
                    "partition/balance": float(stats["balance"]),
                    "partition/replication": float(stats["replication"]),
                },
                step=0,
            )

    # ------------------------------------------------------------------ loaders
    def _loader(self) -> DataLoader:
        if self.partition is None:
            raise RuntimeError("HaloDataModule.setup() has not run; let the Trainer call it (trainer.fit(..., datamodule=dm)).")
        # One batch per epoch is the point of full-graph training; silence Lightning's worker hint.
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*`IterableDataset` has `__len__` defined.*")
        return DataLoader(_OnePartition(self.partition), batch_size=None, collate_fn=_identity, num_workers=0)

    @override
    def train_dataloader(self) -> DataLoader:
        return self._loader()

    @override
    def val_dataloader(self) -> DataLoader:
        return self._loader()

    @override
    def test_dataloader(self) -> DataLoader:
        return self._loader()

    @override
    def predict_dataloader(self) -> DataLoader:
        return self._loader()
