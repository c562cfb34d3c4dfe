"""The lightning-halo command: every shipped config trains, configs round-trip, partition predicts bytes."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.shared import find_shared
from tests.support.launch import check, run_workers
from tests.support.noise import noise_lines

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "examples" / "configs").glob("*.yaml"))


def shared_datasets() -> Path | None:
    """The shared datasets folder, or None (:func:`benchmarks.shared.find_shared`)."""
    return find_shared("datasets", override="LIGHTNING_HALO_DATASETS")


def cli(*args: str, tmp_path: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    exe = shutil.which("lightning-halo") or str(Path(sys.executable).with_name("lightning-halo"))
    env = dict(os.environ, LIGHTNING_HALO_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.pop("SLURM_NTASKS", None)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(key, None)
    return subprocess.run([exe, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def cli_ranks(*args: str, tmp_path: Path, timeout: float = 600) -> str:
    """Run ``lightning-halo *args`` as two torchrun-style ranks forked from the tests' preloaded
    server (:mod:`tests.support.launch`); returns both ranks' output, rank 0 first.

    Saves the two fresh interpreters of a :func:`cli` run (about 12 s); the command's own launcher
    (Lightning's subprocess launcher) is exercised by :func:`cli` tests below and the README test.
    """
    env = {"LIGHTNING_HALO_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    results = run_workers(["-m", "lightning_halo.cli", *args], 2, timeout=timeout, env=env, cwd=tmp_path)
    check(results)
    return "".join(r.stdout for r in results)


def data_override(config: Path) -> list[str]:
    """Configs name ../shared/datasets relative to the checkout; point elsewhere if it lives elsewhere."""
    text = config.read_text()
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
        "--trainer.default_root_dir", str(tmp_path), *data_override(config), tmp_path=tmp_path,
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


def test_top_level_help_lists_every_verb_without_importing_pyg() -> None:
    """``lightning-halo --help`` in a fresh interpreter: every verb listed, nothing of PyG or the strategy imported."""
    from lightning.pytorch.cli import LightningCLI

    probe = (
        "import sys\nfrom lightning_halo.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit as e:\n    code = e.code\n"
        "heavy = ('torch_geometric', 'numba', 'lightning_halo.strategy', 'lightning_halo.quant', 'lightning_halo.exchange')\n"
        "print('exit', code, 'heavy', sorted(m for m in sys.modules if m.startswith(heavy)))"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "exit 0 heavy []"
    listed = re.search(r"\{([a-z,]+)\}", run.stdout).group(1).split(",")
    assert listed == [*LightningCLI.subcommands(), "partition", "verify", "plan", "link"]
    assert noise_lines(run.stdout + run.stderr) == []


def test_help_of_each_verb(capsys: pytest.CaptureFixture) -> None:
    assert "--trainer.strategy" in cli_in_process("fit", "--help", capsys=capsys)
    assert "usage: lightning-halo partition" in cli_in_process("partition", "--help", capsys=capsys)
    assert "usage: lightning-halo verify" in cli_in_process("verify", "--help", capsys=capsys)
    assert "usage: lightning-halo plan" in cli_in_process("plan", "--help", capsys=capsys)


@pytest.mark.multiprocess
def test_logged_config_keeps_metrics_checkpoints_and_config_in_its_run_folder(tmp_path: Path) -> None:
    output = cli_ranks(
        "fit", "--config", str(ROOT / "examples/configs/gcn_1bit.yaml"), "--trainer.max_epochs", "3",
        "--trainer.enable_progress_bar", "false", tmp_path=tmp_path,
    )  # fmt: skip
    assert epoch_lines(output) == ["0", "1", "2"]
    run = tmp_path / "lightning_logs" / "gcn_1bit" / "version_0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "lightning_logs"], "nothing else in the working directory"
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    # log_every_n_steps=1 (the command's default): the step-level train_loss of every epoch reaches the logger
    assert [r["epoch"] for r in rows if r.get("train_loss")] == ["0", "1", "2"]
    assert len([r for r in rows if r.get("val_acc")]) == 3


def cli_in_process(*args: str, capsys: pytest.CaptureFixture) -> str:
    """Run a ``lightning-halo`` call that only parses (``--print_config``, ``--help``) in this process."""
    from lightning_halo.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    assert exit_.value.code in (0, None), capsys.readouterr().err[-3000:]
    return capsys.readouterr().out


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_print_config_round_trips(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    first = cli_in_process(*verbs_of(config), "--config", str(config), "--print_config", capsys=capsys)
    saved = tmp_path / "printed.yaml"
    saved.write_text(first)
    second = cli_in_process(*verbs_of(config), "--config", str(saved), "--print_config", capsys=capsys)
    assert second == first and "trainer:" in first
    assert "torch.distributed" not in first, "no torch-version-specific DDP arguments in saved configs"


@pytest.mark.multiprocess
def test_partition_command_predicts_the_bytes_of_a_real_run(tmp_path: Path, partition_cli) -> None:
    code, stdout, stderr = partition_cli("--data", "cora", "--num-parts", "2", "--hidden", "32", "--layers", "3", "--json")
    assert code == 0, stderr
    predicted = json.loads(stdout.strip().splitlines()[-1])
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
    # the zoo's SAGE (mean) takes halo partial sums (the default): the table's "partial sums" columns
    expect = predicted["traffic_cover"]["2"]
    assert expect["fwd_per_epoch"] < predicted["traffic"]["2"]["fwd_per_epoch"]
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
def test_evaluation_without_a_checkpoint_is_refused(verb: str, capsys: pytest.CaptureFixture) -> None:
    from lightning_halo.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([verb, "--config", str(ROOT / "examples/configs/gcn.yaml")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert f"lightning-halo {verb}: error: no --ckpt_path: {verb} would run the model with its freshly initialised" in err
    assert "--ckpt_path untrained" in err and "Traceback" not in err


def test_short_class_names_resolve(tmp_path: Path) -> None:
    """The installed command, as in the issue: no 'Expected a dot import path string'."""
    result = cli("fit", "--model", "GCN", "--trainer.strategy", "HaloQuantStrategy", "--trainer.callbacks+=HaloSchedule",
                 "--trainer.callbacks.mode", "pipelined", "--print_config", tmp_path=tmp_path, timeout=300)  # fmt: skip
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


def test_a_missing_data_file_is_one_line_of_the_library(tmp_path: Path) -> None:
    result = cli("fit", "--config", str(ROOT / "examples/configs/gcn.yaml"), "--data.data", "missing.pt",
                 tmp_path=tmp_path, timeout=300)  # fmt: skip
    from lightning_halo import GraphValidationError, HaloDataModule

    with pytest.raises(GraphValidationError) as own:  # what the library says, called directly
        HaloDataModule("missing.pt", cache_dir=str(tmp_path / "cache")).num_features
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert errors == [f"lightning-halo fit: error: GraphValidationError: {own.value}"], result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) <= 3, result.stderr


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
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert tr.returncode == 0, tr.stdout[-3000:] + tr.stderr[-3000:]
    ref = cli(*args(tmp_path / "lightning"), tmp_path=tmp_path)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    a = torch.load(tmp_path / "torchrun" / "last.ckpt", weights_only=False)["state_dict"]
    b = torch.load(tmp_path / "lightning" / "last.ckpt", weights_only=False)["state_dict"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6)


def test_only_the_library_s_deliberate_errors_lose_their_traceback() -> None:
    from lightning_halo import HaloPartition, HaloQuantStrategy
    from lightning_halo.cli import library_error

    def wrapped(raise_own) -> BaseException:
        try:
            try:
                raise_own()
            except Exception as own:  # noqa: BLE001
                raise ValueError("Call to compute_fn of link failed") from own  # as jsonargparse wraps it
        except ValueError as outer:
            return outer

    refused = wrapped(lambda: HaloQuantStrategy(bits=3))
    assert str(library_error(refused)).startswith("bits=3 is not supported")
    assert library_error(wrapped(lambda: HaloPartition().batch_size)) is None, "an AttributeError is a bug: keep it"
    assert library_error(ValueError("raised outside the package")) is None
