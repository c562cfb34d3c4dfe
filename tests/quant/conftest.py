"""Fixtures of the codec tests."""

from __future__ import annotations

import pytest

from lightning_halo.quant import use_impl
from tests.quant.rows import IMPLS


@pytest.fixture(params=IMPLS)
def impl(request):
    with use_impl(request.param):
        yield request.param
