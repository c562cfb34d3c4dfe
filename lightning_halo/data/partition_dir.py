r"""Partition directories: one self-describing file per part plus a manifest, written in bounded memory.

Layout of a directory written by ``lightning-halo partition GRAPH --parts P --out DIR`` (and of
every entry of the partition cache)::

    DIR/manifest.json   format, parameters, graph facts (num_features, num_classes, ...),
                        statistics, and the SHA-256 and size of every part file
    DIR/part_<p>.pt     part p: the HaloPartition's attributes as a torch.save'd dict
    DIR/adj_<p>.pt      part p's CSR adjacency and its transpose (lightning_halo.partition.csr),
                        built from part_<p>.pt's edges in blocks of rows

A part file is an ordinary ``torch.save`` file, read with
``torch.load(path, mmap=True, weights_only=True)``: its tensors are mapped from the file,
so a rank's memory grows only with what it touches, and nothing in it is unpickled code.

The writer never holds a part, let alone the graph: it saves each part's skeleton first
(``torch.serialization.skip_data``: shapes and metadata, the bytes left empty), then streams
the edges and the node rows of the graph through fixed-size windows and writes every piece
at its place in the files (``os.pwrite``). Its memory is the :class:`HaloPlan` (a few
``int64`` per node and per halo row) plus one window; the structure needed by METIS comes
before it and is freed first.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

import lightning_halo.partition.chunks as chunks
from lightning_halo._compat.torch import fake_tensor_mode, is_fake, saved_tensors
from lightning_halo.data.checksums import VerifiedFiles, file_sha256
from lightning_halo.errors import internal_error
from lightning_halo.partition.chunks import iter_edges, iter_rows, read_rows
from lightning_halo.partition.cover import halo_cover
from lightning_halo.partition.csr import BlockedCSR
from lightning_halo.partition.csr import sizes as csr_sizes
from lightning_halo.partition.graph import assign_parts
from lightning_halo.partition.halo import HaloPlan, attribute_layout, plan_halos, summarize
from lightning_halo.partition.halo_partition import HaloPartition, hash_header

FORMAT = "lightning-halo-partition"
#: Bumped whenever the layout of a part file or the manifest changes, so old ones are refused.
#: 2: partitions carry halo_x and x_digest; 3: manifest.json, streamed part files; 4: x and halo_x one
#: tensor, the CSR adjacency and its transpose in adj_<p>.pt
FORMAT_VERSION = 4
MANIFEST = "manifest.json"


class PartitionFileError(RuntimeError):
    """A partition directory's manifest or part file is missing, truncated or changed since partitioning."""


def part_name(p: int) -> str:
    return f"part_{p}.pt"


def adj_name(p: int) -> str:
    return f"adj_{p}.pt"


def is_partition_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory with a ``manifest.json`` (a partition directory)."""
    return (Path(path) / MANIFEST).is_file()


def _rerun(directory: Path) -> str:
    return f"re-run `lightning-halo partition GRAPH --parts P --out {directory}`"


def read_manifest(directory: str | os.PathLike, fmt: str = FORMAT, version: int = FORMAT_VERSION) -> dict[str, Any]:
    """The manifest of a partition directory, checked for its format (``fmt``, ``version``: a heterogeneous
    directory's are :data:`lightning_halo.data.hetero.HETERO_FORMAT` and its version).

    Raises:
        PartitionFileError: if it is missing, unreadable, or of another format version.
    """
    directory = Path(directory)
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise PartitionFileError(f"{path} is missing: {directory} is not a (complete) partition directory; {_rerun(directory)}") from err
    except (OSError, ValueError) as err:
        raise PartitionFileError(f"{path} is unreadable or truncated ({err}); {_rerun(directory)}") from err
    if not isinstance(manifest, dict) or manifest.get("format") != fmt or "files" not in manifest:
        raise PartitionFileError(f"{path} is not a lightning-halo partition manifest ({fmt}); {_rerun(directory)}")
    if manifest.get("format_version") != version:
        raise PartitionFileError(
            f"{path} has format version {manifest.get('format_version')}, this lightning-halo reads version "
            f"{version}; {_rerun(directory)}"
        )
    return manifest


def check_part_file(
    directory: str | os.PathLike, manifest: dict[str, Any], p: int, name: Optional[str] = None,
    verified: Optional[VerifiedFiles] = None,
) -> Path:  # fmt: skip
    """Path of part ``p``'s file ``name`` (default ``part_<p>.pt``) after checking its size and SHA-256.

    The size is checked every time; the SHA-256 by reading the whole file, unless ``verified``
    remembers this very file holding it (:mod:`~lightning_halo.data.checksums`).

    Raises:
        PartitionFileError: naming the file, what is wrong with it and how to get a good copy.
    """
    directory = Path(directory)
    name = name or part_name(p)
    entry = manifest["files"].get(name)
    if entry is None:
        raise PartitionFileError(f"{directory / MANIFEST} lists no {name} (it holds {manifest['num_parts']} parts)")
    path = directory / name
    fix = f"restore the directory from the partition step's output, or {_rerun(directory)}"
    try:
        size = path.stat().st_size
    except FileNotFoundError as err:
        present = sum((directory / f).is_file() for f in manifest["files"])
        raise PartitionFileError(
            f"{path} is missing: {directory} holds {present} of the {len(manifest['files'])} files its manifest "
            f"lists. Every rank reads its own part: put the whole directory where all ranks can read it (shared "
            f"storage), or {fix}."
        ) from err
    if size != entry["bytes"]:
        raise PartitionFileError(
            f"{path} has {size} bytes but {MANIFEST} records {entry['bytes']}: the file is truncated or an "
            f"incomplete copy; {fix}."
        )
    if not (verified or VerifiedFiles(None)).matches(path, entry["sha256"]):
        raise PartitionFileError(
            f"{path} does not match the SHA-256 recorded in {MANIFEST}: it changed after partitioning (or the copy "
            f"is corrupt); {fix}."
        )
    return path


def load_part(
    directory: str | os.PathLike, manifest: dict[str, Any], p: int, verified: Optional[VerifiedFiles] = None
) -> HaloPartition:
    """Part ``p`` with its adjacency, checked against the manifest (see :func:`check_part_file`), memory-mapped."""
    paths = [check_part_file(directory, manifest, p, name, verified) for name in (part_name(p), adj_name(p))]
    state = {}
    for path in paths:
        state.update(torch.load(path, mmap=True, weights_only=True, map_location="cpu"))
    return HaloPartition.from_state(state)


def check_world_size(directory: str | os.PathLike, manifest: dict[str, Any], world_size: int) -> None:
    """The directory must hold exactly one part per process."""
    parts = int(manifest["num_parts"])
    if parts != world_size:
        raise ValueError(
            f"{directory} holds {parts} parts but the Trainer runs {world_size} processes (devices x num_nodes); "
            f"each process loads one part. Launch {parts} processes, or partition for {world_size}: "
            f"`lightning-halo partition GRAPH --parts {world_size} --out NEW_DIR`."
        )


class PartitionDirectory:
    """A partition directory, read-only: its manifest, and one part at a time.

    Args:
        path (str): the directory.
        cache_dir (str, optional): where to remember which part files were found to match their
            SHA-256 (:class:`~lightning_halo.data.checksums.VerifiedFiles`), so that later loads
            of an unchanged file do not read it whole again; without one, every
            :meth:`load_part` reads its files whole.

    Example:
        >>> d = PartitionDirectory("parts/")  # doctest: +SKIP
        >>> facts = d.read_meta()["graph"]  # doctest: +SKIP
        >>> facts["num_features"], d.load_part(0).n_inner  # doctest: +SKIP
        (128, 1000000)
    """

    def __init__(self, path: str | os.PathLike, cache_dir: Optional[str | os.PathLike] = None) -> None:
        self.dir = Path(path)
        self.verified = VerifiedFiles(cache_dir)

    def read_meta(self) -> dict[str, Any]:
        """The manifest (``manifest.json``), checked for its format."""
        return read_manifest(self.dir)

    def is_complete(self) -> bool:
        """Whether the manifest and every part file it lists exist with their recorded sizes."""
        try:
            manifest = self.read_meta()
        except PartitionFileError:
            return False
        for name, entry in manifest["files"].items():
            try:
                if (self.dir / name).stat().st_size != entry["bytes"]:
                    return False
            except OSError:
                return False
        return True

    def verify(self) -> bool:
        """Whether the directory is complete and every part matches its recorded hash (every file read whole)."""
        try:
            manifest = self.read_meta()
            return all(file_sha256(self.dir / f) == e["sha256"] for f, e in manifest["files"].items())
        except (PartitionFileError, OSError):
            return False

    def load_part(self, p: int) -> HaloPartition:
        """Part ``p``, checked against the manifest, memory-mapped.

        Raises:
            PartitionFileError: if the file is missing, truncated or does not match its hash.
        """
        return load_part(self.dir, self.read_meta(), p, self.verified)


# ---------------------------------------------------------------------------------------- writing
Phase = Callable[[str], None]


def write_partition_dir(
    data: Data,
    out: str | os.PathLike,
    num_parts: int,
    *,
    partitioner: str = "metis",
    balance: str = "nodes",
    seed: int = 0,
    threads: int = 1,
    graph: dict[str, Any],
    key: str,
    chunk_bytes: Optional[int] = None,
    on_phase: Optional[Phase] = None,
) -> dict[str, Any]:
    r"""Partition ``data`` into the (new, empty) directory ``out`` and return its manifest.

    The tensors of ``data`` may be memory-mapped: they are only ever read in windows of
    ``chunk_bytes``. The result is identical, tensor for tensor, to
    :func:`~lightning_halo.build_halo_partitions` of the same graph and assignment.

    Args:
        data (Data): the validated graph.
        out (str): directory to write into (created; must not hold part files yet).
        num_parts (int): :math:`P`.
        partitioner (str, optional): ``"metis"``, ``"kaminpar"``, ``"auto"`` or ``"random"``, as
            for :func:`~lightning_halo.partition_graph`. (default: ``"metis"``)
        balance (str, optional): ``"nodes"`` or ``"edges"``. (default: ``"nodes"``)
        seed (int, optional): partitioner seed. (default: ``0``)
        threads (int, optional): KaMinPar's threads (``1`` is deterministic). (default: ``1``)
        graph (dict): the graph's facts for the manifest (``fingerprint``, ``num_features``, ...).
        key (str): the partitioning's cache key, recorded in the manifest.
        chunk_bytes (int, optional): window size. (default: 16 MiB)
        on_phase (callable, optional): called with ``"partition"``, ``"halo"``, ``"write"`` and
            ``"done"`` as each phase starts (the memory benchmark measures each).

    Returns:
        The manifest, also written to ``out/manifest.json``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    phase = on_phase or (lambda name: None)
    timings: dict[str, float] = {}
    num_nodes = int(data.num_nodes)

    phase("partition")
    t = time.perf_counter()
    assignment = assign_parts(
        data.edge_index, num_nodes, num_parts, partitioner=partitioner, seed=seed, balance=balance,  # type: ignore[arg-type]
        threads=threads, workdir=out,
    )  # fmt: skip
    parts = assignment.parts
    timings["partition_s"] = time.perf_counter() - t

    phase("halo")
    t = time.perf_counter()
    plan = plan_halos(data.edge_index, parts, num_parts)
    timings["halo_s"] = time.perf_counter() - t

    phase("write")
    t = time.perf_counter()
    files, stats, cover_s = _write_parts(data, plan, out, chunk_bytes)
    timings["write_s"] = time.perf_counter() - t - cover_s
    timings["cover_s"] = cover_s  # the halo cover of every part (lightning_halo.partition.cover), read back from its edges
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "key": key,
        "num_parts": num_parts,
        "partitioner": partitioner,
        "partitioned_with": {"partitioner": assignment.partitioner, **assignment.details},
        "balance": balance,
        "seed": seed,
        "graph": graph,
        "halo_x": any(kind == "halo_x" for _, kind in attribute_layout(data)),
        "stats": stats,
        "timings": timings,
        "files": files,
    }
    _write_durable(out / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    phase("done")
    return manifest


def _write_durable(path: Path, payload: bytes) -> None:
    with open(path, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


def _write_parts(
    data: Data, plan: HaloPlan, out: Path, chunk_bytes: Optional[int]
) -> tuple[dict[str, Any], dict[str, Any], float]:
    layout = attribute_layout(data)
    n_parts = plan.num_parts
    x = data.get("x")
    digests = _x_digests(x, plan, chunk_bytes) if any(kind == "x_digest" for _, kind in layout) else []
    num_train_global = int(data.train_mask.sum()) if "train_mask" in data else 0
    fake = fake_tensor_mode()

    def empty(like: Tensor, rows: int) -> Tensor:  # shape and dtype only: no memory behind it
        with fake:
            return torch.empty((rows, *like.shape[1:]), dtype=like.dtype)

    with_halo = any(kind == "halo_x" for _, kind in layout)
    writers = []
    for p in range(n_parts):
        n_in, n_halo, n_edges = plan.n_inner(p), plan.n_halo(p), plan.edge_counts[p]
        rows = empty(x, n_in + n_halo) if with_halo else None  # x and halo_x: views of one tensor
        attrs: dict[str, Any] = {}
        for key, kind in layout:
            if kind == "node" and key == "x" and rows is not None:
                attrs[key] = rows[:n_in]
            elif kind == "node":
                attrs[key] = empty(data[key], n_in)
            elif kind == "halo_x":
                attrs[key] = rows[n_in:]  # type: ignore[index]
            elif kind == "x_digest":
                attrs[key] = digests[p]
            elif kind == "edge_index":
                with fake:
                    attrs[key] = torch.empty(2, n_edges, dtype=torch.long)
            elif kind == "edge":
                attrs[key] = empty(data[key], n_edges)
            else:
                attrs[key] = data[key]
        writers.append(_PartWriter(out / part_name(p), plan.partition(p, attrs, num_train_global).to_state()))
    try:
        cut = _write_edges(data, plan, layout, writers, chunk_bytes)
        _write_nodes(data, plan, layout, writers, chunk_bytes)
    finally:
        for w in writers:
            w.close()
    for p in range(n_parts):
        _write_adjacency(out / part_name(p), out / adj_name(p), plan.n_inner(p), plan.n_inner(p) + plan.n_halo(p),
                         chunk_bytes)  # fmt: skip
    files = {}
    for p in range(n_parts):
        for path in (out / part_name(p), out / adj_name(p)):
            files[path.name] = {"sha256": file_sha256(path), "bytes": path.stat().st_size}
    t = time.perf_counter()
    cover = [_cover_rows(out / part_name(p), plan, p) for p in range(n_parts)]
    cover_s = time.perf_counter() - t
    stats = summarize(
        nodes=[plan.n_inner(p) for p in range(n_parts)],
        edges=list(plan.edge_counts),
        halo_nodes=[plan.n_halo(p) for p in range(n_parts)],
        send_rows=[int(plan.recv[:, p].sum()) for p in range(n_parts)],
        edge_cut=sum(cut),
        cover_rows=cover,
    )
    return files, stats, cover_s


def _cover_rows(part_path: Path, plan: HaloPlan, p: int) -> int:
    """Rows part ``p`` receives per exchange with halo partial sums (read from its written in-edges)."""
    edge_index = torch.load(part_path, mmap=True, weights_only=True, map_location="cpu")["edge_index"]
    return halo_cover(edge_index, plan.n_inner(p), plan.n_halo(p), plan.recv[p].tolist()).rows


def _x_digests(x: Tensor, plan: HaloPlan, chunk_bytes: Optional[int]) -> list[str]:
    """``tensor_digest(x[inner_p])`` of every part, in one pass over ``x``."""
    hashers = []
    for p in range(plan.num_parts):
        h = hashlib.blake2b(digest_size=16)
        hash_header(h, x.dtype, (plan.n_inner(p), *x.shape[1:]))
        hashers.append(h)
    inner = [plan.inner(p) for p in range(plan.num_parts)]
    for start, window in iter_rows(x, chunk_bytes):
        for p, (lo, hi) in enumerate(_spans(inner, start, start + window.size(0))):
            if hi > lo:
                hashers[p].update(_bytes(window[inner[p][lo:hi] - start]))
    return [h.hexdigest() for h in hashers]


def _spans(sorted_ids: list[Tensor], start: int, stop: int) -> list[tuple[int, int]]:
    """For each sorted id list, the index range of its ids inside ``[start, stop)``."""
    bounds = torch.tensor([start, stop])
    return [tuple(torch.searchsorted(ids, bounds).tolist()) for ids in sorted_ids]  # type: ignore[misc]


def _write_edges(data: Data, plan: HaloPlan, layout: list[tuple[str, str]], writers: list["_PartWriter"],
                 chunk_bytes: Optional[int]) -> list[int]:  # fmt: skip
    edge_keys = [key for key, kind in layout if kind == "edge"]
    cursor = [0] * plan.num_parts
    cut = [0] * plan.num_parts
    step = max(1, (chunk_bytes or 0) // 16) if chunk_bytes else None
    for start, src, dst in iter_edges(data.edge_index, step):
        stop = start + src.numel()
        attrs = {key: read_rows(data[key], start, stop) for key in edge_keys}
        for p, idx, local_src, local_dst in plan.split_edges(src, dst):
            w, c = writers[p], cursor[p]
            w.write("edge_index", local_src, c)
            w.write("edge_index", local_dst, plan.edge_counts[p] + c)
            for key in edge_keys:
                rows = attrs[key][idx]
                w.write(key, rows, c * rows[0].numel() if rows.dim() > 1 else c)
            cursor[p] += idx.numel()
            cut[p] += int((local_src >= plan.n_inner(p)).sum())
    return cut


def _write_nodes(data: Data, plan: HaloPlan, layout: list[tuple[str, str]], writers: list["_PartWriter"],
                 chunk_bytes: Optional[int]) -> None:  # fmt: skip
    inner = [plan.inner(p) for p in range(plan.num_parts)]
    with_halo = any(kind == "halo_x" for _, kind in layout)
    groups = []  # per part: (first halo row, sorted ids) of every owner's group
    for p in range(plan.num_parts):
        offsets = torch.cumsum(plan.recv[p], 0) - plan.recv[p]
        groups.append([(int(o), g) for o, g in zip(offsets.tolist(), plan.halo_groups(p)) if g.numel()])
    for key in (k for k, kind in layout if kind == "node"):
        t = data[key]
        row = t[0].numel() if t.dim() > 1 else 1
        for start, window in iter_rows(t, chunk_bytes):
            stop = start + window.size(0)
            for p, (lo, hi) in enumerate(_spans(inner, start, stop)):
                if hi > lo:
                    writers[p].write(key, window[inner[p][lo:hi] - start], lo * row)
            if key == "x" and with_halo:
                for p in range(plan.num_parts):
                    ids = [g for _, g in groups[p]]
                    for (first, g), (lo, hi) in zip(groups[p], _spans(ids, start, stop)):
                        if hi > lo:
                            writers[p].write("halo_x", window[g[lo:hi] - start], (first + lo) * row)


def _write_adjacency(part_path: Path, adj_path: Path, n_inner: int, n_src: int, chunk_bytes: Optional[int]) -> None:
    """Part's CSR and transpose (:mod:`lightning_halo.partition.csr`), from its ``edge_index`` read back in windows.

    Bounded memory: :class:`~lightning_halo.partition.csr.BlockedCSR` holds one block of rows
    (temporary files beside ``adj_path`` hold the rest), and the file is written in place.
    """
    window = chunk_bytes or chunks.CHUNK_BYTES
    with chunks.mapped_for_reading(part_path):
        edge_index = torch.load(part_path, mmap=True, weights_only=True)["edge_index"]
    num_edges = int(edge_index.size(1))
    with tempfile.TemporaryDirectory(prefix=".csr-", dir=adj_path.parent) as tmp:
        blocked = BlockedCSR(lambda: iter_edges(edge_index, max(1, window // 16)), n_inner, n_src, num_edges, Path(tmp),
                             max_entries=max(64, window // 8))  # fmt: skip
        fake = fake_tensor_mode()
        state: dict[str, Tensor] = {}
        for key, size in csr_sizes(n_inner, n_src, blocked.nnz, num_edges).items():
            if key in ("adj_crow", "adj_t_crow"):
                state[key] = blocked.crow if key == "adj_crow" else blocked.t_crow
            else:
                with fake:
                    state[key] = torch.empty(size, dtype=blocked.dtype)
        writer = _PartWriter(adj_path, state)
        try:
            blocked.copy_csr(writer.write, window=max(1, window // 4))
            np_dtype = np.int32 if blocked.dtype == torch.int32 else np.int64
            cols = np.memmap(adj_path, dtype=np_dtype, mode="r", offset=writer.offset["adj_col"], shape=(blocked.nnz,)) if blocked.nnz else None
            blocked.transpose(lambda lo, hi: torch.from_numpy(np.array(cols[lo:hi])), writer.write)  # type: ignore[index]
            del cols
        finally:
            writer.close()
    del edge_index


def _bytes(t: Tensor):  # noqa: ANN202 - a buffer for hashlib / os.pwrite, no copy
    return t.contiguous().reshape(-1).view(torch.uint8).numpy()


class _PartWriter:
    """One part file: its skeleton saved up front, then every tensor's bytes written in place.

    Each tensor's place is found by its storage's key in the saved file
    (:func:`~lightning_halo._compat.torch.saved_tensors`), so tensors of one size and dtype
    (``adj_col``, ``adj_t_col``, ``adj_t_perm``) cannot trade places, whatever order torch numbers
    storages in; a view (``halo_x`` of ``x``'s storage) lies at its own offset in its base's record.
    """

    def __init__(self, path: Path, state: dict[str, Any]) -> None:
        if not hasattr(torch.serialization, "skip_data"):
            raise RuntimeError(
                f"writing partition files needs torch.serialization.skip_data (torch >= 2.6), this is torch "
                f"{torch.__version__}; upgrade torch to partition (reading partition directories needs no upgrade)"
            )
        with torch.serialization.skip_data(materialize_fake_tensors=True):
            torch.save(state, path)
        tensors = {key: value for key, value in state.items() if isinstance(value, Tensor)}
        try:
            saved = saved_tensors(path)
        except ValueError as err:
            raise internal_error(f"torch {torch.__version__} saves partition files differently ({err})") from err
        for key, v in tensors.items():
            if key not in saved or saved[key].record_bytes != v.untyped_storage().nbytes() or not v.is_contiguous():
                raise internal_error(
                    f"tensor {key!r} of {path} is not where torch {torch.__version__} was expected to save it "
                    f"(found {saved.get(key)}, its storage has {v.untyped_storage().nbytes()} bytes)"
                )
        self.offset = {key: saved[key].record_offset + saved[key].storage_offset * v.element_size() for key, v in tensors.items()}
        self.itemsize = {key: v.element_size() for key, v in tensors.items()}
        self.fd = os.open(path, os.O_WRONLY)
        for key, value in tensors.items():  # the plan and graph-level tensors are real already
            if not is_fake(value) and value.numel():
                self.write(key, value, 0)

    def write(self, key: str, values: Tensor, first: int) -> None:
        """Write ``values`` at element ``first`` of the flattened tensor ``key``."""
        buf = memoryview(_bytes(values))
        pos = self.offset[key] + first * self.itemsize[key]
        while buf:
            written = os.pwrite(self.fd, buf, pos)
            buf, pos = buf[written:], pos + written

    def close(self) -> None:
        if self.fd >= 0:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1
