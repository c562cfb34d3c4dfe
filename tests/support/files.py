"""Damaging files as disks, copies and people do, for the checks that must catch it."""

from __future__ import annotations

import os
from pathlib import Path


def wait_for_clock_after(path: Path) -> None:
    """Until the file system's clock is past ``path``'s last change (its timestamps may be coarse)."""
    probe = path.with_name(f".{path.name}.clock-probe")
    while True:
        probe.write_bytes(b"")
        if probe.stat().st_ctime_ns > path.stat().st_ctime_ns:
            probe.unlink()
            return


def damage_in_place(path: Path) -> None:
    """One byte flipped, same size, modification time put back: only the change time shows it."""
    st = path.stat()
    wait_for_clock_after(path)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size
