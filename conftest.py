"""Fixtures for the whole run: the test suite and the docstring examples of ``lightning_halo``
(pytest runs them: ``--doctest-modules``)."""

from __future__ import annotations

import pytest


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
    """Leave no distributed state behind a test.

    An in-process ``trainer.fit`` (world size 1) initialises torch.distributed in the pytest
    process and Lightning writes ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``... into
    ``os.environ``. Left there, every later test's worker processes inherit that port while
    this process still listens on it (EADDRINUSE), and rank lookups see this process's group.
    """
    import os

    import torch.distributed as dist

    saved = dict(os.environ)
    yield
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    os.environ.update(saved)
