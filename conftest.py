"""Fixtures for the whole run: the test suite and the docstring examples of ``lightning_halo``
(pytest runs them: ``--doctest-modules``)."""

from __future__ import annotations

from collections import defaultdict

import pytest

# Seconds per test folder (set-up, call and tear-down of every test in it): printed at the end of
# every run, beside pytest's own ``--durations``, so that each CI log says where the time goes.
_FOLDER_SECONDS: defaultdict[str, float] = defaultdict(float)
_FOLDER_TESTS: defaultdict[str, set] = defaultdict(set)
_TEST_SECONDS: defaultdict[str, float] = defaultdict(float)


def pytest_configure(config: pytest.Config) -> None:
    import os
    from pathlib import Path

    if hasattr(config, "workerinput"):
        # A pytest-xdist worker shares the cores with the others: PyTorch's default of one OpenMP thread
        # per core had 3 workers' threads spin-waiting on 2 cores (the unit folders: 105 s, 72 s with this).
        threads = max(1, _usable_cores() // int(config.workerinput["workercount"]))
        os.environ["OMP_NUM_THREADS"] = str(threads)
        import torch

        torch.set_num_threads(threads)

    from tests.support import cache, launches

    cache.start_session()  # one partition cache for the run
    launches.start_session(Path(os.environ[cache.ENV]))  # and the record of its real-process launches


def pytest_unconfigure(config: pytest.Config) -> None:
    from tests.support.cache import end_session

    end_session()


def _usable_cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores this process may use, at most 8.

    A worker is often waiting (ranks meeting, a frozen peer's timeout, a SLURM job being scheduled):
    on 2 cores the whole suite ran at 61 % of the cores with one process and 88 % with three workers.
    """
    return min(_usable_cores() + 1, 8)


def _folder(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return path.rsplit("/", 1)[0] if "/" in path else "."


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _FOLDER_SECONDS[_folder(report.nodeid)] += report.duration
    _FOLDER_TESTS[_folder(report.nodeid)].add(report.nodeid)
    _TEST_SECONDS[report.nodeid] += report.duration


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # pytest-xdist hands out whole modules in this order: the longest first (tests/support/schedule.py).
    from tests.support import schedule

    launching = [item.nodeid for item in items if item.get_closest_marker("multiprocess")]
    items[:] = schedule.order(items, schedule.stored(), launching)


def pytest_terminal_summary(terminalreporter) -> None:
    if not _FOLDER_SECONDS:
        return
    terminalreporter.section("seconds per test folder")
    total = sum(_FOLDER_SECONDS.values())
    for folder, secs in sorted(_FOLDER_SECONDS.items(), key=lambda kv: -kv[1]):
        share = 100 * secs / total if total else 0.0
        terminalreporter.write_line(f"{secs:8.1f} s {share:5.1f} % {len(_FOLDER_TESTS[folder]):5d} tests  {folder}")
    terminalreporter.write_line(f"{total:8.1f} s in all (summed test times; the wall time is pytest's last line)")
    import os

    from tests.support import schedule

    if os.environ.get(schedule.ENV):  # the seconds per module that order the next runs' work
        schedule.write(_TEST_SECONDS, os.environ[schedule.ENV])
        terminalreporter.write_line(f"seconds per module written to {os.environ[schedule.ENV]}")


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
