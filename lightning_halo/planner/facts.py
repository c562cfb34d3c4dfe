r"""What the planner knows about a partitioning: per-rank counts, and where they came from.

Three sources, most exact first (:attr:`Partitioning.source` says which one answered):

* ``"manifest"``: a partition directory's ``manifest.json``: the exact per-part inner,
  halo, sent and partial-sum row counts, edge counts and part-file sizes, without loading a part;
* ``"partitioned"``: a graph partitioned into the cache (what ``HaloDataModule`` does), then
  read as above: exact, and the same partitions training will use;
* ``"estimate"``: only node, edge and feature counts and an assumed cut ratio (the share of
  edges whose endpoints lie in different parts): balanced parts, halos estimated by occupancy.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

#: Bytes per element of the feature dtypes a manifest names.
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Partitioning:
    r"""Per-rank counts of one partitioning into ``len(n_inner)`` parts.

    Args:
        n_inner (list[int]): inner (owned) nodes per rank.
        n_halo (list[int]): halo nodes per rank (rows it receives per exchange).
        edges (list[int]): in-edges of each rank's inner nodes.
        send_rows (list[int]): rows each rank sends per exchange.
        num_features (int): input features :math:`F`.
        num_classes (int): output classes.
        num_nodes (int): nodes of the whole graph.
        num_edges (int): edges of the whole graph (directed entries).
        feature_bytes (int, optional): bytes per input feature. (default: ``4``)
        cover_rows (list[int], optional): rows each rank receives with halo partial sums. (default: ``None``)
        part_bytes (list[int], optional): size of each ``part_<p>.pt``. (default: ``None``: estimated)
        adj_bytes (list[int], optional): size of each ``adj_<p>.pt``. (default: ``None``: estimated)
        source (str, optional): ``"manifest"``, ``"partitioned"`` or ``"estimate"``. (default: ``"manifest"``)
        note (str, optional): what was assumed, for the report. (default: ``""``)
        graph_in_memory (bool, optional): every rank holds the whole graph too (one given in memory
            or by name, ``"cora"``, ``"pyg:..."``: loaded in each process; a path or a partition
            directory is memory-mapped instead). (default: ``False``)
    """

    n_inner: list[int]
    n_halo: list[int]
    edges: list[int]
    send_rows: list[int]
    num_features: int
    num_classes: int
    num_nodes: int
    num_edges: int
    feature_bytes: int = 4
    cover_rows: Optional[list[int]] = None
    part_bytes: Optional[list[int]] = None
    adj_bytes: Optional[list[int]] = None
    source: str = "manifest"
    note: str = field(default="")
    graph_in_memory: bool = False

    @property
    def ranks(self) -> int:
        return len(self.n_inner)


def from_manifest(manifest: dict[str, Any], source: str = "manifest") -> Partitioning:
    """The counts a partition directory's manifest records (nothing else is read).

    Args:
        manifest (dict): as :func:`~lightning_halo.data.partition_dir.read_manifest` returns it.
        source (str, optional): recorded in the result. (default: ``"manifest"``)
    """
    stats, graph, files = manifest["stats"], manifest["graph"], manifest.get("files", {})
    parts = int(manifest["num_parts"])
    sizes = {kind: [files.get(f"{kind}_{p}.pt", {}).get("bytes") for p in range(parts)] for kind in ("part", "adj")}
    return Partitioning(
        n_inner=list(stats["nodes"]), n_halo=list(stats["halo_nodes"]), edges=list(stats["edges"]),
        send_rows=list(stats["send_rows"]), num_features=int(graph["num_features"]), num_classes=int(graph["num_classes"]),
        num_nodes=int(graph["num_nodes"]), num_edges=int(graph["num_edges"]),
        feature_bytes=ITEMSIZE.get(graph.get("x_dtype", "float32"), 4), cover_rows=stats.get("cover_rows"),
        part_bytes=None if None in sizes["part"] else sizes["part"], adj_bytes=None if None in sizes["adj"] else sizes["adj"],
        source=source, note=f"{parts} parts as partitioned ({manifest.get('partitioner', '?')})",
    )  # fmt: skip


def expected_halo(cut_edges: float, candidates: float) -> float:
    r"""Distinct remote sources among ``cut_edges`` cut in-edges drawn uniformly from ``candidates`` nodes.

    The occupancy estimate :math:`M (1 - e^{-k / M})`: at most ``cut_edges`` and at most
    ``candidates``; a graph with community structure has fewer (its cut edges share sources).

    Example:
        >>> round(expected_halo(1000, 1e9)), round(expected_halo(1e9, 1000))
        (1000, 1000)
    """
    if candidates <= 0 or cut_edges <= 0:
        return 0.0
    return candidates * -math.expm1(-cut_edges / candidates)


def from_counts(
    num_nodes: int, num_edges: int, num_features: int, num_classes: int, ranks: int, cut_ratio: float,
    feature_bytes: int = 4,
) -> Partitioning:  # fmt: skip
    r"""Balanced parts of a graph known only by its counts, with ``cut_ratio`` of its edges cut.

    Every rank gets :math:`N/P` nodes and :math:`E/P` in-edges, :math:`c E / P` of them from
    other parts, whose distinct sources (its halo, :func:`expected_halo`) it receives and, by
    symmetry, as many rows it sends. Partial-sum rows and file sizes are not known (the
    report estimates the files from the counts).

    Args:
        num_nodes (int): :math:`N`. num_edges (int): :math:`E` (directed entries, both
            directions of an undirected edge). num_features (int): :math:`F`.
        num_classes (int): output classes. ranks (int): :math:`P`.
        cut_ratio (float): :math:`c \in [0, 1]`, the share of edges between parts (``0`` at one rank).
        feature_bytes (int, optional): bytes per feature. (default: ``4``)
    """
    if not 0.0 <= cut_ratio <= 1.0:
        raise ValueError(f"cut_ratio must be in [0, 1] (the share of edges between parts), got {cut_ratio!r}")
    if min(num_nodes, ranks) < 1 or num_edges < 0:
        raise ValueError(f"need num_nodes >= 1, num_edges >= 0 and ranks >= 1, got {num_nodes}, {num_edges}, {ranks}")
    n = math.ceil(num_nodes / ranks)
    e = math.ceil(num_edges / ranks)
    cut = cut_ratio * e if ranks > 1 else 0.0
    halo = round(expected_halo(cut, num_nodes - num_nodes / ranks))
    return Partitioning(
        n_inner=[n] * ranks, n_halo=[halo] * ranks, edges=[e] * ranks, send_rows=[halo] * ranks,
        num_features=num_features, num_classes=num_classes, num_nodes=num_nodes, num_edges=num_edges,
        feature_bytes=feature_bytes, source="estimate",
        note=f"estimated from counts: balanced parts, {100 * cut_ratio:g} % of edges cut (assumed)",
    )  # fmt: skip


#: Why the planner refuses a heterogeneous graph, and what to use instead.
HETERO_REFUSAL = (
    "the planner models homogeneous graphs only so far (one node set, one feature width, one halo per layer); this "
    "graph is heterogeneous. `lightning-halo partition GRAPH --parts P` prints its inner and halo rows per type, "
    "and docs/heterogeneous.md ('At scale') has measured epoch times and memory per rank of a "
    "2M-node graph shaped like OGB-MAG"
)


def from_graph(graph: Any, ranks: int, partitioner: str = "metis", cache_dir: Optional[str] = None) -> Partitioning:
    """Partition ``graph`` into the cache for ``ranks`` processes (reused if there) and read its manifest.

    Args:
        graph: what ``HaloDataModule(data=...)`` takes (a path, ``"cora"``, a ``Data``) or a partition directory.
        ranks (int): parts. partitioner (str, optional): as for ``HaloDataModule``. (default: ``"metis"``)
        cache_dir (str, optional): the partition cache. (default: ``$LIGHTNING_HALO_CACHE``)
    """
    from lightning_halo.data import HaloDataModule
    from lightning_halo.data.hetero import is_hetero_partition_dir
    from lightning_halo.data.partition_dir import is_partition_dir, read_manifest

    if isinstance(graph, (str, os.PathLike)) and is_hetero_partition_dir(graph):
        raise ValueError(HETERO_REFUSAL)
    if isinstance(graph, str) and is_partition_dir(graph):
        return from_manifest(read_manifest(graph))
    dm = HaloDataModule(graph, num_parts=ranks, partitioner=partitioner, cache_dir=cache_dir)  # type: ignore[arg-type]
    if dm.hetero:
        raise ValueError(HETERO_REFUSAL)
    parts = from_manifest(dm.build(ranks), source="partitioned")
    loaded = not isinstance(graph, (str, os.PathLike)) or not Path(graph).exists()  # a Data, "cora", "pyg:..."
    return dataclasses.replace(parts, graph_in_memory=loaded)
