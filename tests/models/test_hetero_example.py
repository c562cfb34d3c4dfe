"""examples/hetero_dblp.py runs end to end on two processes: HGT with a LayerNorm per type, at 1 bit, on a graph
shaped like OGB-MAG saved with torch.save (what ``--data`` takes besides HeCo's folders)."""

from __future__ import annotations

import re

import pytest
import torch

from lightning_halo.datasets.synthetic import mag_like_graph
from tests.support.cli import ROOT
from tests.support.launch import check, run_workers


@pytest.mark.multiprocess
def test_hetero_example_trains_hgt_with_layer_norm_on_two_processes(tmp_path) -> None:
    graph = tmp_path / "mag.pt"
    torch.save(mag_like_graph(600, classes=4, seed=0), graph)
    env = {"LIGHTNING_HALO_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    args = [str(ROOT / "examples" / "hetero_dblp.py"), "--data", str(graph), "--devices", "2", "--epochs", "3",
            "--conv", "hgt", "--norm", "layer", "--bits", "1", "--hidden", "16"]  # fmt: skip
    results = run_workers(args, 2, timeout=600, env=env, cwd=tmp_path)
    check(results)
    output = "".join(r.stdout for r in results)
    epochs = re.findall(r"^epoch", output, flags=re.MULTILINE)
    assert len(epochs) == 3, output[-2000:]
    sent, fp32 = map(float, re.search(r"training halo traffic ([\d.]+) MB vs ([\d.]+) MB as float32", output).groups())
    assert 0 < sent < fp32 / 8, output[-2000:]  # 1-bit halos of every source type HGT reads
    acc = float(re.search(r"test accuracy of the paper nodes: (\d\.\d+)", output).group(1))
    assert 0.0 <= acc <= 1.0, output[-2000:]
