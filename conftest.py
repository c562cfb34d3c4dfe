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
    """Leave no distributed state behind a test (see ``tests/support/isolation.py``)."""
    from tests.support.isolation import isolated_process_state

    with isolated_process_state():
        yield
