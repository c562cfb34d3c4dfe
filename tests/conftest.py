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
def lightning_halo_cli(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    """``lightning-halo *args`` in this process, in ``tmp_path`` with a cache of its own (the console script
    calls the same ``main``; ``tests/cli/`` runs the installed command once per verb family): returns
    (exit status, stdout, stderr)."""
    from lightning_halo.cli import main

    monkeypatch.setenv("LIGHTNING_HALO_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's and LightningCLI's own parsing errors and --help
            code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def partition_cli(lightning_halo_cli):
    """``lightning-halo partition *args`` in this process: returns (exit status, stdout, stderr)."""
    return lambda *args: lightning_halo_cli("partition", *args)
