"""One content-keyed partition cache for the whole test session, shared by the worker processes.

The cache is keyed by the graph's content and the partition's settings and written atomically,
so tests that only need a partition share it instead of re-partitioning Cora into a cache of
their own (0.4 s a launch). Tests that look at a cache's contents keep their own ``tmp_path``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

ENV = "LIGHTNING_HALO_TEST_CACHE"


_CREATED: list[str] = []  # the cache this process created (its children and pytest-xdist's workers inherit it)


def start_session() -> None:
    """Create the session's cache (the root conftest, once per run; the ranks inherit ``$LIGHTNING_HALO_TEST_CACHE``)."""
    if not os.environ.get(ENV):
        os.environ[ENV] = tempfile.mkdtemp(prefix="lightning-halo-test-cache-")
        _CREATED.append(os.environ[ENV])


def end_session() -> None:
    """Remove the cache, where this process created it."""
    while _CREATED:
        path = _CREATED.pop()
        if os.environ.get(ENV) == path:
            del os.environ[ENV]
        shutil.rmtree(path, ignore_errors=True)


def shared_cache(fallback: Optional[Path]) -> Optional[str]:
    """The session's cache, or ``fallback`` where a worker runs outside pytest (``None``: the default cache)."""
    return os.environ.get(ENV) or (None if fallback is None else str(fallback))
