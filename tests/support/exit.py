"""Clean process exit for worker scripts."""

from __future__ import annotations

from lightning_halo.shutdown import release_process_groups


def shutdown() -> None:
    """Release the process groups now, as the strategy's exit handler would at interpreter exit.

    Forked ranks end with ``os._exit`` (no interpreter shutdown, no exit handlers); fresh ones
    (``LIGHTNING_HALO_FRESH_WORKERS=1``) shut down normally. Either way nothing is left to abort.
    """
    release_process_groups()
