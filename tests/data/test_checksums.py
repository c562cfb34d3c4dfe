"""Part files are read in full once per file version; a change after the check is still caught."""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path

import pytest

import lightning_halo.data.checksums as checksums
from lightning_halo.data.checksums import VerifiedFiles
from tests.support.files import damage_in_place


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The files hashed (read in full) from now on."""
    seen: list[str] = []
    real = checksums.file_sha256

    def counting(path) -> str:
        seen.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(checksums, "file_sha256", counting)
    return seen


@pytest.fixture
def later(monkeypatch) -> None:
    """Checks run ten seconds after the files were written (as any real start after partitioning does)."""
    real = time.time_ns
    monkeypatch.setattr(checksums, "time_ns", lambda: real() + 10**10)


def _file(tmp_path: Path, payload: bytes = b"partition bytes " * 1000) -> tuple[Path, str]:
    path = tmp_path / "part_0.pt"
    path.write_bytes(payload)
    return path, hashlib.sha256(payload).hexdigest()


def test_a_file_is_read_once_then_trusted_on_its_record(tmp_path: Path, reads: list[str], later: None) -> None:
    path, sha = _file(tmp_path)
    verified = VerifiedFiles(tmp_path / "cache")
    assert verified.matches(path, sha) and reads == ["part_0.pt"]
    assert verified.matches(path, sha) and VerifiedFiles(tmp_path / "cache").matches(path, sha)  # another process too
    assert reads == ["part_0.pt"]


def test_a_file_changed_after_its_check_is_read_again_and_refused(tmp_path: Path, reads: list[str], later: None) -> None:
    path, sha = _file(tmp_path)
    verified = VerifiedFiles(tmp_path / "cache")
    assert verified.matches(path, sha)
    damage_in_place(path)
    assert not verified.matches(path, sha) and reads == ["part_0.pt", "part_0.pt"]
    assert not verified.matches(path, sha), "a mismatch is never recorded"


def test_a_copy_is_a_new_file_read_once(tmp_path: Path, reads: list[str], later: None) -> None:
    path, sha = _file(tmp_path)
    verified = VerifiedFiles(tmp_path / "cache")
    assert verified.matches(path, sha)
    copy = shutil.copy2(path, tmp_path / "copy.pt")  # same bytes and modification time, another file
    assert verified.matches(copy, sha) and verified.matches(copy, sha)
    assert reads == ["part_0.pt", "copy.pt"]


def test_a_file_that_just_changed_is_not_trusted_on_a_record(tmp_path: Path, reads: list[str]) -> None:
    # coarse timestamps: a write in the same tick as the check would leave every time as it was
    path, sha = _file(tmp_path)
    verified = VerifiedFiles(tmp_path / "cache")
    assert verified.matches(path, sha) and verified.matches(path, sha)
    assert reads == ["part_0.pt", "part_0.pt"]


def test_without_a_writable_cache_every_check_reads_the_file(tmp_path: Path, reads: list[str], later: None) -> None:
    path, sha = _file(tmp_path)
    (tmp_path / "not-a-dir").write_text("")
    verified = VerifiedFiles(tmp_path / "not-a-dir")
    assert verified.matches(path, sha) and verified.matches(path, sha)
    assert not verified.matches(path, "0" * 64)
    assert reads == ["part_0.pt"] * 3
    assert VerifiedFiles(None).matches(path, sha) and len(reads) == 4, "no cache: no record"
