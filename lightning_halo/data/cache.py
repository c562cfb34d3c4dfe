"""On-disk partition cache: content-addressed, written atomically, loaded without unpickling code."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from lightning_halo.partition.halo_partition import HaloPartition, hash_tensor

#: Bumped whenever the layout of a cached partition changes, so old caches are not reused.
FORMAT_VERSION = 2  # 2: partitions carry halo_x and x_digest


class CacheCorruptError(RuntimeError):
    """A cached file is missing, truncated or does not match its recorded hash."""


def default_cache_dir() -> Path:
    """``$LIGHTNING_HALO_CACHE`` or ``~/.cache/lightning_halo``."""
    env = os.environ.get("LIGHTNING_HALO_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "lightning_halo"


def graph_fingerprint(data: Data) -> str:
    """Content hash of every tensor and scalar attribute of ``data`` (names, dtypes, shapes, bytes).

    Example:
        >>> graph_fingerprint(Data(x=torch.zeros(2, 1)))  # doctest: +SKIP
        '5c1e...'
    """
    h = hashlib.blake2b(digest_size=16)
    for key in sorted(data.keys()):
        value = data[key]
        h.update(key.encode())
        if isinstance(value, Tensor):
            hash_tensor(h, value)
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


def cache_key(fingerprint: str, **params: Any) -> str:
    """Directory name for a graph fingerprint and the partition parameters."""
    blob = json.dumps({"v": FORMAT_VERSION, "graph": fingerprint, **params}, sort_keys=True)
    return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()


def _sha256(buf: bytes) -> str:
    return hashlib.sha256(buf).hexdigest()


class PartitionCache:
    """One cached partitioning: ``<root>/<key>/{meta.json, part_<p>.pt}``.

    Writes go to a fresh temporary directory that is renamed into place, so concurrent
    writers (one per node on a shared file system) never expose half a cache; readers verify
    each part's SHA-256 against ``meta.json`` and load it with ``torch.load(weights_only=True)``.

    Args:
        root (Path): cache root directory.
        key (str): :func:`cache_key` of the graph and parameters.
    """

    def __init__(self, root: str | os.PathLike, key: str) -> None:
        self.root = Path(root)
        self.key = key
        self.dir = self.root / key

    def is_complete(self) -> bool:
        """Whether ``meta.json`` and every part file it lists exist (hashes are checked on load)."""
        try:
            meta = self.read_meta()
        except CacheCorruptError:
            return False
        return all((self.dir / f).is_file() for f in meta["files"])

    def verify(self) -> bool:
        """Whether the cache is complete and every part matches its recorded hash."""
        try:
            meta = self.read_meta()
            return all(_sha256((self.dir / f).read_bytes()) == h for f, h in meta["files"].items())
        except (CacheCorruptError, OSError):
            return False

    def read_meta(self) -> dict[str, Any]:
        path = self.dir / "meta.json"
        try:
            meta = json.loads(path.read_text())
        except FileNotFoundError as err:
            raise CacheCorruptError(f"{path} is missing") from err
        except (OSError, ValueError) as err:
            raise CacheCorruptError(f"{path} is unreadable ({err})") from err
        if meta.get("format_version") != FORMAT_VERSION or "files" not in meta:
            raise CacheCorruptError(f"{path} has an unknown format")
        return meta

    def write(self, partitions: list[HaloPartition], meta: dict[str, Any]) -> None:
        """Atomically store ``partitions`` and ``meta`` (replacing a corrupt copy if present)."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{self.key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            files: dict[str, str] = {}
            for p, part in enumerate(partitions):
                buf = io.BytesIO()
                torch.save(part.to_state(), buf)
                name = f"part_{p}.pt"
                (tmp / name).write_bytes(buf.getvalue())
                files[name] = _sha256(buf.getvalue())
            full_meta = {**meta, "format_version": FORMAT_VERSION, "key": self.key, "files": files}
            (tmp / "meta.json").write_text(json.dumps(full_meta, indent=1, sort_keys=True))
            for f in tmp.iterdir():  # make the data durable before it becomes visible
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
            try:
                os.rename(tmp, self.dir)
            except OSError:
                if self.verify():  # another process won the race with identical content
                    shutil.rmtree(tmp, ignore_errors=True)
                    return
                # a corrupt copy is in the way: move it aside, then publish ours
                trash = self.root / f".trash-{self.key}-{uuid.uuid4().hex[:8]}"
                os.rename(self.dir, trash)
                os.rename(tmp, self.dir)
                shutil.rmtree(trash, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def load_part(self, p: int) -> HaloPartition:
        """Load and verify part ``p``.

        Raises:
            CacheCorruptError: if the file is missing or its hash does not match.
        """
        meta = self.read_meta()
        name = f"part_{p}.pt"
        if name not in meta["files"]:
            raise CacheCorruptError(f"{self.dir} has no {name} (it holds {len(meta['files'])} parts)")
        try:
            raw = (self.dir / name).read_bytes()
        except OSError as err:
            raise CacheCorruptError(f"{self.dir / name} is unreadable ({err})") from err
        if _sha256(raw) != meta["files"][name]:
            raise CacheCorruptError(f"{self.dir / name} does not match its recorded SHA-256 (truncated or modified)")
        state = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
        return HaloPartition.from_state(state)
