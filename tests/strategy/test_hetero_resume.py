"""Checkpoints on heterogeneous partitions (gloo processes): resumed at the same process count a pipelined
run continues bitwise; resumed at another count an exact run still equals single-process PyG.

The per-rank halo state of a heterogeneous run lives in one slot per layer and source type
(``<layer>[<type>]``): it is gathered into the checkpoint and given back to each rank, or, at
another process count, restarted with a sync epoch (as on homogeneous graphs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.hetero import generated_hetero, train_reference
from tests.support.launch import check, run_workers

WORKER = "tests/workers/hetero_worker.py"
pytestmark = pytest.mark.multiprocess


def _record(out: Path, config: str, rank: int = 0) -> dict:
    return torch.load(out / config.replace(":", "_") / f"rank{rank}.pt", weights_only=False)


def _fit(out: Path, config: str, world_size: int, *extra: str) -> None:
    check(run_workers([WORKER, "--out", str(out), "--configs", config, *extra], world_size, timeout=600))


def test_a_pipelined_run_resumed_at_the_same_count_continues_bitwise(tmp_path: Path) -> None:
    config = "hgt:2:pipelined"
    _fit(tmp_path / "whole", config, 2)
    ckpt = tmp_path / "half.ckpt"
    _fit(tmp_path / "first", config, 2, "--epochs", "2", "--save", str(ckpt))
    _fit(tmp_path / "resumed", config, 2, "--resume", str(ckpt))
    for r in range(2):
        whole, resumed = _record(tmp_path / "whole", config, r), _record(tmp_path / "resumed", config, r)
        for name, value in whole["params"].items():
            assert torch.equal(resumed["params"][name], value), f"rank {r} {name}"
        assert torch.equal(resumed["pred"], whole["pred"])
    half = _record(tmp_path / "first", config)
    assert any(not torch.equal(half["params"][k], v) for k, v in _record(tmp_path / "whole", config)["params"].items())


def test_an_exact_run_resumed_at_another_count_equals_single_process_pyg(tmp_path: Path) -> None:
    config = "sage:32:sync"
    ckpt = tmp_path / "at2.ckpt"
    _fit(tmp_path / "first", config, 2, "--epochs", "2", "--save", str(ckpt))
    _fit(tmp_path / "resumed", config, 3, "--resume", str(ckpt))
    from tests.workers.hetero_worker import EPOCHS

    ref = train_reference("sage", generated_hetero(), EPOCHS)
    for r in range(3):
        rec = _record(tmp_path / "resumed", config, r)
        for name, value in ref["params"].items():
            torch.testing.assert_close(rec["params"][name], value, atol=1e-10, rtol=1e-9, msg=lambda m: f"rank {r} {name}: {m}")
        torch.testing.assert_close(rec["pred"], ref["pred"], atol=1e-10, rtol=1e-9)
