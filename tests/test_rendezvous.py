"""The rendezvous port is chosen below the kernel's ephemeral range (where outgoing connections take theirs)."""

from __future__ import annotations

import socket
from pathlib import Path

from lightning_halo import rendezvous
from lightning_halo.rendezvous import ephemeral_range, free_port


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    lo, hi = ephemeral_range()
    assert 0 < lo <= hi < 65536
    for _ in range(20):
        port = free_port()
        assert port < lo or lo - rendezvous._LOWEST < 1024
        with socket.socket() as s:
            s.bind(("", port))  # nothing listens on it


def test_a_taken_port_is_skipped(monkeypatch) -> None:
    busy = free_port()
    wanted = next(p for p in iter(free_port, None) if p != busy)
    order = iter([busy, wanted])

    class Picks:  # the random choices free_port makes: the taken port first
        def __init__(self, seed: int) -> None:
            pass

        def randrange(self, a: int, b: int) -> int:
            return next(order)

    with socket.socket() as taken:
        taken.bind(("", busy))
        taken.listen()
        monkeypatch.setattr(rendezvous.random, "Random", Picks)
        assert free_port() == wanted


def test_the_range_is_read_from_proc_or_defaults(tmp_path: Path) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text("40000\t50000\n")
    assert ephemeral_range(str(path)) == (40000, 50000)
    path.write_text("not numbers")
    assert ephemeral_range(str(path)) == (32768, 60999)
    assert ephemeral_range(str(tmp_path / "absent")) == (32768, 60999)


def test_without_room_below_the_range_the_kernel_picks(monkeypatch) -> None:
    lo, hi = ephemeral_range()  # the kernel's own, where its pick lands
    monkeypatch.setattr(rendezvous, "ephemeral_range", lambda: (rendezvous._LOWEST + 100, 60999))
    assert lo <= free_port() <= hi
