"""An in-process fit leaves nothing behind that a later multi-process script would inherit.

CI hung twice for 600 s: a module-scoped fixture fitted in process before the per-test snapshot,
so ``LOCAL_RANK``/``MASTER_PORT`` stayed in ``os.environ`` and ``examples/... --devices 2`` waited
for a rank 1 that Lightning thought someone else had launched.
"""

from __future__ import annotations

import os

import lightning as L
import torch
import torch.distributed as dist

from lightning_halo import HaloDataModule, HaloQuantStrategy
from tests.support.graphs import awkward_graph
from tests.support.isolation import isolated_process_state
from tests.support.models import tiny_sage_module

LAUNCH_KEYS = ("LOCAL_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")


def _fit(tmp_path) -> None:
    trainer = L.Trainer(strategy=HaloQuantStrategy(bits=32), accelerator="cpu", devices=1, max_epochs=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    dm = HaloDataModule(awkward_graph(1, dtype=torch.float32), cache_dir=str(tmp_path / "cache"))
    trainer.fit(tiny_sage_module(), datamodule=dm)


def test_an_in_process_fit_leaves_launch_variables_behind_without_isolation(tmp_path) -> None:
    """The hazard is real: without the context, the fit writes the variables a launched rank reads."""
    before = {k: os.environ.get(k) for k in LAUNCH_KEYS}
    _fit(tmp_path)
    after = {k: os.environ.get(k) for k in LAUNCH_KEYS}
    assert after != before, "Lightning no longer writes its launch variables: the isolation may be unneeded"
    # the autouse fixture of the root conftest.py restores them after this test


def test_isolated_process_state_restores_the_environment_and_the_process_group(tmp_path) -> None:
    before = dict(os.environ)
    with isolated_process_state():
        _fit(tmp_path)
        os.environ["LIGHTNING_HALO_ISOLATION_PROBE"] = "1"
        os.environ["PATH"] = "changed"
    assert dict(os.environ) == before
    assert not (dist.is_available() and dist.is_initialized())


def test_the_suite_starts_each_test_without_launch_variables() -> None:
    """No earlier test (or module fixture) leaked them into this one."""
    leaked = {k: os.environ[k] for k in LAUNCH_KEYS if k in os.environ and k not in _ORIGINAL}
    assert not leaked, f"launch variables leaked into a later test: {leaked}"


_ORIGINAL = {k for k in LAUNCH_KEYS if k in os.environ}
