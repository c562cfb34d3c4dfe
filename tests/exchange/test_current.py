"""The exchange of the running step: registered by the strategy, withdrawn only by its owner."""

from __future__ import annotations

from lightning_halo.exchange import HaloExchanger
from lightning_halo.exchange.current import current_exchanger, release_exchanger, use_exchanger


def test_use_and_release() -> None:
    a, b = HaloExchanger(None, bits=32), HaloExchanger(None, bits=32)
    use_exchanger(a)
    assert current_exchanger() is a
    release_exchanger(b)  # not the current one: nothing changes
    assert current_exchanger() is a
    use_exchanger(b)
    release_exchanger(b)
    assert current_exchanger() is None
