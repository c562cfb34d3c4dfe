"""``lightning_halo._after_import.when_imported``: a hook run once a module is imported, never before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lightning_halo._after_import import when_imported

ROOT = Path(__file__).resolve().parents[1]


def test_a_module_already_imported_runs_the_hook_at_once() -> None:
    seen = []
    when_imported("json", lambda module: seen.append(module))
    assert seen == [sys.modules["json"]]


_PROBE = """
import sys
from lightning_halo._after_import import when_imported
seen = []
when_imported("colorsys", lambda m: seen.append((m.__name__, hasattr(m, "rgb_to_hsv"), type(m.__loader__).__name__)))
print("before", seen, "colorsys" in sys.modules)
import colorsys
import colorsys  # a second import runs nothing more
print("after", seen)
import importlib
importlib.reload(colorsys)  # the module keeps its own loader: reload works and runs no hook
print("reloaded", seen)
"""


def test_the_hook_runs_once_after_the_module_has_executed() -> None:
    run = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "before [] False"
    assert lines[1] == "after [('colorsys', True, 'SourceFileLoader')]"
    assert lines[2] == lines[1].replace("after", "reloaded")
