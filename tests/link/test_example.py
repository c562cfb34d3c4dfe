"""examples/link_pred.py (PyG's link_pred.py on partitions) runs on two processes and learns."""

from __future__ import annotations

import re

import pytest

from tests.support.cli import ROOT
from tests.support.launch import check, run_workers


@pytest.mark.slow
@pytest.mark.multiprocess
def test_link_pred_example_runs_on_two_processes(tmp_path) -> None:
    """The script's two ranks, forked torchrun-style from the tests' preloaded server (Lightning's own launcher:
    the README test)."""
    env = {"LIGHTNING_HALO_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    results = run_workers([str(ROOT / "examples" / "link_pred.py"), "--devices", "2", "--epochs", "20"], 2,
                          timeout=600, env=env, cwd=tmp_path)  # fmt: skip
    check(results)
    output = "".join(r.stdout for r in results)
    auc = float(re.search(r"test_auroc\s+(\d\.\d+)", output).group(1))
    assert auc > 0.7, output[-2000:]
    assert "pair exchange (gather_rows" in output
