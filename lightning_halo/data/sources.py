r"""Graph sources: what ``HaloDataModule(data=...)`` accepts, and what each costs to read.

=========================================  ==============================================
``data=``                                  read as
=========================================  ==============================================
a :class:`~torch_geometric.data.Data`       the object itself (already in memory)
``"cora"`` (bundled)                        loaded into memory (small)
``"pyg:<Class>:<root>[:<name>]"``           PyG's dataset class, into memory
a ``torch.save(data, path)`` file           memory-mapped (``torch.load(mmap=True)``)
a graph directory of ``.npy`` files         memory-mapped (``np.load(mmap_mode="r")``)
a partition directory (``manifest.json``)   its manifest, and each rank its own part only
=========================================  ==============================================

A **graph directory** holds one ``.npy`` file per attribute: ``edge_index.npy`` (``[2, E]``,
int32 or int64), ``x.npy`` (``[N, F]`` float), ``y.npy`` (``[N]`` or ``[N, C]``),
``train_mask.npy`` / ``val_mask.npy`` / ``test_mask.npy`` (``[N]`` bool), and any further
``<name>.npy`` as attribute ``name`` (node-level with ``N`` rows, edge-level if its name contains
``edge`` and it has ``E`` rows, as PyG decides). It can be written chunk by chunk
(``np.lib.format.open_memmap``) by any tool, so a graph never needs to fit in memory.

For a path (file, graph directory, bundled name, ``pyg:`` spec), the graph's facts -- content
fingerprint, sizes, ``num_features``, ``num_classes`` -- are computed once and stored in a small
*source manifest* in the cache (``<cache>/sources/``), keyed by the path and checked against
the files' sizes and modification times; the first process to need them computes them under a
file lock, every other process (every rank of every later run) just reads them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import uuid
import warnings
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

from lightning_halo.data.cache import graph_fingerprint
from lightning_halo.data.datasets import BUNDLED, load_bundled
from lightning_halo.data.partition_dir import MANIFEST, is_partition_dir
from lightning_halo.data.pyg_datasets import PREFIX as PYG_PREFIX
from lightning_halo.data.pyg_datasets import load_pyg_dataset
from lightning_halo.data.validation import (
    GraphValidationError,
    check_graph,
    infer_num_classes,
    is_hetero,
    validate_graph,
)
from lightning_halo.partition.chunks import iter_rows, mapped_for_reading
from lightning_halo.partition.options import MASK_KEYS

Source = Union[str, os.PathLike, Data]


# ---------------------------------------------------------------------------------------- loading
def _safe_globals() -> list[Any]:
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import AttrType, GlobalStorage

    # AttrType: PyG caches which attributes are node- or edge-level in the pickled storage
    return [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage, AttrType]


def _load_data_file(path: Path, mmap: bool) -> object:
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            return torch.load(path, weights_only=True, map_location="cpu", mmap=mmap)
    except Exception as err:  # pickle errors, zip errors, truncated files
        raise GraphValidationError(
            f"{path} is not a torch.save'd torch_geometric Data that loads safely ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200]}). Save the graph with torch.save(Data(**data.to_dict()), path) (a fresh "
            "Data: PyG's cached attribute types in a used one do not load safely)."
        ) from err


def is_graph_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory with ``.npy`` files (a graph directory)."""
    p = Path(path)
    return p.is_dir() and not is_partition_dir(p) and any(p.glob("*.npy"))


_CONVENTIONAL_ORDER = ("x", "edge_index", "edge_attr", "y", *MASK_KEYS)


def load_npy_graph(path: str | os.PathLike, mmap_mode: Optional[str] = "c") -> Data:
    """A graph directory as a :class:`~torch_geometric.data.Data` of memory-mapped tensors.

    Args:
        path (str): the directory (see the module docs for its files).
        mmap_mode (str, optional): ``np.load``'s ``mmap_mode``: ``"c"`` (copy-on-write: the
            tensors may be modified in memory, the files never are), ``"r"`` (read-only) or
            ``None`` (read into memory). (default: ``"c"``)

    Example:
        >>> save_npy_graph(load_bundled("cora"), "/tmp/cora-npy")  # doctest: +SKIP
        >>> load_npy_graph("/tmp/cora-npy").x.shape  # doctest: +SKIP
        torch.Size([2708, 1433])
    """
    directory = Path(path)
    found = {f.stem: f for f in directory.glob("*.npy")}
    # A directory has no attribute order: PyG's usual one first, the rest by name, so the same
    # graph read from a directory or from memory gives partitions with the same layout.
    first = [key for key in _CONVENTIONAL_ORDER if key in found]
    files = {key: found[key] for key in first + sorted(set(found) - set(first))}
    for required in ("edge_index", "x"):
        if required not in files:
            raise GraphValidationError(
                f"graph directory {directory} has no {required}.npy; a graph directory holds edge_index.npy [2, E], "
                "x.npy [N, F], y.npy [N] and train_mask.npy / val_mask.npy / test_mask.npy [N] (see "
                "lightning_halo.data.sources)."
            )
    arrays: dict[str, Tensor] = {}
    with warnings.catch_warnings():  # read-only maps: torch notes that it cannot protect them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, file in files.items():
            try:
                arr = np.load(file, mmap_mode=mmap_mode, allow_pickle=False)
            except Exception as err:  # noqa: BLE001 - truncated header, object arrays, ...
                raise GraphValidationError(f"{file} is not a readable .npy array ({err}); write it with numpy.save") from err
            arrays[name] = torch.from_numpy(arr) if arr.ndim else torch.tensor(arr.item())
    num_nodes = int(arrays["x"].shape[0]) if arrays["x"].ndim else 0
    for name in ("y", *MASK_KEYS):  # the error names the file, not an attribute
        t = arrays.get(name)
        rows = (t.shape[0] if t.dim() else None) if t is not None else num_nodes
        if rows != num_nodes:
            raise GraphValidationError(
                f"graph directory {directory}: {name}.npy has {rows} rows but x.npy has {num_nodes}: every node-level "
                "array needs one row per node. Write the arrays of one graph, or fix the one of the wrong length."
            )
    return Data(**arrays)


def save_npy_graph(data: Any, path: str | os.PathLike) -> Path:
    """Write ``data`` as a graph directory (one ``.npy`` per tensor attribute), a window at a time.

    A :class:`~torch_geometric.data.HeteroData` becomes a heterogeneous graph directory, one
    folder per node type and per edge type (:mod:`lightning_halo.data.hetero`); a dict of
    tensors is written as a ``Data``'s attributes would be.

    Example:
        >>> save_npy_graph(load_bundled("cora"), "/tmp/cora-npy")  # doctest: +SKIP
    """
    if is_hetero(data):
        from lightning_halo.data.hetero import save_npy_hetero_graph

        return save_npy_hetero_graph(data, path)
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in data.items():
        if not isinstance(value, Tensor):
            continue
        if value.dim() == 0 or not value.numel():
            np.save(directory / f"{key}.npy", value.numpy())
            continue
        dtype = torch.empty(0, dtype=value.dtype).numpy().dtype
        out = np.lib.format.open_memmap(directory / f"{key}.npy", mode="w+", dtype=dtype, shape=tuple(value.shape))
        for start, rows in iter_rows(value):
            out[start : start + rows.size(0)] = rows.numpy()
        out.flush()
        del out
    return directory


def load_graph(source: Source) -> Data:
    """Resolve a graph source into a validated :class:`~torch_geometric.data.Data`.

    Files are read with ``torch.load(weights_only=True)`` and only PyG's ``Data`` classes
    allow-listed: a file holding anything else is rejected, never unpickled. A graph
    directory is memory-mapped (copy-on-write).

    Args:
        source (Data or str): a :class:`~torch_geometric.data.Data`, a path to
            ``torch.save(data, path)``, a graph directory of ``.npy`` files, a bundled name
            (``"cora"``) or ``"pyg:<Class>:<root>[:<name>]"``.

    Returns:
        The validated graph.

    Example:
        >>> load_graph("cora").num_nodes
        2708
    """
    if isinstance(source, Data):
        return validate_graph(source)
    _check_type(source)
    path = Path(source)
    if path.is_file():
        return validate_graph(_load_data_file(path, mmap=False), source=str(path))
    if is_partition_dir(path):
        raise GraphValidationError(
            f"{path} is a partition directory: it holds the parts, not the whole graph. Pass it to HaloDataModule "
            "(each rank reads its own part), or load the original graph."
        )
    if is_graph_dir(path):
        return validate_graph(load_npy_graph(path), source=f"graph directory {path}")
    return validate_graph(_load_named(str(source)), source=_describe_named(str(source)))


def _check_type(source: object) -> None:
    if is_hetero(source):
        check_graph(source, source="data")  # says what to do with one
    if not isinstance(source, (str, os.PathLike)):
        raise GraphValidationError(
            f"data must be a torch_geometric Data, a file path or a bundled dataset name, got {type(source).__name__}"
        )


def _load_named(spec: str) -> Data:
    if Path(spec).is_dir():
        raise GraphValidationError(
            f"{spec} is a directory, but neither a partition directory (no {MANIFEST}) nor a graph directory (no .npy "
            "files). Pass the directory written by `lightning-halo partition GRAPH --parts P --out DIR`, or a graph "
            "directory with edge_index.npy, x.npy, y.npy and the mask .npy files."
        )
    if spec.startswith(PYG_PREFIX):
        return load_pyg_dataset(spec)
    if spec.lower() in BUNDLED:
        return load_bundled(spec)
    raise GraphValidationError(
        f"data={spec!r} is neither an existing file nor a bundled dataset name "
        f"(bundled: {sorted(BUNDLED)}). Pass a torch_geometric Data, a path to torch.save(data, path), a graph "
        "directory of .npy files, a partition directory, a bundled name, or pyg:<Class>:<root>[:<name>] for a "
        "PyG dataset folder."
    )


def _describe_named(spec: str) -> str:
    return spec if spec.startswith(PYG_PREFIX) else f"bundled dataset {spec!r}"


def open_graph(source: str | os.PathLike) -> Data:
    """The graph behind a path, memory-mapped where the format allows, checked, for reading only.

    Unlike :func:`load_graph` nothing is converted (an int32 ``edge_index`` stays int32) and
    the mapped pages may be released after each window is read, so the result must never be
    written to: it is for partitioning and fingerprinting.
    """
    _check_type(source)
    path = Path(source)
    if path.is_file():
        with mapped_for_reading(path):
            data = _load_data_file(path, mmap=True)
        return check_graph(data, source=str(path))
    if is_partition_dir(path):
        load_graph(path)  # raises the explanation
    if is_graph_dir(path):
        return check_graph(load_npy_graph(path, mmap_mode="r"), source=f"graph directory {path}")
    return validate_graph(_load_named(str(source)), source=_describe_named(str(source)))


def graph_facts(data: Data, source: str) -> dict[str, Any]:
    """What the manifest records about a graph: fingerprint, sizes, ``num_features``, ``num_classes``."""
    return {
        "fingerprint": graph_fingerprint(data),
        "num_nodes": int(data.x.size(0)),
        "num_edges": int(data.edge_index.size(1)),
        "num_features": int(data.x.size(1)),
        "num_classes": infer_num_classes(data.y),
        "x_dtype": str(data.x.dtype).removeprefix("torch."),
        "source": source,
    }


# ---------------------------------------------------------------------------------------- sources
class InMemorySource:
    """A :class:`~torch_geometric.data.Data` given by the user: every process holds it already.

    Its fingerprint is computed in place (no copy) by each process that needs it, so a rank
    given a different graph than its peers builds a different plan, which the strategy's
    first-step check reports instead of training on someone else's graph.
    """

    def __init__(self, data: Data) -> None:
        self._data = data
        self._validated = False
        self._facts: Optional[dict[str, Any]] = None
        self.description = "the graph"

    def graph(self) -> Data:
        if not self._validated:
            self._data = validate_graph(self._data)  # the user's Data stays as it was given
            self._validated = True
        return self._data

    open = graph  # partitioning reads the same object

    def facts(self) -> dict[str, Any]:
        if self._facts is None:
            self._facts = graph_facts(self.graph(), "a torch_geometric Data")
        return self._facts


class PathSource:
    """A graph named by a path, a bundled name or a ``pyg:`` spec; its facts live in a source manifest.

    Args:
        spec (str): the source as given.
        cache_root (Path): where ``sources/<id>.json`` and its lock live.
    """

    def __init__(self, spec: str | os.PathLike, cache_root: Path) -> None:
        self.spec = str(spec)
        self.description = self.spec
        self.cache_root = cache_root
        self._facts: Optional[dict[str, Any]] = None

    def graph(self) -> Data:
        """The whole graph in memory (as :func:`load_graph`)."""
        return load_graph(self.spec)

    def open(self) -> Data:
        """The whole graph for partitioning (memory-mapped where possible, see :func:`open_graph`)."""
        return open_graph(self.spec)

    def facts(self) -> dict[str, Any]:
        if self._facts is None:
            self._facts = self._cached_facts()
        return self._facts

    def _identity(self) -> tuple[str, list[Any]]:
        """A stable name for the source and a signature that changes when its files change."""
        path = Path(self.spec)
        if path.exists():
            real = os.path.realpath(path)
            files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
            return f"path:{real}", [_stat(f, path) for f in files]
        if self.spec.startswith(PYG_PREFIX):
            root = Path(self.spec[len(PYG_PREFIX) :].split("?")[0].split(":")[1])
            files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
            return f"pyg:{os.path.realpath(root)}:{self.spec}", [_stat(f, root) for f in files]
        if self.spec.lower() in BUNDLED:
            with resources.as_file(resources.files("lightning_halo.datasets").joinpath(BUNDLED[self.spec.lower()])) as f:
                return f"bundled:{self.spec.lower()}", [_stat(f, f.parent)]
        return f"unknown:{self.spec}", []

    def _cached_facts(self) -> dict[str, Any]:
        name, signature = self._identity()
        if name.startswith("unknown:"):
            _load_named(self.spec)  # raises the explanation
        directory = self.cache_root / "sources"
        file = directory / f"{hashlib.blake2b(name.encode(), digest_size=16).hexdigest()}.json"
        with _locked(directory, file.stem):
            try:
                stored = json.loads(file.read_text())
                if stored.get("name") == name and stored.get("signature") == signature:
                    return stored["facts"]
            except (OSError, ValueError, AttributeError):
                pass  # absent, unreadable or stale: compute again
            facts = graph_facts(self.open(), self.description)
            tmp = file.with_suffix(f".{uuid.uuid4().hex[:8]}.tmp")
            tmp.write_text(json.dumps({"name": name, "signature": signature, "facts": facts}, indent=1))
            os.replace(tmp, file)
            return facts


def _stat(file: Path, base: Path) -> list[Any]:
    st = file.stat()
    rel = str(file.relative_to(base)) if file != base else file.name
    return [rel, st.st_size, st.st_mtime_ns]


@contextmanager
def _locked(directory: Path, name: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``directory/name.lock`` (released if the process dies)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{name}.lock", "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
