"""The lightning-halo command: every shipped config trains, configs round-trip, partition predicts bytes."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "examples" / "configs").glob("*.yaml"))


def shared_datasets() -> Path | None:
    for candidate in (os.environ.get("LIGHTNING_HALO_DATASETS"), ROOT.parent / "shared" / "datasets", "/work/shared/datasets"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def cli(*args: str, tmp_path: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    exe = shutil.which("lightning-halo") or str(Path(sys.executable).with_name("lightning-halo"))
    env = dict(os.environ, LIGHTNING_HALO_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.pop("SLURM_NTASKS", None)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(key, None)
    return subprocess.run([exe, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def data_override(config: Path) -> list[str]:
    """Configs name ../shared/datasets relative to the checkout; point elsewhere if it lives elsewhere."""
    text = config.read_text()
    if "../shared/datasets" not in text:
        return []
    shared = shared_datasets()
    if shared is None:
        pytest.skip("../shared/datasets is not on this machine (set LIGHTNING_HALO_DATASETS)")
    line = next(l for l in text.splitlines() if l.strip().startswith("data:") and "../shared/datasets" in l)
    return ["--data.data", line.split(":", 1)[1].strip().strip("\"'").replace("../shared/datasets", str(shared))]


@pytest.mark.multiprocess
@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_config_trains(config: Path, tmp_path: Path) -> None:
    result = cli(
        "fit", "--config", str(config), "--trainer.max_epochs", "2", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(tmp_path), *data_override(config), tmp_path=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "lightning-halo traffic" in result.stdout + result.stderr


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_print_config_round_trips(config: Path, tmp_path: Path) -> None:
    first = cli("fit", "--config", str(config), "--print_config", tmp_path=tmp_path, timeout=120)
    assert first.returncode == 0, first.stderr[-3000:]
    saved = tmp_path / "printed.yaml"
    saved.write_text(first.stdout)
    second = cli("fit", "--config", str(saved), "--print_config", tmp_path=tmp_path, timeout=120)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout == first.stdout
    assert "torch.distributed" not in first.stdout, "no torch-version-specific DDP arguments in saved configs"


@pytest.mark.multiprocess
def test_partition_command_predicts_the_bytes_of_a_real_run(tmp_path: Path) -> None:
    part = cli("partition", "--data", "cora", "--num-parts", "2", "--hidden", "32", "--layers", "3", "--json", tmp_path=tmp_path)
    assert part.returncode == 0, part.stderr
    predicted = json.loads(part.stdout.strip().splitlines()[-1])
    fit = cli(
        "fit", "--config", str(ROOT / "examples/configs/sage.yaml"), "--trainer.max_epochs", "3",
        "--trainer.enable_progress_bar", "false", "--model.init_args.hidden_channels", "32",
        "--model.init_args.num_layers", "3", "--trainer.strategy.init_args.bits", "2",
        "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(tmp_path), tmp_path=tmp_path,
    )  # fmt: skip
    assert fit.returncode == 0, fit.stdout[-3000:] + fit.stderr[-3000:]
    rows = list(csv.DictReader(open(next(tmp_path.rglob("metrics.csv")))))
    fwd = [float(r["halo/fwd_bytes"]) for r in rows if r.get("halo/fwd_bytes")]
    bwd = [float(r["halo/bwd_bytes"]) for r in rows if r.get("halo/bwd_bytes")]
    assert len(fwd) == 3 and len(bwd) == 3
    expect = predicted["traffic"]["2"]
    assert fwd == [expect["fwd_per_epoch"]] * 3
    assert bwd == [expect["bwd_per_epoch"]] * 3


def test_partition_command_prints_tables(tmp_path: Path) -> None:
    result = cli("partition", "--data", "cora", "--num-parts", "3", "--hidden", "256", tmp_path=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "edge cut" in out and "halo traffic per training epoch" in out
    for bits in ("1", "2", "4", "8", "16", "32"):
        assert any(line.split()[:1] == [bits] for line in out.splitlines())


@pytest.mark.multiprocess
@pytest.mark.parametrize("subcommand", ["validate", "test", "predict"])
def test_evaluation_subcommands(subcommand: str, tmp_path: Path) -> None:
    result = cli(subcommand, "--config", str(ROOT / "examples/configs/gcn.yaml"), "--trainer.enable_progress_bar", "false",
                 tmp_path=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.multiprocess
def test_torchrun_launch_equals_lightning_launch(tmp_path: Path) -> None:
    import torch

    def args(out: Path) -> list[str]:
        return [
            "fit", "--config", str(ROOT / "examples/configs/gcn.yaml"), "--trainer.max_epochs", "3",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_checkpointing", "true",
            "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.save_last=true",
            "--trainer.callbacks.dirpath", str(out),
        ]  # fmt: skip

    exe = shutil.which("lightning-halo") or str(Path(sys.executable).with_name("lightning-halo"))
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    env = dict(os.environ, LIGHTNING_HALO_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for key in ("SLURM_NTASKS", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(key, None)
    tr = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node=2", "--no-python", exe, *args(tmp_path / "torchrun")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,  # the CLI saves config.yaml to cwd
    )
    assert tr.returncode == 0, tr.stdout[-3000:] + tr.stderr[-3000:]
    ref = cli(*args(tmp_path / "lightning"), tmp_path=tmp_path)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    a = torch.load(tmp_path / "torchrun" / "last.ckpt", weights_only=False)["state_dict"]
    b = torch.load(tmp_path / "lightning" / "last.ckpt", weights_only=False)["state_dict"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6)
