"""Windowed reading: mapped pages are handed back, ordinary memory and user mappings never are."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from lightning_halo.data.cache import graph_fingerprint
from lightning_halo.partition.chunks import iter_edges, iter_rows, mapped_for_reading, read_rows, windows

MB = 1 << 20
linux = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="RSS from /proc (Linux)")


def rss_file() -> int:
    """Resident bytes of file mappings in this process (RssFile)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile")


def test_windows_cover_everything_once() -> None:
    assert list(windows(7, 3)) == [(0, 3), (3, 6), (6, 7)]
    t = torch.arange(20.0).view(10, 2)
    assert torch.equal(torch.cat([rows for _, rows in iter_rows(t, chunk_bytes=24)]), t)
    ei = torch.randint(0, 5, (2, 11))
    got = [(s, src, dst) for s, src, dst in iter_edges(ei.int(), chunk_edges=4)]
    assert [s for s, _, _ in got] == [0, 4, 8] and all(src.dtype == torch.long for _, src, _ in got)
    assert torch.equal(torch.cat([torch.stack([a, b]) for _, a, b in got], 1), ei)


def test_ordinary_memory_is_never_released() -> None:
    t = torch.arange(4 * MB // 8, dtype=torch.float64)  # 4 MB of anonymous memory
    copy = read_rows(t, 0, t.numel())
    assert torch.equal(t, torch.arange(t.numel(), dtype=torch.float64)) and torch.equal(copy, t)


@linux
def test_read_only_mapping_pages_are_released(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((48 * MB // 64, 8)))  # 48 MB
    with warnings.catch_warnings():  # torch: "not writable" (read-only mapping, nobody writes)
        warnings.simplefilter("ignore")
        arr = torch.from_numpy(np.load(tmp_path / "x.npy", mmap_mode="r"))
    base = rss_file()
    total = sum(float(rows.sum()) for _, rows in iter_rows(arr, chunk_bytes=4 * MB))
    assert rss_file() - base < 12 * MB, "windows read must not stay resident"
    assert total == pytest.approx(float(arr.sum()))  # reading it whole (this line) does keep it
    assert rss_file() - base > 40 * MB, "the measurement sees mapped pages"


@linux
def test_torch_mmap_pages_released_only_for_our_own_mapping(tmp_path: Path) -> None:
    x = torch.randn(32 * MB // 32, 8)
    torch.save({"x": x}, tmp_path / "t.pt")
    with mapped_for_reading(tmp_path / "t.pt"):
        ours = torch.load(tmp_path / "t.pt", mmap=True, weights_only=True)["x"]
    base = rss_file()
    fingerprint = graph_fingerprint(Data(x=ours))  # hashed in windows, pages handed back
    assert rss_file() - base < 12 * MB
    users = torch.load(tmp_path / "t.pt", mmap=True, weights_only=True)["x"]  # the user's mapping: writable, private
    users[0, 0] = 42.0  # an unsaved change (copy-on-write page)
    for _ in iter_rows(users, chunk_bytes=MB):
        pass
    assert float(users[0, 0]) == 42.0, "a user's mapping is never released: its changes would be lost"
    assert fingerprint == graph_fingerprint(Data(x=x))
