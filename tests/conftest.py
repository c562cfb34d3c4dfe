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


def _whole_run(config: pytest.Config) -> bool:
    """Whether this run selects every test of ``tests/`` (no paths below it, no ``-k``, ``-m`` or deselection)."""
    root = Path(str(config.rootpath))
    paths = [Path(config.invocation_params.dir, a.split("::")[0]).resolve() for a in config.args]
    whole = config.args_source != pytest.Config.ArgsSource.ARGS or all(p in (root, root / "tests") for p in paths)
    selected = config.option.keyword or config.option.markexpr or config.getoption("deselect") or getattr(config.option, "lf", False)
    return whole and not selected and not config.option.collectonly


_SKIPPED: set[str] = set()  # tests this run skipped: the configurations listed from them are not asked for


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _SKIPPED.add(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Every configuration the suite launched in real processes before it was sped up must still be
    # launched (tests/support/launches.py); checked only where the whole suite ran and passed.
    if exitstatus != 0 or not _whole_run(session.config) or hasattr(session.config, "workerinput"):
        return  # pytest-xdist's workers each see part of the run: the controller checks the whole
    from tests.support.launches import LIST, missing

    lost = missing(frozenset(_SKIPPED))
    if lost:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"{len(lost)} configurations of {LIST.name} were not launched by this run:"]
        lines += [f"  {entry['key']}  (listed from {entry['test']})" for entry in lost]
        (reporter.write_line if reporter else print)("\n".join(lines))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
