"""Which exchange this process' steps run on, for functions called from user code (:func:`~lightning_halo.gather_rows`).

The strategy owns its :class:`~lightning_halo.exchange.HaloExchanger`; it registers it here at
every step and withdraws it at teardown. One process runs one strategy at a time, so one
slot suffices (in-process test ranks pass their exchanger explicitly instead).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from lightning_halo.exchange.exchanger import HaloExchanger

_current: Optional[HaloExchanger] = None


def use_exchanger(exchanger: HaloExchanger) -> None:
    """Make ``exchanger`` the one this process' steps run on (called by the strategy)."""
    global _current
    _current = exchanger


def release_exchanger(exchanger: HaloExchanger) -> None:
    """Withdraw ``exchanger`` (if it is the current one) at teardown."""
    global _current
    if _current is exchanger:
        _current = None


def current_exchanger() -> Optional[HaloExchanger]:
    """The exchange of the running step, or ``None`` outside a :class:`~lightning_halo.HaloQuantStrategy` run."""
    return _current
