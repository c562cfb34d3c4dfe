"""HaloDataModule: partition once per node (or read a partition directory), hand each rank its own part."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any, Optional, Union

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, IterableDataset
from torch_geometric.data import Data
from typing_extensions import override

from lightning_halo.data.cache import PartitionCache, cache_key, default_cache_dir
from lightning_halo.data.hetero import (
    HeteroPartitionCache,
    HeteroPartitionDirectory,
    HeteroSource,
    format_hetero_stats,
    hetero_cache_key,
    is_hetero_partition_dir,
    open_hetero,
)
from lightning_halo.data.partition_dir import (
    MANIFEST,
    PartitionDirectory,
    PartitionFileError,
    check_world_size,
    is_partition_dir,
)
from lightning_halo.data.sources import InMemorySource, PathSource, load_graph
from lightning_halo.data.validation import is_hetero
from lightning_halo.errors import internal_error
from lightning_halo.partition.halo import format_stats, partitioner_label
from lightning_halo.partition.halo_partition import HaloPartition
from lightning_halo.partition.options import Balance, Partitioner, check_num_parts, check_options

log = logging.getLogger(__name__)

__all__ = ["HaloDataModule", "load_graph"]


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


def _warn_rebuild(store: PartitionDirectory, rank: int, what: str) -> None:
    rank_zero_warn(f"lightning-halo: partition cache {store.dir} is {what}; rebuilding it.")
    warnings.warn(f"rank {rank}: partition cache {store.dir} is {what}; rebuilding it", stacklevel=3)


def _raise_everywhere(failure: Optional[Exception], world_size: int) -> None:
    """Raise ``failure`` here and a pointer to it on every other rank (one small collective).

    Only the rank whose part file is damaged can tell (each rank hashes its own part); without
    this, its peers would stop later with a lost-connection error that names nothing.
    """
    import torch.distributed as dist

    if world_size > 1 and dist.is_available() and dist.is_initialized():
        messages: list[Optional[str]] = [None] * world_size
        dist.all_gather_object(messages, None if failure is None else str(failure))
        bad = [(r, m) for r, m in enumerate(messages) if m]
        if bad and failure is None:
            rank, message = bad[0]
            raise PartitionFileError(f"rank {rank} cannot load its partition: {message}")
    if failure is not None:
        raise failure


class HaloDataModule(pl.LightningDataModule):
    r"""Partitions a graph for distributed full-graph training and serves each rank its part.

    Two ways in:

    * **A partition directory** written beforehand by ``lightning-halo partition GRAPH --parts P
      --out DIR``: every rank reads the manifest and memory-maps its own part file only. No
      process touches the whole graph, which may be larger than any host's memory.
    * **A graph** (a :class:`~torch_geometric.data.Data`, a file, a graph directory of ``.npy``
      files, ``"cora"``, ``"pyg:..."``): in ``prepare_data`` (once per node) the graph is split
      into ``num_parts`` parts with METIS (pymetis, on the symmetrised graph without
      self-loops, seeded) or a random baseline, each part gets its halo and exchange plan, and
      the parts are written to a partition directory in the cache, under a content hash of
      the graph and the parameters. The graph's facts (fingerprint, ``num_features``, ...) of a
      path are stored next to the cache, so the other ranks never load the graph.

    In ``setup`` each rank loads only its own :class:`HaloPartition` (checked against the
    manifest's SHA-256, memory-mapped), moves it to its device once, and every dataloader
    yields it as the epoch's single batch. A damaged cache entry is rebuilt with a warning; a
    damaged partition directory is an error naming the file and the fix (it is never
    modified).

    Args:
        data (Data or str): the graph or a partition directory: a
            :class:`~torch_geometric.data.Data` with ``x``, ``edge_index``, ``y`` and
            ``train_mask`` / ``val_mask`` / ``test_mask``; a path to ``torch.save(data, path)``
            (read memory-mapped); a graph directory of ``.npy`` files (see
            :mod:`lightning_halo.data.sources`); a bundled dataset name (``"cora"``);
            ``"pyg:<Class>:<root>[:<name>]"`` for a PyG dataset folder with its raw files; or a
            partition directory. (default: ``"cora"``)
        num_parts (int, optional): number of parts; must equal the world size. Defaults to
            the world size (or, for a partition directory, its part count).
        partitioner (str, optional): ``"metis"`` (pymetis), ``"kaminpar"`` (a fraction of
            METIS' memory, several times faster; single-threaded here, so every node of a
            multi-node job computes the same parts), ``"auto"`` (METIS when its predicted memory
            fits half the machine, else KaMinPar) or ``"random"``; see
            :func:`~lightning_halo.partition_graph`. (default: ``"metis"``)
        balance (str, optional): METIS balances ``"nodes"`` or ``"edges"`` per part.
            (default: ``"nodes"``)
        seed (int, optional): partitioner seed. (default: ``0``)
        cache_dir (str, optional): partition cache root, also where the ranks remember which part
            files matched their SHA-256 (read whole once per file, not at every start:
            :mod:`~lightning_halo.data.checksums`). Defaults to ``$LIGHTNING_HALO_CACHE`` or
            ``~/.cache/lightning_halo``.

    With a partition directory, ``partitioner``, ``balance`` and ``seed`` are those it was
    written with (its manifest), and ``cache_dir`` holds only the record of checked files.

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
        partitioner: Partitioner = "metis",
        balance: Balance = "nodes",
        seed: int = 0,
        cache_dir: Optional[str] = None,
    ) -> None:
        super().__init__()
        check_options(partitioner, balance, num_parts)
        self.num_parts = num_parts
        self.partitioner = partitioner
        self.balance = balance
        self.seed = seed
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._source: Union[InMemorySource, PathSource, PartitionDirectory, HeteroSource, HeteroPartitionDirectory]
        hetero = open_hetero(data)  # a torch.save'd HeteroData or a heterogeneous graph directory
        if isinstance(data, (InMemorySource, HeteroSource)):  # a graph built at first use (HaloLinkDataModule's stages)
            self._source = data
        elif isinstance(data, Data):
            self._source = InMemorySource(data)
        elif is_hetero(data):
            self._source = HeteroSource(data)
        elif hetero is not None:
            self._source = HeteroSource(hetero, description=str(data))
        elif isinstance(data, (str, os.PathLike)) and is_hetero_partition_dir(data):
            self._source = HeteroPartitionDirectory(data, cache_dir=self.cache_dir)
        elif isinstance(data, (str, os.PathLike)) and is_partition_dir(data):
            self._source = PartitionDirectory(data, cache_dir=self.cache_dir)
        elif isinstance(data, (str, os.PathLike)):
            self._source = PathSource(data, self.cache_dir)
        else:
            load_graph(data)  # raises the explanation
        self._data: Optional[Data] = None
        self.partition: Optional[HaloPartition] = None
        self.stats: Optional[dict[str, Any]] = None
        self._logged_key: Optional[str] = None

    # ------------------------------------------------------------------ graph access
    @property
    def data(self) -> Data:
        """The whole graph, loaded and validated on first access (not available for a partition directory)."""
        if isinstance(self._source, (PartitionDirectory, HeteroPartitionDirectory)):
            raise ValueError(
                f"{self._source.dir} is a partition directory: it holds each rank's part, not the whole graph. "
                "Use dm.partitions() or load the original graph with lightning_halo.load_graph."
            )
        if self._data is None:
            self._data = self._source.graph()
        return self._data

    @property
    def reads_partition_dir(self) -> bool:
        """Whether this data module reads a partition directory (each rank's part, never the whole graph)."""
        return isinstance(self._source, (PartitionDirectory, HeteroPartitionDirectory))

    @property
    def hetero(self) -> bool:
        """Whether the graph is heterogeneous (each rank's batch a :class:`~lightning_halo.partition.hetero.HeteroHaloPartition`)."""
        return isinstance(self._source, (HeteroSource, HeteroPartitionDirectory))

    @property
    def metadata(self) -> tuple[list[str], list[tuple[str, str, str]]]:
        """A heterogeneous graph's ``(node_types, edge_types)``, as ``HeteroData.metadata()`` gives them (for
        ``to_hetero`` and ``HGTConv``), available before ``setup``."""
        facts = self._hetero_facts("metadata")
        return list(facts["node_types"]), [tuple(e) for e in facts["edge_types"]]  # type: ignore[misc]

    @property
    def labelled_type(self) -> str:
        """The node type a heterogeneous graph's training reads ``y`` and the masks of."""
        return str(self._hetero_facts("labelled_type")["labelled_type"])

    def _hetero_facts(self, what: str) -> dict[str, Any]:
        if not self.hetero:
            raise AttributeError(f"HaloDataModule.{what} is for heterogeneous graphs (HeteroData); this graph is a Data")
        return self._facts()

    def _facts(self) -> dict[str, Any]:
        if isinstance(self._source, (PartitionDirectory, HeteroPartitionDirectory)):
            return self._source.read_meta()["graph"]
        return self._source.facts()

    def _total_nodes(self) -> int:
        found = self._facts()["num_nodes"]
        return sum(found.values()) if isinstance(found, dict) else int(found)

    @property
    def graph_fingerprint(self) -> Optional[str]:
        """The graph's content hash (as the partition cache keys it), which checkpoints record; ``None`` for a
        partition directory whose manifest does not record it (written before fingerprints were kept)."""
        found = self._facts().get("fingerprint")
        return None if found is None else str(found)

    @property
    def num_features(self) -> Any:
        """Input feature dimension, available before ``setup`` (from the manifest, never the whole graph); for a
        heterogeneous graph a dict by node type (0 for a type without features)."""
        found = self._facts()["num_features"]
        return dict(found) if isinstance(found, dict) else int(found)

    @property
    def num_classes(self) -> int:
        """Number of classes (``y.max() + 1``, or ``y.size(1)`` for 2-D targets), available before ``setup``."""
        return int(self._facts()["num_classes"])

    @property
    def num_nodes(self) -> Any:
        """Nodes of the whole graph (the rows of :meth:`gather_predictions`), available before ``setup``; for a
        heterogeneous graph a dict by node type."""
        found = self._facts()["num_nodes"]
        return dict(found) if isinstance(found, dict) else int(found)

    # ------------------------------------------------------------------ predictions
    def gather_predictions(self, predictions: Any, dst: Optional[int] = None, node_type: Optional[str] = None) -> Any:
        """The predictions of every rank for the whole graph, in global node order.

        ``trainer.predict(model, datamodule=dm)`` returns, on each rank, what ``predict_step``
        returned for that rank's partition: one row per node the rank owns, in the partition's
        order. This puts the rows of all ranks together, row ``i`` for node ``i`` of the graph
        (the order of ``dm.data`` and of the original graph), on the CPU: the ``[N, ...]``
        tensor a single-process forward over the whole graph gives (equal at ``eval_bits=32``,
        the default). ``predict_step`` may return a tensor or a dict, tuple or list of
        tensors; the result has the same structure.

        A collective: call it on every rank, after ``trainer.predict`` with this data module.
        Every rank receives the result, or only rank ``dst`` (the others get ``None``), which
        keeps a large graph's ``[N, ...]`` tensor off the other ranks.

        Args:
            predictions (Any): what ``trainer.predict`` returned (a list with one entry: this
                data module yields one batch per rank), or that entry.
            dst (int, optional): the only rank to receive the result. (default: ``None``,
                every rank)
            node_type (str, optional): for a heterogeneous graph, the node type ``predict_step``
                returned rows of: the result is ``[N_type, ...]`` in the type's order.
                (default: the labelled type)

        Example:
            >>> logits = dm.gather_predictions(trainer.predict(model, datamodule=dm))  # doctest: +SKIP
            >>> logits.shape == (dm.num_nodes, dm.num_classes)  # doctest: +SKIP
            True
        """
        from lightning_halo.data.predictions import gather_predictions

        if predictions is None:
            raise ValueError(
                "no predictions: trainer.predict returned None (return_predictions=False, or a spawn-based strategy). "
                "Call trainer.predict(model, datamodule=dm, return_predictions=True), or add "
                "lightning_halo.HaloPredictionWriter to the Trainer's callbacks."
            )
        if self.partition is None:
            raise RuntimeError(
                "HaloDataModule.gather_predictions needs this rank's partition: call trainer.predict(model, datamodule=dm) "
                "first, with this data module."
            )
        if isinstance(predictions, list) and len(predictions) == 1:
            predictions = predictions[0]  # trainer.predict's list of batch outputs: one batch per rank
        return gather_predictions(predictions, self.partition, dst=dst, node_type=node_type)

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
        check_num_parts(num_parts, self._total_nodes())
        return num_parts

    def cache_for(self, num_parts: int) -> Any:
        """Where the partitioning into ``num_parts`` lives: its cache entry, or the partition directory itself."""
        if isinstance(self._source, (PartitionDirectory, HeteroPartitionDirectory)):
            check_world_size(self._source.dir, self._source.read_meta(), num_parts)
            return self._source
        if isinstance(self._source, HeteroSource):
            key = hetero_cache_key(self._facts()["fingerprint"], num_parts=num_parts, partitioner=self.partitioner, seed=self.seed)
            return HeteroPartitionCache(self.cache_dir, key)
        key = cache_key(
            self._facts()["fingerprint"], num_parts=num_parts, partitioner=self.partitioner, balance=self.balance, seed=self.seed
        )
        return PartitionCache(self.cache_dir, key)

    def build(self, num_parts: Optional[int] = None, on_phase: Any = None) -> dict[str, Any]:
        """Partition into the cache unless it is there already; return the manifest.

        Args:
            num_parts (int, optional): defaults to ``num_parts`` (or the partition
                directory's part count, or 1).
            on_phase (callable, optional): passed to the writer (see
                :func:`~lightning_halo.data.partition_dir.write_partition_dir`).
        """
        num_parts = num_parts or self.num_parts or self._default_parts()
        store = self.cache_for(num_parts)
        if isinstance(store, (PartitionCache, HeteroPartitionCache)) and not store.is_complete():
            check_num_parts(num_parts, self._total_nodes())
            return self._write(store, num_parts, on_phase)
        return store.read_meta()

    def _write(self, store: Any, num_parts: int, on_phase: Any = None) -> dict[str, Any]:
        if isinstance(self._source, (PartitionDirectory, HeteroPartitionDirectory)):
            raise internal_error(f"a write into the user's partition directory {self._source.dir} (it is never rewritten)")
        if isinstance(self._source, HeteroSource):
            return store.write(self._source.open(), num_parts, graph=self._facts(), partitioner=self.partitioner, seed=self.seed)
        return store.write(
            self._source.open(), num_parts, graph=self._facts(), on_phase=on_phase,
            partitioner=self.partitioner, balance=self.balance, seed=self.seed,
        )  # fmt: skip

    def _default_parts(self) -> int:
        if isinstance(self._source, (PartitionDirectory, HeteroPartitionDirectory)):
            return int(self._source.read_meta()["num_parts"])
        return 1

    def partitions(self, num_parts: Optional[int] = None) -> list[Any]:
        """Compute (or load from the cache) all partitions, e.g. for inspection; not used in training."""
        num_parts = num_parts or self.num_parts or self._default_parts()
        manifest = self.build(num_parts)
        store = self.cache_for(num_parts)
        return [store.load_part(p) for p in range(int(manifest["num_parts"]))]

    @override
    def prepare_data(self) -> None:
        """Partition into the cache (runs on one process per node while the other ranks wait).

        Errors are not raised here: only this process would stop, leaving its peers waiting in
        Lightning's next barrier. ``setup`` (run by every rank) meets the same error and raises
        it everywhere. Nothing to do for a partition directory.
        """
        if isinstance(self._source, (PartitionDirectory, HeteroPartitionDirectory)):
            return
        world_size, _ = self._world()
        try:
            self.build(self._resolve_num_parts(world_size))
        except Exception as err:  # noqa: BLE001 - re-raised by setup() on every rank
            log.warning("lightning-halo: partitioning failed in prepare_data (%s); setup() will report it", err)

    @override
    def setup(self, stage: str) -> None:
        """Load this rank's partition (checked against the manifest) onto its device."""
        world_size, rank = self._world()
        if isinstance(self._source, (PartitionDirectory, HeteroPartitionDirectory)):
            store = self.cache_for(world_size)
            if self.num_parts is not None:
                self._resolve_num_parts(world_size)
        else:
            store = self.cache_for(self._resolve_num_parts(world_size))
            if not store.is_complete():  # setup() without prepare_data(), or a damaged entry
                if (store.dir / MANIFEST).exists():
                    _warn_rebuild(store, rank, "incomplete (a part file is missing or truncated)")
                self.build(world_size)
        failure: Optional[Exception] = None
        try:
            part = store.load_part(rank)
        except PartitionFileError as err:
            if isinstance(store, (PartitionCache, HeteroPartitionCache)):  # derived data: rebuild it
                _warn_rebuild(store, rank, f"corrupt ({err})")
                self._write(store, world_size)
                part = store.load_part(rank)
            else:  # the user's directory: never modified; the message says how to repair it
                failure = err
        _raise_everywhere(failure, world_size)
        manifest = store.read_meta()
        self.stats = manifest["stats"]
        device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        self.partition = part.to(device)
        self._log_stats(manifest, store)
        self._data = None  # the whole graph is not needed on this rank; reloaded only if asked for

    def _log_stats(self, manifest: dict[str, Any], store: Any) -> None:
        if self._logged_key == manifest["key"]:
            return  # once per partitioning, not again for validate/test/predict
        self._logged_key = manifest["key"]
        stats = manifest["stats"]
        title = f"lightning-halo partition ({partitioner_label(manifest)}, {stats['num_parts']} parts, {store.dir})"
        trainer = self.trainer
        if self.hetero:
            rank_zero_info("\n".join(format_hetero_stats(stats, title)))
            if trainer is not None and trainer.logger is not None and trainer.global_rank == 0:
                figures = {"partition/edge_cut": float(stats["edge_cut"]), "partition/halo_rows": float(stats["halo_rows"]),
                           **{f"partition/halo_rows/{t}": float(n) for t, n in stats["halo_rows_per_type"].items()}}  # fmt: skip
                trainer.logger.log_metrics(figures, step=0)
            return
        rank_zero_info("\n".join(format_stats(stats, title)))
        if trainer is not None and trainer.logger is not None and trainer.global_rank == 0:
            trainer.logger.log_metrics(
                {
                    "partition/edge_cut": float(stats["edge_cut"]),
                    "partition/halo_rows": float(stats["halo_rows"]),
                    **({"partition/halo_rows_cover": float(stats["halo_rows_cover"])} if "halo_rows_cover" in stats else {}),
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
        # A prediction writer asks for the sample indices of each batch; the batch is the partition, whose
        # nodes are named by batch.inner_global_id (what HaloPredictionWriter uses).
        warnings.filterwarnings("ignore", message="Couldn't infer the batch indices fetched from your dataloader")
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
