"""``lightning-halo partition GRAPH --parts P --out DIR``: the offline step of the two-step workflow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

from lightning_halo.data import PartitionDirectory
from tests.support.graphs import awkward_graph
from tests.test_cli import ROOT, cli


def test_partition_into_a_directory_and_read_it_back(tmp_path: Path) -> None:
    torch.save(Data(**awkward_graph(2).to_dict()), tmp_path / "graph.pt")
    out = tmp_path / "parts"
    made = cli("partition", str(tmp_path / "graph.pt"), "--parts", "2", "--out", str(out), "--json", tmp_path=tmp_path, timeout=300)
    assert made.returncode == 0, made.stderr
    report = json.loads(made.stdout.strip().splitlines()[-1])
    assert PartitionDirectory(out).verify() and report["manifest"] == PartitionDirectory(out).read_meta()
    assert report["manifest"]["graph"]["num_features"] == 8 and report["traffic"]["1"]["fwd_per_epoch"] > 0
    assert not (tmp_path / "cache").exists(), "--out writes nothing to the cache"
    shown = cli("partition", str(out), "--parts", "2", tmp_path=tmp_path, timeout=300)  # a directory: its tables
    assert shown.returncode == 0, shown.stderr
    assert f"edge cut {report['stats']['edge_cut']}" in shown.stdout and "halo traffic per training epoch" in shown.stdout


def test_partition_errors_name_the_fix_and_touch_nothing(tmp_path: Path) -> None:
    out = tmp_path / "parts"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    busy = cli("partition", "cora", "--parts", "2", "--out", str(out), tmp_path=tmp_path, timeout=300)
    assert busy.returncode == 2 and "holds other files; choose a new --out directory" in busy.stderr
    assert [f.name for f in out.iterdir()] == ["mine.txt"]
    made = cli("partition", "cora", "--parts", "3", "--out", str(tmp_path / "p3"), tmp_path=tmp_path, timeout=300)
    assert made.returncode == 0, made.stderr
    wrong = cli("partition", str(tmp_path / "p3"), "--parts", "2", tmp_path=tmp_path, timeout=300)
    assert wrong.returncode == 2 and "holds 3 parts but the Trainer runs 2 processes" in wrong.stderr
    missing = cli("partition", "--parts", "2", tmp_path=tmp_path, timeout=300)
    assert missing.returncode == 2 and "give the graph" in missing.stderr


@pytest.mark.multiprocess
def test_two_step_workflow_partition_then_fit(tmp_path: Path) -> None:
    """What examples/slurm/partition.sbatch and train_from_dir.sbatch run, on 2 local processes."""
    parts = tmp_path / "cora-2"
    made = cli("partition", "cora", "--parts", "2", "--out", str(parts), tmp_path=tmp_path, timeout=300)
    assert made.returncode == 0, made.stderr
    fit = cli(
        "fit", "--config", str(ROOT / "examples/configs/sage.yaml"), "--data.data", str(parts), "--trainer.max_epochs", "2",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_checkpointing", "true",
        "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.save_last=true",
        "--trainer.callbacks.dirpath", str(tmp_path / "ckpt"), tmp_path=tmp_path,
    )  # fmt: skip
    assert fit.returncode == 0, fit.stdout[-3000:] + fit.stderr[-3000:]
    assert (tmp_path / "ckpt" / "last.ckpt").is_file() and not (tmp_path / "cache").exists()
    assert f"2 parts, {parts})" in fit.stdout + fit.stderr, "the partition statistics name the directory"
