"""``lightning-halo fit|validate|test|predict``: every shipped config trains, configs round-trip, evaluation
needs a checkpoint, the library's own errors are one line."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.cli import ROOT, cli_in_process, cli_ranks, shared_datasets
from tests.support.noise import noise_lines

CONFIGS = sorted((ROOT / "examples" / "configs").glob("*.yaml"))


def data_override(config: Path, tmp_path: Path) -> list[str]:
    """Configs name ../shared/datasets relative to the checkout; point elsewhere if it lives elsewhere. A
    heterogeneous config gets a generated graph directory (its data is one the user writes)."""
    text = config.read_text()
    if "HeteroNodeClassifier" in text or "HeteroLinkPredictor" in text:
        from lightning_halo.data import save_npy_graph
        from tests.support.hetero import generated_hetero

        graph = generated_hetero()
        for t in ("paper", "author"):
            graph[t].x = graph[t].x.float()
        data = ["--data.data", str(save_npy_graph(graph, tmp_path / "hetero-graph"))]
        if "HeteroLinkPredictor" in text:  # the generated graph's author -> paper links
            data += ["--data.edge_type", "[author, writes, paper]", "--data.rev_edge_type", "[paper, rev_writes, author]"]
        return data
    if "../shared/datasets" not in text:
        return []
    shared = shared_datasets()
    if shared is None:
        pytest.skip("../shared/datasets is not on this machine (set LIGHTNING_HALO_SHARED)")
    line = next(l for l in text.splitlines() if l.strip().startswith("data:") and "../shared/datasets" in l)
    return ["--data.data", line.split(":", 1)[1].strip().strip("\"'").replace("../shared/datasets", str(shared))]


def verbs_of(config: Path) -> tuple[str, ...]:
    """How a config is run: ``link fit`` for the link-prediction configs (their header says so), else ``fit``."""
    return ("link", "fit") if "lightning-halo link fit" in config.read_text() else ("fit",)


@pytest.mark.multiprocess
@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_config_trains(config: Path, tmp_path: Path) -> None:
    output = cli_ranks(
        *verbs_of(config), "--config", str(config), "--trainer.max_epochs", "2", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(tmp_path), *data_override(config, tmp_path), tmp_path=tmp_path,
    )  # fmt: skip
    assert "lightning-halo traffic" in output
    assert epoch_lines(output) == ["0", "1"], "one line per epoch without a progress bar:\n" + output[-3000:]
    assert noise_lines(output) == [], output[-5000:]
    assert not (tmp_path / "config.yaml").exists(), "config.yaml belongs in the logger's folder, not the working directory"
    if "CSVLogger" in config.read_text():
        assert len(list(tmp_path.rglob("lightning_logs/*/version_0/config.yaml"))) == 1


def epoch_lines(output: str) -> list[str]:
    """The epoch numbers of the EpochPrinter lines in ``output``."""
    return [line.split()[1] for line in output.splitlines() if re.match(r"epoch \d+  [\d.]+ s  ", line)]


@pytest.mark.multiprocess
def test_logged_config_keeps_metrics_checkpoints_and_config_in_its_run_folder(tmp_path: Path) -> None:
    output = cli_ranks(
        "fit", "--config", str(ROOT / "examples/configs/gcn_1bit.yaml"), "--trainer.max_epochs", "3",
        "--trainer.enable_progress_bar", "false", tmp_path=tmp_path,
    )  # fmt: skip
    assert epoch_lines(output) == ["0", "1", "2"]
    run = tmp_path / "lightning_logs" / "gcn_1bit" / "version_0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lightning_logs"], "nothing else in the working directory"
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    # log_every_n_steps=1 (the command's default): the step-level train_loss of every epoch reaches the logger
    assert [r["epoch"] for r in rows if r.get("train_loss")] == ["0", "1", "2"]
    assert len([r for r in rows if r.get("val_acc")]) == 3


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_print_config_round_trips(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    first = cli_in_process(*verbs_of(config), "--config", str(config), "--print_config", capsys=capsys)
    saved = tmp_path / "printed.yaml"
    saved.write_text(first)
    second = cli_in_process(*verbs_of(config), "--config", str(saved), "--print_config", capsys=capsys)
    assert second == first and "trainer:" in first
    assert "torch.distributed" not in first, "no torch-version-specific DDP arguments in saved configs"


@pytest.mark.multiprocess
def test_predict_writes_the_whole_graph_and_evaluation_uses_the_checkpoint(tmp_path: Path) -> None:
    """docs/cli.md's workflow on 2 ranks: fit (CSV logger, checkpoints), then predict / validate / test from the
    last checkpoint. The prediction file, in the next run folder, holds the single-process forward of the
    checkpoint's model over the whole graph, in global node order."""
    from lightning_halo import load_graph
    from lightning_halo.models import GCN

    config = ["--config", str(ROOT / "examples/configs/gcn_1bit.yaml"), "--trainer.enable_progress_bar", "false"]
    cli_ranks("fit", *config, "--trainer.max_epochs", "2", tmp_path=tmp_path)
    ckpt = "lightning_logs/gcn_1bit/version_0/checkpoints/last.ckpt"  # relative to the working directory
    output = cli_ranks("predict", *config, "--ckpt_path", ckpt, tmp_path=tmp_path)
    written = "lightning_logs/gcn_1bit/version_1/predictions.pt"
    data = load_graph("cora")
    n, c = data.num_nodes, int(data.y.max()) + 1
    assert f"predictions of {n} nodes (float32 [{n}, {c}]) written to {written}\n" in output, output[-3000:]
    assert noise_lines(output) == [], output[-5000:]
    model = GCN.load_from_checkpoint(tmp_path / ckpt).eval()  # docs/quickstart.md: the checkpoint as a plain model
    with torch.no_grad():
        expected = model(data.x, data.edge_index)
    torch.testing.assert_close(torch.load(tmp_path / written, weights_only=True), expected, rtol=1e-4, atol=1e-5)
    accuracy = float((expected.argmax(-1)[data.test_mask] == data.y[data.test_mask]).float().mean())
    for verb in ("validate", "test"):
        output = cli_ranks(verb, *config, "--ckpt_path", ckpt, tmp_path=tmp_path)
        assert noise_lines(output) == [], output[-5000:]
    printed = re.search(r"test_acc\s+([\d.]+)", output)
    assert printed and abs(float(printed.group(1)) - accuracy) < 1e-6, output[-3000:]


@pytest.mark.parametrize("verb", ["validate", "test", "predict"])
def test_evaluation_without_a_checkpoint_is_refused(verb: str, lightning_halo_cli) -> None:
    code, _, err = lightning_halo_cli(verb, "--config", str(ROOT / "examples/configs/gcn.yaml"))
    assert code == 2
    assert f"lightning-halo {verb}: error: no --ckpt_path: {verb} would run the model with its freshly initialised" in err
    assert "--ckpt_path untrained" in err and "Traceback" not in err


def test_short_class_names_resolve(tmp_path: Path) -> None:
    """The command in a process that imported no model yet, as in the issue: no 'Expected a dot import path
    string' (forked from the tests' server: it imported Lightning and the dispatcher, not lightning_halo.models)."""
    from benchmarks.launch import run_forked
    from tests.support.launch import PRELOAD

    assert "lightning_halo.models" not in PRELOAD
    args = ["fit", "--model", "GCN", "--trainer.strategy", "HaloQuantStrategy", "--trainer.callbacks+=HaloSchedule",
            "--trainer.callbacks.mode", "pipelined", "--print_config"]  # fmt: skip
    result = run_forked(["-m", "lightning_halo.cli", *args], {**os.environ, "PYTHONPATH": str(ROOT)}, tmp_path, PRELOAD, 300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "class_path: lightning_halo.models.GCN" in result.stdout and "strategy: HaloQuantStrategy" in result.stdout
    assert "class_path: lightning_halo.HaloSchedule" in result.stdout and "mode: pipelined" in result.stdout
    import lightning as L

    from lightning_halo import HaloQuantStrategy

    trainer = L.Trainer(strategy="HaloQuantStrategy", accelerator="cpu", devices=1, logger=False)  # what the Trainer does
    assert type(trainer.strategy) is HaloQuantStrategy and trainer.strategy.bits == HaloQuantStrategy().bits


def test_untrained_predict_by_short_class_names(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """Short names in a run; --ckpt_path untrained asks for the initial weights; predict writes its file (one
    process, in this process, where tests imported another GCN: GraphSAGE is unique here)."""
    import logging

    from lightning_halo.cli import main

    args = ["predict", "--model", "GraphSAGE", "--trainer.strategy", "HaloQuantStrategy", "--trainer.callbacks+=HaloSchedule",
            "--data.cache_dir", str(tmp_path / "cache"), "--trainer.devices", "1", "--trainer.accelerator", "cpu",
            "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path), "--ckpt_path", "untrained"]  # fmt: skip
    with caplog.at_level(logging.INFO):
        main(args)
    from lightning_halo import load_graph

    data = load_graph("cora")
    saved = torch.load(tmp_path / "predictions.pt", weights_only=True)
    assert saved.shape == (data.num_nodes, int(data.y.max()) + 1)
    assert f"written to {tmp_path / 'predictions.pt'}" in caplog.text


def test_a_missing_data_file_is_one_line_of_the_library(tmp_path: Path, lightning_halo_cli) -> None:
    code, _, err = lightning_halo_cli("fit", "--config", str(ROOT / "examples/configs/gcn.yaml"), "--data.data", "missing.pt")
    from lightning_halo import GraphValidationError, HaloDataModule

    with pytest.raises(GraphValidationError) as own:  # what the library says, called directly
        HaloDataModule("missing.pt", cache_dir=str(tmp_path / "cache")).num_features
    assert code == 2, err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert errors == [f"lightning-halo fit: error: GraphValidationError: {own.value}"], err
    assert "Traceback" not in err, err


@pytest.mark.multiprocess
def test_torchrun_launch_equals_the_same_ranks_forked(tmp_path: Path) -> None:
    """torchrun (its elastic agent, fresh interpreters) trains the model two forked torchrun-style ranks train."""
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
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert tr.returncode == 0, tr.stdout[-3000:] + tr.stderr[-3000:]
    cli_ranks(*args(tmp_path / "forked"), tmp_path=tmp_path)  # the same ranks, forked (tests.support.cli)
    a = torch.load(tmp_path / "torchrun" / "last.ckpt", weights_only=False)["state_dict"]
    b = torch.load(tmp_path / "forked" / "last.ckpt", weights_only=False)["state_dict"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6)
