"""Which multi-process configurations the suite launches, checked against ``tests/launches.json``.

Every real-process launch of the tests (:func:`tests.support.launch.run_workers`) is recorded
as its worker, world size and arguments, with temporary paths replaced by ``<tmp>``. A whole
run of the suite (no test selection) fails at its end if a configuration of
``tests/launches.json`` was not launched: making the suite faster must not drop one silently.
The list was generated before the suite was sped up (issue 37); regenerate it only when a test
is meant to change what it launches: ``python -m tests.support.launches RECORD.jsonl [CHECKOUT]``
(``LIGHTNING_HALO_RECORD_LAUNCHES=RECORD.jsonl`` writes the record of a run).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIST = ROOT / "tests" / "launches.json"
ENV = "LIGHTNING_HALO_RECORD_LAUNCHES"
_TMP = re.compile(r"(/tmp|/var/tmp|" + re.escape(tempfile.gettempdir()) + r")/\S*")
#: The one setting the speed-up changed on purpose: the accuracy runs train 15 epochs instead of
#: 100 (benchmarks/results/accuracy_epochs.json decides every assertion the same); the runs, seeds
#: and models are still compared.
_IGNORED_VALUES = {"tests/workers/accuracy_worker.py": {"--epochs"}}

def _places(root: Path) -> list[tuple[str, str]]:
    """The machine's own paths in a launch's arguments, and what stands for them in a key."""
    from benchmarks.shared import find_shared

    datasets = find_shared("datasets", override="LIGHTNING_HALO_DATASETS", root=root)
    return [(str(root), "<repo>"), *([(str(datasets), "<datasets>")] if datasets else [])]


def key(args: list[str], world_size: int, root: Path = ROOT) -> str:
    """A launch as one string: the worker, the world size and the arguments, without temporary
    paths, the checkout's path (``root``, the one the launch ran in) or the shared datasets' path."""
    worker = args[0] if args[0] != "-m" else " ".join(args[:2])
    ignored = _IGNORED_VALUES.get(worker, set())
    places = _places(root)
    out, skip = [], False
    for arg in args:
        if skip:
            out.append("<any>")
            skip = False
            continue
        text = str(arg)
        for path, name in places:
            text = text.replace(path, name)
        out.append(_TMP.sub("<tmp>", text))
        skip = arg in ignored
    return json.dumps([world_size, *out])


def start_session(folder: Path) -> None:
    """Record this run's launches in ``folder`` (the root conftest; every process of the run, pytest-xdist's
    workers included, inherits ``$LIGHTNING_HALO_RECORD_LAUNCHES``)."""
    os.environ.setdefault(ENV, str(folder / "launches.jsonl"))


def record(args: list[str], world_size: int) -> None:
    """Append a launch to ``$LIGHTNING_HALO_RECORD_LAUNCHES`` (nothing where it is not set)."""
    path = os.environ.get(ENV)
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
        with open(path, "a") as f:
            f.write(json.dumps({"test": test, "world_size": world_size, "args": [str(a) for a in args]}) + "\n")


def launched() -> set[str]:
    """The keys of every launch recorded in this run."""
    path = Path(os.environ.get(ENV, "/nonexistent"))
    lines = path.read_text().splitlines() if path.is_file() else []
    return {key(rec["args"], rec["world_size"]) for rec in map(json.loads, lines)}


def missing(skipped: frozenset[str] = frozenset()) -> list[dict[str, str]]:
    """The configurations of ``tests/launches.json`` that this run did not launch.

    A configuration listed from a test that this run skipped (e.g. one that needs the shared
    datasets, on a machine without them) is not asked for; one listed from a test that no longer
    exists still is.
    """
    done = launched()
    return [e for e in json.loads(LIST.read_text()) if e["key"] not in done and e["test"] not in skipped]


def main(argv: list[str]) -> int:
    """Write ``tests/launches.json`` from the record of a whole run (``RECORD [CHECKOUT]``: the checkout it ran in)."""
    root = Path(argv[1]).resolve() if len(argv) > 1 else ROOT
    entries = {}
    for line in Path(argv[0]).read_text().splitlines():
        rec = json.loads(line)
        k = key(rec["args"], rec["world_size"], root)
        entries.setdefault(k, {"key": k, "test": rec["test"]})
    LIST.write_text(json.dumps(sorted(entries.values(), key=lambda e: (e["test"], e["key"])), indent=1) + "\n")
    print(f"{len(entries)} configurations written to {LIST}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
