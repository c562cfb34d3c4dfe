"""Fixtures for the whole run: the test suite and the docstring examples of ``lightning_halo``
(pytest runs them: ``--doctest-modules``)."""

from __future__ import annotations

from collections import defaultdict

import pytest

# Seconds per test folder (set-up, call and tear-down of every test in it): printed at the end of
# every run, beside pytest's own ``--durations``, so that each CI log says where the time goes.
_FOLDER_SECONDS: defaultdict[str, float] = defaultdict(float)
_FOLDER_TESTS: defaultdict[str, set] = defaultdict(set)


def pytest_configure(config: pytest.Config) -> None:
    import os
    from pathlib import Path

    from tests.support import cache, launches

    cache.start_session()  # one partition cache for the run
    launches.start_session(Path(os.environ[cache.ENV]))  # and the record of its real-process launches


def pytest_unconfigure(config: pytest.Config) -> None:
    from tests.support.cache import end_session

    end_session()


def _folder(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return path.rsplit("/", 1)[0] if "/" in path else "."


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _FOLDER_SECONDS[_folder(report.nodeid)] += report.duration
    _FOLDER_TESTS[_folder(report.nodeid)].add(report.nodeid)


def pytest_terminal_summary(terminalreporter) -> None:
    if not _FOLDER_SECONDS:
        return
    terminalreporter.section("seconds per test folder")
    total = sum(_FOLDER_SECONDS.values())
    for folder, secs in sorted(_FOLDER_SECONDS.items(), key=lambda kv: -kv[1]):
        share = 100 * secs / total if total else 0.0
        terminalreporter.write_line(f"{secs:8.1f} s {share:5.1f} % {len(_FOLDER_TESTS[folder]):5d} tests  {folder}")
    terminalreporter.write_line(f"{total:8.1f} s in all (summed test times; the wall time is pytest's last line)")


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace: dict) -> None:
    import lightning.pytorch as L
    import torch
    import torch.nn.functional as F

    import lightning_halo

    doctest_namespace.update(L=L, torch=torch, F=F)
    doctest_namespace.update({name: getattr(lightning_halo, name) for name in lightning_halo.__all__})


@pytest.fixture(autouse=True)
def _isolated_process_state():
    """Leave no distributed state behind a test (see ``tests/support/isolation.py``)."""
    from tests.support.isolation import isolated_process_state

    with isolated_process_state():
        yield
