"""A free TCP port for the rendezvous of processes this library launches (``verify``, the planner's
timing runs; the tests and benchmarks use it too).

Binding to port 0 hands out a port from the kernel's *ephemeral* range, which is also where every
outgoing connection gets its local port. Between choosing such a port and rank 0 listening on it,
any connection (gloo opens many per process group) can take it, and rank 0 then fails with
``EADDRINUSE`` while its peers wait for a store that never comes up (seen in the test suite, with
two process groups starting at once). A port below that range is never given to an outgoing
connection, so the window closes to other programs that listen on it by number.
"""

from __future__ import annotations

import os
import random
import socket

#: Where the kernel takes ports for outgoing connections when /proc does not say (Linux's default).
_EPHEMERAL_DEFAULT = (32768, 60999)
#: The lowest port chosen: above the well-known and most registered service ports.
_LOWEST = 20000


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux: read from ``path``; else its default)."""
    try:
        with open(path) as f:
            lo, hi = (int(v) for v in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT


def free_port(tries: int = 64) -> int:
    """A port nothing listens on, chosen at random below the ephemeral range (bound once to check), or one the
    kernel picks when that range leaves no room below it or every try is taken.

    Example:
        >>> 0 < free_port() < 65536
        True
    """
    lo, _ = ephemeral_range()
    pick = random.Random(int.from_bytes(os.urandom(8), "little"))  # not the global generator: seeded runs share it
    if lo - _LOWEST >= 1024:
        for _ in range(tries):
            port = pick.randrange(_LOWEST, lo)
            with socket.socket() as s:
                try:
                    s.bind(("", port))  # every address: as the rendezvous store listens
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
