r"""SHA-256 of partition files, read in full once per file rather than at every start.

A manifest records the SHA-256 of every part file. Reading a whole part to check it costs a
rank seconds per GB at every start (and, on shared storage, every rank reads at once), so a
successful check is remembered: :class:`VerifiedFiles` keeps an empty marker file under
``<cache>/.verified/`` named by the hash and the file's identity and times (device, inode, size,
modification and change time). A later check of the same file finds the marker and reads nothing.

What still fails a check, read in full again: any write to the file (it moves the change time,
which no tool can set back, even when the modification time is restored); a copy or a move to
another file system (a new inode); a file changed within :data:`SETTLED_NS` before its check
(timestamps can be as coarse as a second, so such a file is never trusted on a marker); another
manifest's hash. What it cannot see is decay of the disk under an unchanged file: call
:meth:`~lightning_halo.data.PartitionDirectory.verify` to read everything again.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from time import time_ns
from typing import Optional

log = logging.getLogger(__name__)

#: A file is trusted on a marker only if it last changed this long before its check began: any later
#: write then gets a later change time, even on file systems whose timestamps are 1 s coarse.
SETTLED_NS = 2_000_000_000


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file, read in blocks (through the page cache, never mapped).

    Example:
        >>> file_sha256("part_0.pt")  # doctest: +SKIP
        '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08'
    """
    h = hashlib.sha256()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class VerifiedFiles:
    """Which files were found to hold their recorded SHA-256: a marker per file version under ``<root>/.verified/``.

    Args:
        root (Path, optional): the cache directory (a ``HaloDataModule``'s ``cache_dir``).
            ``None``, or a directory that cannot be written: nothing is remembered, every check
            reads the file.

    Example:
        >>> verified = VerifiedFiles(default_cache_dir())  # doctest: +SKIP
        >>> verified.matches("parts/part_0.pt", manifest["files"]["part_0.pt"]["sha256"])  # doctest: +SKIP
        True
    """

    def __init__(self, root: Optional[str | os.PathLike]) -> None:
        self.dir = Path(root) / ".verified" if root is not None else None

    def matches(self, path: str | os.PathLike, sha256: str) -> bool:
        """Whether ``path`` holds ``sha256``: by its marker if this very file was checked, else by reading it."""
        now, before = time_ns(), os.stat(path)
        marker = self._marker(sha256, before)
        if marker is not None and marker.exists():
            return True
        if file_sha256(path) != sha256:
            return False
        settled = before.st_ctime_ns < now - SETTLED_NS and before.st_mtime_ns < now - SETTLED_NS
        if marker is not None and settled and _identity(os.stat(path)) == _identity(before):
            self._remember(marker)
        return True

    def _marker(self, sha256: str, st: os.stat_result) -> Optional[Path]:
        if self.dir is None:
            return None
        return self.dir / "-".join([sha256, *map(str, _identity(st))])

    def _remember(self, marker: Path) -> None:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError as err:  # a read-only cache: correct still, only slower
            log.debug("lightning-halo: cannot record a verified file in %s (%s)", marker.parent, err)
