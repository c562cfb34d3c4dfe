"""Test-suite wide rules."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that launches worker processes trains for real (tens of seconds to minutes each on
    # two cores): it belongs to the full suite, not to the quick `-m "not slow"` subset.
    for item in items:
        if item.get_closest_marker("multiprocess") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)

