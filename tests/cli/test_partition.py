"""``lightning-halo partition GRAPH --parts P --out DIR``: the offline step of the two-step workflow."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

from lightning_halo.data import PartitionDirectory
from tests.support.cli import ROOT, cli_ranks
from tests.support.graphs import awkward_graph


def test_partition_into_a_directory_and_read_it_back(tmp_path: Path, partition_cli) -> None:
    torch.save(Data(**awkward_graph(2).to_dict()), tmp_path / "graph.pt")
    out = tmp_path / "parts"
    code, stdout, stderr = partition_cli(str(tmp_path / "graph.pt"), "--parts", "2", "--out", str(out), "--json")
    assert code == 0, stderr
    report = json.loads(stdout.strip().splitlines()[-1])
    assert PartitionDirectory(out).verify() and report["manifest"] == PartitionDirectory(out).read_meta()
    assert report["manifest"]["graph"]["num_features"] == 8 and report["traffic"]["1"]["fwd_per_epoch"] > 0
    assert not (tmp_path / "cache").exists(), "--out writes nothing to the cache"
    for given in ([], ["--parts", "2"]):  # a directory: its tables; it knows its part count
        code, stdout, stderr = partition_cli(str(out), *given)
        assert code == 0, stderr
        assert f"edge cut {report['stats']['edge_cut']}" in stdout and "halo traffic per training epoch" in stdout
        assert f"partition directory {out} (2 part files" in stdout


def test_partition_errors_name_the_fix_and_touch_nothing(tmp_path: Path, partition_cli) -> None:
    out = tmp_path / "parts"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    code, _, stderr = partition_cli("cora", "--parts", "2", "--out", str(out))
    assert code == 2 and "holds other files; choose a new --out directory" in stderr
    assert [f.name for f in out.iterdir()] == ["mine.txt"]
    code, _, stderr = partition_cli("cora", "--parts", "3", "--out", str(tmp_path / "p3"))
    assert code == 0, stderr
    code, _, stderr = partition_cli(str(tmp_path / "p3"), "--parts", "2")
    assert code == 2 and f"{tmp_path / 'p3'} is a partition directory of 3 parts, not 2" in stderr
    assert "Trainer" not in stderr and "--parts 2 --out NEW_DIR" in stderr
    code, _, stderr = partition_cli(str(tmp_path / "p3"), "--out", str(tmp_path / "p4"))
    assert code == 2 and "cannot be partitioned again" in stderr and not (tmp_path / "p4").exists()
    code, _, stderr = partition_cli("--parts", "2")
    assert code == 2 and "give the graph" in stderr
    code, _, stderr = partition_cli("cora")
    assert code == 2 and "--parts is required to partition a graph" in stderr
    code, _, stderr = partition_cli("cora", "--parts", "2", "--partitioner", "kaminpar", "--threads", "2")
    assert code == 2 and "--threads applies to --out only" in stderr


def test_partition_with_kaminpar_names_it_in_the_table(tmp_path: Path, partition_cli) -> None:
    out = tmp_path / "parts"
    code, stdout, stderr = partition_cli("cora", "--parts", "3", "--out", str(out), "--partitioner", "kaminpar", "--threads", "2")
    assert code == 0, stderr
    manifest = PartitionDirectory(out).read_meta()
    assert manifest["partitioned_with"]["partitioner"] == "kaminpar" and manifest["partitioned_with"]["threads"] == 2
    assert "kaminpar into 3 parts: edge cut" in stdout and "balance" in stdout


@pytest.mark.multiprocess
def test_two_step_workflow_partition_then_fit(tmp_path: Path, partition_cli) -> None:
    """What examples/slurm/partition.sbatch and train_from_dir.sbatch run, on 2 local processes."""
    parts = tmp_path / "cora-2"
    code, _, stderr = partition_cli("cora", "--parts", "2", "--out", str(parts))
    assert code == 0, stderr
    (tmp_path / "cache").mkdir()
    output = cli_ranks(
        "fit", "--config", str(ROOT / "examples/configs/sage.yaml"), "--data.data", str(parts), "--trainer.max_epochs", "2",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_checkpointing", "true",
        "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.save_last=true",
        "--trainer.callbacks.dirpath", str(tmp_path / "ckpt"), tmp_path=tmp_path, cache=tmp_path / "cache",
    )  # fmt: skip
    assert (tmp_path / "ckpt" / "last.ckpt").is_file()
    cached = [p.name for p in (tmp_path / "cache").glob("*") if not p.name.startswith(".")]
    assert not cached, f"a fit from a partition directory partitions nothing into the cache: {cached}"
    assert f"2 parts, {parts})" in output, "the partition statistics name the directory"


@pytest.mark.multiprocess
def test_partition_command_predicts_the_bytes_of_a_real_run(tmp_path: Path, partition_cli) -> None:
    code, stdout, stderr = partition_cli("--data", "cora", "--num-parts", "2", "--hidden", "32", "--layers", "3", "--json")
    assert code == 0, stderr
    predicted = json.loads(stdout.strip().splitlines()[-1])
    cli_ranks(
        "fit", "--config", str(ROOT / "examples/configs/sage.yaml"), "--trainer.max_epochs", "3",
        "--trainer.enable_progress_bar", "false", "--model.init_args.hidden_channels", "32",
        "--model.init_args.num_layers", "3", "--trainer.strategy.init_args.bits", "2",
        "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(tmp_path), tmp_path=tmp_path,
    )  # fmt: skip
    rows = list(csv.DictReader(open(next(tmp_path.rglob("metrics.csv")))))
    fwd = [float(r["halo/fwd_bytes"]) for r in rows if r.get("halo/fwd_bytes")]
    bwd = [float(r["halo/bwd_bytes"]) for r in rows if r.get("halo/bwd_bytes")]
    assert len(fwd) == 3 and len(bwd) == 3
    # the zoo's SAGE (mean) takes halo partial sums (the default): the table's "partial sums" columns
    expect = predicted["traffic_cover"]["2"]
    assert expect["fwd_per_epoch"] < predicted["traffic"]["2"]["fwd_per_epoch"]
    assert fwd == [expect["fwd_per_epoch"]] * 3
    assert bwd == [expect["bwd_per_epoch"]] * 3


def test_partition_command_prints_tables(partition_cli) -> None:
    code, out, err = partition_cli("--data", "cora", "--num-parts", "3", "--hidden", "256")
    assert code == 0, err
    assert "edge cut" in out and "halo traffic per training epoch" in out
    for bits in ("1", "2", "4", "8", "16", "32"):
        assert any(line.split()[:1] == [bits] for line in out.splitlines())
