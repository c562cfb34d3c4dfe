"""Shared cases of the planner's tests: fixed kernel rates (no calibration runs) and a Cora partition directory."""

from __future__ import annotations

from pathlib import Path

import pytest

#: Kernel rates of a made-up machine: the tests check arithmetic, not this host.
RATES = {"spmm": 2e9, "dense": 5e10, "elementwise_s": 2e-8, "codec": 1e9, "step_s": 0.02, "layer_s": 0.003,
         "dist_step_s": 0.025, "dist_layer_s": 0.006, "share": 1.25, "share_ranks": 2, "cores": 2, "threads": 1,
         "idle_bytes": 400 << 20, "codec_bytes": 50 << 20, "key": "test", "measured": "never", "version": 4}  # fmt: skip


@pytest.fixture
def rates() -> dict:
    return dict(RATES)


@pytest.fixture(scope="module")
def cora_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cora partitioned into 2 parts, written as a partition directory (once per module)."""
    from lightning_halo.data.offline import partition_to_dir

    out = tmp_path_factory.mktemp("cora") / "parts"
    partition_to_dir("cora", out, 2)
    return out
