"""The order in which pytest-xdist's workers take the suite's modules (tests/support/schedule.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from tests.support import schedule


def _items(*ids: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(nodeid=i) for i in ids]


def test_whole_modules_longest_first_each_in_its_own_order() -> None:
    items = _items("tests/a.py::t1", "tests/b.py::t1", "tests/a.py::t2", "tests/c.py::t1", "tests/b.py::t2[x]")
    seconds = {"tests/a.py": 1.0, "tests/b.py": 30.0, "tests/c.py": 5.0}
    order = [i.nodeid for i in schedule.order(items, seconds, [])]
    assert order == ["tests/b.py::t1", "tests/b.py::t2[x]", "tests/c.py::t1", "tests/a.py::t1", "tests/a.py::t2"]


def test_a_module_the_file_does_not_know_is_estimated_from_its_launches() -> None:
    items = _items("tests/old.py::t", "tests/new.py::t1", "tests/new.py::t2", "lightning_halo/x.py::lightning_halo.x.f")
    seconds = {"tests/old.py": 10.0}
    launching = ["tests/new.py::t1", "tests/new.py::t2"]  # 2 launches: 16 s estimated, more than 10
    order = [i.nodeid for i in schedule.order(items, seconds, launching)]
    assert order[:2] == ["tests/new.py::t1", "tests/new.py::t2"] and order[2] == "tests/old.py::t"
    assert order[-1].startswith("lightning_halo/x.py"), "a doctest module without launches is short"


def test_written_seconds_are_summed_per_module_and_read_back(tmp_path, monkeypatch) -> None:
    path = tmp_path / "durations.json"
    schedule.write({"tests/a.py::t1": 1.5, "tests/a.py::t2": 2.0, "tests/b.py::t": 9.0}, path)
    written = json.loads(path.read_text())
    assert written == {"tests/b.py": 9.0, "tests/a.py": 3.5} and list(written) == ["tests/b.py", "tests/a.py"]
    monkeypatch.setattr(schedule, "DURATIONS", path)
    assert schedule.stored() == written
    monkeypatch.setattr(schedule, "DURATIONS", tmp_path / "missing.json")
    assert schedule.stored() == {}


def test_the_stored_file_names_the_longest_modules_of_this_suite() -> None:
    """The committed order was measured on this suite: its longest modules launch processes."""
    stored = schedule.stored()
    assert stored, "tests/durations.json is missing: write it with LIGHTNING_HALO_WRITE_DURATIONS"
    top = list(stored)[:5]
    assert all((schedule.ROOT / m).is_file() for m in top), f"stale module names in {schedule.DURATIONS}: {top}"
