"""examples/link_pred.py (PyG's link_pred.py on partitions) runs on two processes and learns."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support.cli import ROOT


@pytest.mark.slow
@pytest.mark.multiprocess
def test_link_pred_example_runs_on_two_processes(tmp_path) -> None:
    env = {**os.environ, "LIGHTNING_HALO_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "link_pred.py"), "--devices", "2", "--epochs", "20"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    auc = float(re.search(r"test_auroc\s+(\d\.\d+)", result.stdout).group(1))
    assert auc > 0.7, result.stdout[-2000:]
    assert "pair exchange (gather_rows" in result.stdout + result.stderr
