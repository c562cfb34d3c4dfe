"""The order in which pytest-xdist hands out the suite's modules: the longest first.

The suite runs on pytest-xdist's workers (``-n auto --dist loadscope`` in ``pyproject.toml``): a
module is one unit of work, so its module-scoped fixtures (a cluster, an accuracy launch) run once,
and a worker takes the next unit when it is almost done with its own. Handed out in collection
order, the SLURM module (about 100 s) came last and ran alone at the end; handed out longest
first, the units pack the machine's cores until the end (the longest-processing-time rule).

A module's length is its seconds in ``tests/durations.json``, written by a whole run with
``LIGHTNING_HALO_WRITE_DURATIONS=tests/durations.json``. A module the file does not list (a new
one) is estimated from its tests: a few seconds for each that launches processes. The file only
orders the work; a stale one costs time, never a result.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DURATIONS = ROOT / "tests" / "durations.json"
ENV = "LIGHTNING_HALO_WRITE_DURATIONS"
#: Estimated seconds of a test the file does not know: one that launches worker processes, any other.
GUESS_MULTIPROCESS, GUESS_OTHER = 8.0, 0.05


def module_of(nodeid: str) -> str:
    """The file of a test id (``tests/x/test_y.py::test_z[1]`` -> ``tests/x/test_y.py``): pytest-xdist's
    ``loadscope`` unit for functions (a class would be its own unit; the suite has none)."""
    return nodeid.split("::", 1)[0]


def stored() -> dict[str, float]:
    """Seconds per module of the last recorded run (empty without the file)."""
    return json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}


def order(items: list, seconds: Mapping[str, float], multiprocess: Iterable[str]) -> list:
    """``items`` (pytest items, or anything with ``nodeid``) with whole modules longest first.

    Within a module the order is kept; modules of equal length keep their collection order.
    ``multiprocess``: the ids of the tests that launch processes (for the estimate of an unknown module).
    """
    launching = set(multiprocess)
    guess: defaultdict[str, float] = defaultdict(float)
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        module = module_of(item.nodeid)
        first.setdefault(module, i)
        guess[module] += GUESS_MULTIPROCESS if item.nodeid in launching else GUESS_OTHER
    length = {module: seconds.get(module, guess[module]) for module in first}
    rank = {module: n for n, module in enumerate(sorted(first, key=lambda m: (-length[m], first[m])))}
    return sorted(items, key=lambda item: rank[module_of(item.nodeid)])  # stable: a module's tests keep their order


def write(per_test: Mapping[str, float], path: str | os.PathLike) -> None:
    """Write the seconds per module of a run (``per_test``: each test id's set-up, call and tear-down summed)."""
    per_module: defaultdict[str, float] = defaultdict(float)
    for nodeid, secs in per_test.items():
        per_module[module_of(nodeid)] += secs
    ranked = dict(sorted(((m, round(s, 1)) for m, s in per_module.items()), key=lambda kv: -kv[1]))
    Path(path).write_text(json.dumps(ranked, indent=1) + "\n")
