"""Leave no distributed state behind an in-process fit.

An in-process ``trainer.fit`` (world size 1) initialises torch.distributed in the pytest process
and Lightning writes ``MASTER_ADDR``/``MASTER_PORT``/``LOCAL_RANK``/``NODE_RANK``/``WORLD_SIZE``
into ``os.environ``. Left there, a later script started with ``--devices 2`` believes it was
launched externally (Lightning's ``LightningEnvironment`` sees ``LOCAL_RANK``) and waits for a
rank 1 that never comes; worker processes inherit a port this process still listens on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def isolated_process_state() -> Iterator[None]:
    """Restore ``os.environ`` and destroy any default process group on exit (also on error).

    Module- and session-scoped fixtures that fit in process must use it themselves: the
    function-scoped autouse fixture in the root ``conftest.py`` snapshots the environment only
    after them.
    """
    import torch.distributed as dist

    saved = dict(os.environ)
    try:
        yield
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)
