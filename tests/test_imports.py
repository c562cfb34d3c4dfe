"""``import lightning_halo`` is cheap (names resolve on first use) and still registers the strategy names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_PROBE = """
import sys
import lightning_halo
from lightning.pytorch.strategies import StrategyRegistry
heavy = ("torch_geometric", "numba", "lightning_halo.strategy", "lightning_halo.exchange", "lightning_halo.quant")
print("heavy after import:", sorted(m for m in sys.modules if m.startswith(heavy)))
print("registered:", "halo_quant" in StrategyRegistry, "halo_quant_spawn" in StrategyRegistry)
import lightning as L
trainer = L.Trainer(strategy="halo_quant", accelerator="cpu", devices=1, logger=False)
spawn = StrategyRegistry.get("halo_quant_spawn")
print("resolved:", type(trainer.strategy).__name__, trainer.strategy._start_method, type(spawn).__name__, spawn._start_method)
print("same class:", type(trainer.strategy) is lightning_halo.HaloQuantStrategy)
"""


def test_import_registers_strategy_names_and_imports_nothing_heavy() -> None:
    run = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in run.stdout.splitlines() if ": " in line)
    assert lines["heavy after import"] == "[]"
    assert lines["registered"] == "True True"
    # strategy="halo_quant" builds a real HaloQuantStrategy once a Trainer asks for it
    assert lines["resolved"] == "HaloQuantStrategy popen HaloQuantStrategy spawn"
    assert lines["same class"] == "True"


def test_every_public_name_resolves() -> None:
    import lightning_halo
    import lightning_halo.callbacks
    import lightning_halo.partition

    for module in (lightning_halo, lightning_halo.callbacks, lightning_halo.partition):
        for name in module.__all__:
            assert getattr(module, name).__name__ == name
            assert name in dir(module)


def test_unknown_name_is_an_attribute_error() -> None:
    import lightning_halo

    with pytest.raises(AttributeError, match="has no attribute 'HaloNothing'"):
        lightning_halo.HaloNothing  # noqa: B018
    assert not hasattr(lightning_halo, "HaloNothing")
