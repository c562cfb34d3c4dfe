"""On-disk partition cache: content-addressed partition directories, published atomically."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Optional

from torch import Tensor
from torch_geometric.data import Data

from lightning_halo.data.partition_dir import FORMAT_VERSION, PartitionDirectory, Phase, write_partition_dir
from lightning_halo.partition.halo_partition import hash_tensor


def default_cache_dir() -> Path:
    """``$LIGHTNING_HALO_CACHE`` or ``~/.cache/lightning_halo``."""
    env = os.environ.get("LIGHTNING_HALO_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "lightning_halo"


def graph_fingerprint(data: Data) -> str:
    """Content hash of every tensor and scalar attribute of ``data`` (names, dtypes, shapes, bytes).

    Tensors are hashed in place a window at a time, so a memory-mapped graph is never held whole.

    Example:
        >>> graph_fingerprint(Data(x=torch.zeros(2, 1)))  # doctest: +SKIP
        '5c1e...'
    """
    h = hashlib.blake2b(digest_size=16)
    hash_attributes(h, data)
    return h.hexdigest()


def hash_attributes(h: Any, store: Any) -> None:
    """Feed ``h`` every attribute of ``store`` (a ``Data`` or a node/edge store) by name: tensors in place, a window
    at a time; other values by their ``repr``."""
    for key in sorted(store.keys()):
        value = store[key]
        h.update(key.encode())
        if isinstance(value, Tensor):
            hash_tensor(h, value)
        else:
            h.update(repr(value).encode())


def cache_key(fingerprint: str, **params: Any) -> str:
    """Directory name for a graph fingerprint and the partition parameters."""
    blob = json.dumps({"v": FORMAT_VERSION, "graph": fingerprint, **params}, sort_keys=True)
    return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()


def publish(tmp: Path, target: Path, *, replace: bool) -> bool:
    """Rename the finished directory ``tmp`` to ``target``; ``False`` if ``target`` was kept.

    ``replace=False`` keeps an existing ``target`` (another writer won the race) and removes
    ``tmp``; ``replace=True`` moves the old ``target`` aside first, then deletes it.
    """
    try:
        os.rename(tmp, target)  # atomic; fails if target exists and is not empty
        return True
    except OSError:
        if not target.exists():
            raise
    if not replace:
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    trash = target.parent / f".trash-{target.name}-{uuid.uuid4().hex[:8]}"
    os.rename(target, trash)
    os.rename(tmp, target)
    shutil.rmtree(trash, ignore_errors=True)
    return True


class PartitionCache(PartitionDirectory):
    """One cached partitioning: the partition directory ``<root>/<key>/``.

    Writes go to a fresh temporary directory that is renamed into place, so concurrent
    writers (one per node on a shared file system) never expose half a cache; readers check
    each part's size and SHA-256 against the manifest and memory-map it.

    Args:
        root (Path): cache root directory.
        key (str): :func:`cache_key` of the graph and parameters.
    """

    def __init__(self, root: str | os.PathLike, key: str) -> None:
        self.root = Path(root)
        self.key = key
        super().__init__(self.root / key, cache_dir=self.root)

    def write(self, data: Data, num_parts: int, *, graph: dict[str, Any], on_phase: Optional[Phase] = None,
              **params: Any) -> dict[str, Any]:  # fmt: skip
        """Partition ``data`` into the cache (replacing a corrupt copy) and return the manifest.

        ``params`` are ``partitioner``, ``balance`` and ``seed``.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{self.key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            manifest = write_partition_dir(data, tmp, num_parts, graph=graph, key=self.key, on_phase=on_phase, **params)
            if not publish(tmp, self.dir, replace=not self.verify()):  # a good copy won the race: keep it
                return self.read_meta()
            return manifest
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
