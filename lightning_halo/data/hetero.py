r"""Heterogeneous graphs on disk: graph directories, their facts, partition directories and the cache.

A heterogeneous graph directory (:func:`save_npy_hetero_graph`, read by
:func:`load_npy_hetero_graph` memory-mapped, and by :class:`~lightning_halo.HaloDataModule`)::

    DIR/types.json                    the node types and edge types, in the graph's order
    DIR/nodes/<type>/x.npy            features [N_t, F_t] (a type without: num_nodes.npy, a 0-d count)
    DIR/nodes/<type>/y.npy, <split>_mask.npy, ...   any node-level array of the type
    DIR/edges/<src>__<rel>__<dst>/edge_index.npy    [2, E] ids within the source and target types
    DIR/edges/<src>__<rel>__<dst>/edge_attr.npy ... any edge-level array of the type

A heterogeneous partition directory (written for :class:`~lightning_halo.HaloDataModule` given
a :class:`~torch_geometric.data.HeteroData`, in its cache, or by :func:`write_hetero_partition_dir`)::

    DIR/manifest.json   format "lightning-halo-hetero-partition", parameters, the graph's facts
                        (node and edge types, counts, features per type, the labelled type),
                        statistics per part and type, the SHA-256 and size of every part file
    DIR/part_<p>.pt     part p: HeteroHaloPartition.to_state(), a torch.save'd dict of tensors

Part files are read with ``torch.load(mmap=True, weights_only=True)`` after the same size and
SHA-256 checks as a homogeneous partition directory
(:func:`~lightning_halo.data.partition_dir.check_part_file`). The writer builds every part in
memory (:func:`~lightning_halo.partition.hetero.build_hetero_partitions`): the streamed,
bounded-memory writer is for homogeneous graphs only so far.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor
from typing_extensions import override

from lightning_halo.data.cache import hash_attributes
from lightning_halo.data.checksums import file_sha256
from lightning_halo.data.partition_dir import (
    MANIFEST,
    PartitionDirectory,
    PartitionFileError,
    check_part_file,
    part_name,
    read_manifest,
)
from lightning_halo.data.validation import GraphValidationError, check_attribute_types, infer_num_classes, is_hetero
from lightning_halo.partition.hetero import (
    HeteroGraphError,
    HeteroHaloPartition,
    assign_hetero_parts,
    build_hetero_partitions,
    hetero_layout,
    homogeneous_edges,
)

HETERO_FORMAT = "lightning-halo-hetero-partition"
TYPES_FILE = "types.json"
#: Bumped whenever the layout of a part file or the manifest changes, so old ones are refused.
HETERO_FORMAT_VERSION = 1


def is_hetero_graph_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a heterogeneous graph directory (``types.json``, ``nodes/``, ``edges/``)."""
    p = Path(path)
    return (p / TYPES_FILE).is_file() and (p / "nodes").is_dir()


def _edge_dir(edge_type: tuple[str, str, str]) -> str:
    return "__".join(edge_type)


def save_npy_hetero_graph(data: Any, path: str | os.PathLike) -> Path:
    """Write a :class:`~torch_geometric.data.HeteroData` as a heterogeneous graph directory (see the module docstring).

    Example:
        >>> save_npy_hetero_graph(hetero_data, "/tmp/dblp-npy")  # doctest: +SKIP
    """
    from lightning_halo.data.sources import save_npy_graph

    layout = hetero_layout(data)  # a graph that cannot be partitioned is refused before anything is written
    for name in (*layout.node_types, *(r for _, r, _ in layout.edge_types)):
        if "__" in name or "/" in name or not name:
            raise GraphValidationError(f"type name {name!r} cannot name a folder of a graph directory (no '__' or '/')")
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    for t in layout.node_types:
        store = data[t]
        arrays = {k: v for k, v in store.items() if isinstance(v, Tensor)}
        if "x" not in arrays:
            arrays["num_nodes"] = torch.tensor(layout.num_nodes[t])
        save_npy_graph(arrays, directory / "nodes" / t)
    for e in layout.edge_types:
        save_npy_graph({k: v for k, v in data[e].items() if isinstance(v, Tensor)}, directory / "edges" / _edge_dir(e))
    types = {"node_types": list(layout.node_types), "edge_types": [list(e) for e in layout.edge_types]}
    (directory / TYPES_FILE).write_text(json.dumps(types, indent=1))
    return directory


def load_npy_hetero_graph(path: str | os.PathLike, mmap_mode: Optional[str] = "c") -> Any:
    """A heterogeneous graph directory as a :class:`~torch_geometric.data.HeteroData` of memory-mapped tensors.

    Raises:
        GraphValidationError: a type listed in ``types.json`` without its folder, an unreadable array.
    """
    import numpy as np
    from torch_geometric.data import HeteroData

    directory = Path(path)
    try:
        types = json.loads((directory / TYPES_FILE).read_text())
        node_types, edge_types = list(types["node_types"]), [tuple(e) for e in types["edge_types"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise GraphValidationError(f"{directory / TYPES_FILE} is unreadable ({err}); write the directory with "
                                   "lightning_halo.data.save_npy_graph(hetero_data, DIR)") from err  # fmt: skip
    data = HeteroData()

    def arrays(folder: Path, what: str) -> dict[str, Tensor]:
        if not folder.is_dir():
            raise GraphValidationError(f"graph directory {directory}: {what} is listed in {TYPES_FILE} but {folder} is missing")
        out = {}
        for file in sorted(folder.glob("*.npy")):
            try:
                arr = np.load(file, mmap_mode=mmap_mode, allow_pickle=False)
            except Exception as err:  # noqa: BLE001 - truncated header, object arrays, ...
                raise GraphValidationError(f"{file} is not a readable .npy array ({err}); write it with numpy.save") from err
            out[file.stem] = torch.from_numpy(arr) if arr.ndim else torch.tensor(arr.item())
        return out

    import warnings

    with warnings.catch_warnings():  # read-only maps: torch notes that it cannot protect them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for t in node_types:
            for key, value in arrays(directory / "nodes" / t, f"node type {t!r}").items():
                data[t][key] = int(value) if key == "num_nodes" else value
        for e in edge_types:
            for key, value in arrays(directory / "edges" / _edge_dir(e), f"edge type {e!r}").items():  # type: ignore[arg-type]
                data[e][key] = value
    return data


def hetero_fingerprint(data: Any) -> str:
    """Content hash of every store of a heterogeneous graph: type names, attribute names, dtypes, shapes, bytes."""
    h = hashlib.blake2b(digest_size=16)
    stores = [("graph", data.stores[0])]  # PyG lists the graph-level store first
    stores += [(f"node:{t}", data[t]) for t in data.node_types]
    stores += [(f"edge:{'__'.join(e)}", data[e]) for e in data.edge_types]
    for name, store in stores:
        h.update(name.encode())
        hash_attributes(h, store)
    return h.hexdigest()


def hetero_facts(data: Any, source: str) -> dict[str, Any]:
    """What the manifest records about a heterogeneous graph (checked by :func:`~lightning_halo.partition.hetero.hetero_layout`).

    Raises:
        GraphValidationError: naming the type and the fix (a :class:`~lightning_halo.partition.hetero.HeteroGraphError`).
    """
    try:
        layout = hetero_layout(data)
    except HeteroGraphError as err:
        raise GraphValidationError(f"{source}: {err}") from err
    for t in layout.node_types:
        check_attribute_types(data[t], f"{source}, node type {t!r}", int(layout.num_nodes[t]), None)
    for e in layout.edge_types:
        check_attribute_types(data[e], f"{source}, edge type {e!r}", 0, int(data[e].edge_index.size(1)))
    labelled = layout.labelled[0]
    return {
        "hetero": True,
        "fingerprint": hetero_fingerprint(data),
        "node_types": list(layout.node_types),
        "edge_types": [list(e) for e in layout.edge_types],
        "num_nodes": dict(layout.num_nodes),
        "num_edges": {"__".join(e): int(data[e].edge_index.size(1)) for e in layout.edge_types},
        "num_features": {t: int(data[t].x.size(1)) if "x" in data[t] and data[t].x is not None else 0 for t in layout.node_types},
        "labelled_type": labelled,
        "labelled_types": list(layout.labelled),
        "num_classes": infer_num_classes(data[labelled].y),
        "source": source,
    }


def hetero_cache_key(fingerprint: str, **params: Any) -> str:
    """Directory name of one heterogeneous partitioning in the cache."""
    blob = json.dumps({"format": HETERO_FORMAT, "v": HETERO_FORMAT_VERSION, "graph": fingerprint, **params}, sort_keys=True)
    return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()


def _stats(data: Any, parts: list[HeteroHaloPartition], assignment: Any, seconds: float) -> dict[str, Any]:
    layout = assignment.layout
    per_part = type_counts_of(parts)
    edges = homogeneous_edges(data, layout)
    cut = int((assignment.homogeneous[edges[0]] != assignment.homogeneous[edges[1]]).sum()) if edges.numel() else 0
    labelled = assignment.balanced_type
    balance = None
    if labelled is not None:
        counts = [row[labelled]["inner"] for row in per_part]
        balance = max(counts) / (sum(counts) / len(counts)) if sum(counts) else 1.0
    return {
        "num_parts": assignment.num_parts,
        "edge_cut": cut,
        "halo_rows": sum(sum(v["halo"] for k, v in row.items() if "halo" in v) for row in per_part),
        "halo_rows_per_type": {t: sum(row[t]["halo"] for row in per_part) for t in layout.node_types},
        "balanced_type": labelled,
        "labelled_balance": balance,
        "moved_by_balance": assignment.moved,
        # how many weights METIS balanced (2: all nodes and the labelled type); absent for other partitioners
        **({"balance_constraints": assignment.details["constraints"]} if "constraints" in assignment.details else {}),
        "parts": per_part,
        "partitioner": assignment.partitioner,
        "partition_s": round(seconds, 3),
    }


def type_counts_of(parts: list[HeteroHaloPartition]) -> list[dict[str, dict[str, int]]]:
    """Per part: inner nodes and halo rows per node type, kept edges per edge type."""
    rows = []
    for part in parts:
        row: dict[str, dict[str, int]] = {}
        for t in part.node_types:
            store = part[t]
            row[t] = {"inner": int(store.n_inner), "halo": int(store.num_nodes) - int(store.n_inner)}
        for e in part.edge_types:
            row["__".join(e)] = {"edges": int(part[e].edge_index.size(1))}
        rows.append(row)
    return rows


def write_hetero_partition_dir(
    data: Any, out: str | os.PathLike, num_parts: int, *, graph: Optional[dict[str, Any]] = None,
    partitioner: str = "metis", seed: int = 0, key: Optional[str] = None, balance_type_of: Optional[str] = None,
) -> dict[str, Any]:  # fmt: skip
    """Partition a heterogeneous graph into ``out`` (see the module docstring); returns the manifest.

    Args:
        data (HeteroData): the graph.
        out (str): the directory (created; must not hold a manifest yet).
        num_parts (int): :math:`P`.
        graph (dict, optional): its :func:`hetero_facts` (computed if not given).
        partitioner (str, optional): as for :func:`~lightning_halo.partition.hetero.assign_hetero_parts`.
            (default: ``"metis"``)
        seed (int, optional): the partitioner's seed. (default: ``0``)
        key (str, optional): the cache key recorded in the manifest.
        balance_type_of (str, optional): the node type to balance (default: the labelled type).
    """
    out = Path(out)
    if (out / MANIFEST).exists():
        raise FileExistsError(f"{out} already holds a partition manifest; write into a new directory")
    out.mkdir(parents=True, exist_ok=True)
    graph = graph or hetero_facts(data, "a HeteroData")
    start = time.perf_counter()
    assignment = assign_hetero_parts(data, num_parts, partitioner=partitioner, seed=seed, balance_type_of=balance_type_of)
    parts = build_hetero_partitions(data, assignment)
    seconds = time.perf_counter() - start
    files = {}
    for p, part in enumerate(parts):
        path = out / part_name(p)
        torch.save(part.to_state(), path)
        files[part_name(p)] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    manifest = {
        "format": HETERO_FORMAT,
        "format_version": HETERO_FORMAT_VERSION,
        "key": key or hetero_cache_key(graph["fingerprint"], num_parts=num_parts, partitioner=partitioner, seed=seed),
        "num_parts": num_parts,
        "partitioner": partitioner,
        "partitioned_with": {"partitioner": assignment.partitioner},
        "seed": seed,
        "graph": graph,
        "stats": _stats(data, parts, assignment, seconds),
        "files": files,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def read_hetero_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a heterogeneous partition directory, checked for its format (see :func:`read_manifest`)."""
    return read_manifest(directory, HETERO_FORMAT, HETERO_FORMAT_VERSION)


def is_hetero_partition_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a manifest of the heterogeneous format."""
    try:
        return json.loads((Path(path) / MANIFEST).read_text()).get("format") == HETERO_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


class HeteroPartitionDirectory(PartitionDirectory):
    """A heterogeneous partition directory, read-only: its manifest, and one part at a time (the size and hash
    checks of :class:`~lightning_halo.data.partition_dir.PartitionDirectory`, its own manifest format and parts).

    Args:
        path (str): the directory.
        cache_dir (str, optional): where to remember which part files matched their SHA-256.
    """

    @override
    def read_meta(self) -> dict[str, Any]:
        return read_hetero_manifest(self.dir)

    @override
    def load_part(self, p: int) -> HeteroHaloPartition:  # type: ignore[override]
        """Part ``p``, checked against the manifest (size and SHA-256), memory-mapped."""
        path = check_part_file(self.dir, self.read_meta(), p, verified=self.verified)
        try:
            state = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
        except Exception as err:  # noqa: BLE001 - a file that passed its hash but does not load: say which
            raise PartitionFileError(f"{path} does not load ({type(err).__name__}: {err}); re-partition") from err
        return HeteroHaloPartition.from_state(state)


class HeteroPartitionCache(HeteroPartitionDirectory):
    """One cached heterogeneous partitioning, ``<root>/<key>/``, written to a temporary directory and renamed into place."""

    def __init__(self, root: str | os.PathLike, key: str) -> None:
        self.root, self.key = Path(root), key
        super().__init__(self.root / key, cache_dir=self.root)

    def write(self, data: Any, num_parts: int, *, graph: dict[str, Any], partitioner: str, seed: int) -> dict[str, Any]:
        from lightning_halo.data.cache import publish

        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{self.key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            manifest = write_hetero_partition_dir(data, tmp, num_parts, graph=graph, partitioner=partitioner, seed=seed,
                                                  key=self.key)  # fmt: skip
            if not publish(tmp, self.dir, replace=not self.verify()):
                return self.read_meta()
            return manifest
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


class HeteroSource:
    """A :class:`~torch_geometric.data.HeteroData` given in memory (or loaded from a file): its facts, checked once."""

    def __init__(self, data: Any, description: str = "the heterogeneous graph") -> None:
        self._data = data
        self.description = description
        self._facts: Optional[dict[str, Any]] = None

    def graph(self) -> Any:
        self.facts()  # checked before anything reads it
        return self._data

    open = graph

    def facts(self) -> dict[str, Any]:
        if self._facts is None:
            self._facts = hetero_facts(self._data, self.description)
        return self._facts


def load_hetero_file(path: Path) -> Optional[Any]:
    """The HeteroData in a ``torch.save`` file, or ``None`` if the file holds something else (loaded safely)."""
    from torch_geometric.data import HeteroData
    from torch_geometric.data.storage import AttrType, BaseStorage, EdgeStorage, GlobalStorage, NodeStorage

    from lightning_halo.data.sources import _safe_globals

    try:
        with torch.serialization.safe_globals([*_safe_globals(), HeteroData, BaseStorage, NodeStorage, EdgeStorage,
                                               GlobalStorage, AttrType]):  # fmt: skip
            data = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    except Exception:  # noqa: BLE001 - not a (safe) HeteroData file: the homogeneous loader says what it is
        return None
    return data if isinstance(data, HeteroData) else None


def format_hetero_stats(stats: dict[str, Any], title: str) -> list[str]:
    """The statistics of a heterogeneous partitioning as text: a title, the totals, per part and type inner nodes and halo rows.

    Example:
        >>> stats = {"edge_cut": 3, "halo_rows": 4, "balanced_type": "paper", "labelled_balance": 1.0,
        ...          "parts": [{"paper": {"inner": 2, "halo": 1}, "paper__cites__paper": {"edges": 3}},
        ...                    {"paper": {"inner": 2, "halo": 3}, "paper__cites__paper": {"edges": 5}}]}
        >>> for line in format_hetero_stats(stats, "metis, 2 parts"): print(line)
        metis, 2 parts: edge cut 3, halo rows 4, paper balance 1.000
          part type                        inner       halo      edges
             0 paper                           2          1
             0 paper__cites__paper                                   3
             1 paper                           2          3
             1 paper__cites__paper                                   5
    """
    balance = stats.get("labelled_balance")
    said = f", {stats['balanced_type']} balance {balance:.3f}" if balance is not None else ""
    if balance is not None and "balance_constraints" in stats:
        said += f" (METIS constraints {stats['balance_constraints']}, moved after {stats['moved_by_balance']})"
    lines = [f"{title}: edge cut {stats['edge_cut']}, halo rows {stats['halo_rows']}{said}",
             f"  {'part':>4} {'type':<24} {'inner':>8} {'halo':>10} {'edges':>10}"]  # fmt: skip
    for p, row in enumerate(stats["parts"]):
        for name, figures in row.items():
            if "inner" in figures:
                lines.append(f"  {p:>4} {name:<24} {figures['inner']:>8} {figures['halo']:>10}")
            else:
                lines.append(f"  {p:>4} {name:<24} {'':>8} {'':>10} {figures['edges']:>10}")
    return lines


def open_hetero(source: Any) -> Optional[Any]:
    """The heterogeneous graph behind a path (a ``torch.save``'d HeteroData or a heterogeneous graph directory)
    or a ``pyg:`` spec of a heterogeneous class, or ``None`` if it is something else (a homogeneous graph, a
    partition directory, a name)."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    from lightning_halo.data.pyg_datasets import PREFIX, load_pyg_dataset, may_be_heterogeneous

    if str(source).startswith(PREFIX) and not Path(source).exists():
        if not may_be_heterogeneous(str(source)):
            return None
        data = load_pyg_dataset(str(source))
        return data if is_hetero(data) else None
    path = Path(source)
    if path.is_file():
        return load_hetero_file(path)
    if is_hetero_graph_dir(path):
        return load_npy_hetero_graph(path)
    return None


def print_hetero_report(manifest: dict[str, Any], where: str, as_json: bool) -> None:
    """The ``lightning-halo partition`` report of a heterogeneous partitioning: its table, or one JSON object."""
    if as_json:
        print(json.dumps({"stats": manifest["stats"], "cache": where, "manifest": manifest}))
        return
    graph = manifest["graph"]
    nodes = ", ".join(f"{t} {n}" for t, n in graph["num_nodes"].items())
    print(f"graph {graph['source']}: nodes {nodes}; edges {sum(graph['num_edges'].values())} in "
          f"{len(graph['edge_types'])} edge types; labelled type {graph['labelled_type']}")  # fmt: skip
    title = f"{manifest['partitioned_with']['partitioner']}, {manifest['num_parts']} parts ({where})"
    print("\n".join(format_hetero_stats(manifest["stats"], title)))
