"""The shared folder (datasets, the SLURM testbed) is found next to the checkout or through the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.shared import ENV, find_shared, shared_path


def _layout(tmp_path: Path, *where: str) -> Path:
    """A checkout at ``tmp_path/repo`` and ``shared/datasets`` (plus ``testbed/cluster.sh``) at each of ``where``."""
    (tmp_path / "repo").mkdir()
    for folder in where:
        (tmp_path / folder / "datasets").mkdir(parents=True)
        (tmp_path / folder / "testbed").mkdir()
        (tmp_path / folder / "testbed" / "cluster.sh").write_text("#!/bin/sh\n")
    return tmp_path / "repo"


def test_found_next_to_the_checkout(tmp_path: Path) -> None:
    repo = _layout(tmp_path, "shared")
    assert find_shared("datasets", env={}, root=repo) == tmp_path / "shared" / "datasets"
    assert shared_path("testbed/cluster.sh", env={}, root=repo) == tmp_path / "shared" / "testbed" / "cluster.sh"


def test_the_environment_comes_first(tmp_path: Path) -> None:
    repo = _layout(tmp_path, "shared", "elsewhere")
    env = {ENV: str(tmp_path / "elsewhere")}
    assert find_shared("datasets", env=env, root=repo) == tmp_path / "elsewhere" / "datasets"
    only = {"LIGHTNING_HALO_DATASETS": str(tmp_path / "shared" / "datasets"), **env}  # the one folder, named directly
    assert find_shared("datasets", env=only, root=repo, override="LIGHTNING_HALO_DATASETS") == tmp_path / "shared" / "datasets"


def test_neither_is_an_error_naming_both(tmp_path: Path) -> None:
    repo = _layout(tmp_path)
    env = {ENV: str(tmp_path / "nowhere")}
    assert find_shared("datasets", env=env, root=repo) is None
    with pytest.raises(FileNotFoundError) as err:
        shared_path("datasets", env=env, root=repo)
    message = str(err.value)
    assert "LIGHTNING_HALO_SHARED" in message and str(tmp_path / "nowhere" / "datasets") in message
    assert "../shared/datasets" in message and str(tmp_path / "shared" / "datasets") in message
    with pytest.raises(FileNotFoundError, match="set LIGHTNING_HALO_TESTBED to it"):
        shared_path("testbed/cluster.sh", env={}, root=repo, override="LIGHTNING_HALO_TESTBED")


def test_the_benchmarks_find_their_datasets_and_testbed_through_it(tmp_path: Path, monkeypatch) -> None:
    from benchmarks import graphs, harness

    _layout(tmp_path, "mine")
    for key in ("LIGHTNING_HALO_DATASETS", "LIGHTNING_HALO_TESTBED"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(ENV, str(tmp_path / "mine"))
    assert graphs.shared_datasets() == tmp_path / "mine" / "datasets"
    assert harness.testbed() == tmp_path / "mine" / "testbed" / "cluster.sh"
    monkeypatch.setenv(ENV, str(tmp_path / "none"))
    monkeypatch.setattr("benchmarks.shared.ROOT", tmp_path / "repo")  # no ../shared beside it either
    with pytest.raises(FileNotFoundError, match="LIGHTNING_HALO_SHARED.*../shared/datasets"):
        graphs.shared_datasets()
    with pytest.raises(SystemExit, match="LIGHTNING_HALO_SHARED.*../shared/testbed/cluster.sh"):
        harness.testbed()
