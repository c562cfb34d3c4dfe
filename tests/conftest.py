"""Test-suite wide rules."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that launches worker processes trains for real (tens of seconds to minutes each on
    # two cores): it belongs to the full suite, not to the quick `-m "not slow"` subset.
    for item in items:
        if item.get_closest_marker("multiprocess") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def partition_cli(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    """``lightning-halo partition *args`` in this process (the console script calls the same
    ``main``; ``test_cli.py`` runs the installed command): returns (exit code, stdout, stderr)."""
    from lightning_halo.cli import main

    monkeypatch.setenv("LIGHTNING_HALO_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main(["partition", *args]) or 0
        except SystemExit as exit_:
            code = exit_.code
        out, err = capsys.readouterr()
        return code, out, err

    return run
