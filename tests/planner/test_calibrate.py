"""lightning_halo.planner.calibrate: measured once, stored, reused; re-measured when stale."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from lightning_halo.planner import calibrate as cal


def test_rates_are_measured_once_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rates) -> None:
    calls = []
    monkeypatch.setattr(
        cal, "calibrate", lambda threads: calls.append(threads) or {**rates, "version": cal.CALIBRATION_VERSION}
    )
    store = tmp_path / "cal.json"
    first = cal.load_rates(1, path=store)
    assert calls == [1] and json.loads(store.read_text())[cal.machine_key(1)] == first
    assert cal.load_rates(1, path=store) == first and calls == [1], "the stored figures are reused"
    cal.load_rates(2, path=store)
    assert calls == [1, 2], "another thread count is another calibration"
    cal.load_rates(1, path=store, recalibrate=True)
    assert calls == [1, 2, 1]
    stored = json.loads(store.read_text())
    stored[cal.machine_key(1)]["version"] = cal.CALIBRATION_VERSION - 1
    store.write_text(json.dumps(stored))
    cal.load_rates(1, path=store)
    assert calls == [1, 2, 1, 1], "figures of an older calibration are measured again"


def test_the_store_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LIGHTNING_HALO_CALIBRATION", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cal.calibration_path() == tmp_path / "lightning-halo" / "calibration.json"
    monkeypatch.setenv("LIGHTNING_HALO_CALIBRATION", str(tmp_path / "mine.json"))
    assert cal.calibration_path() == tmp_path / "mine.json"
    assert cal.read_store(tmp_path / "absent.json") == {}


def test_a_rates_file_is_checked(tmp_path: Path, rates) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(rates))
    bad.write_text(json.dumps({"spmm": 1.0}))
    assert cal.read_rates(good) == rates
    with pytest.raises(ValueError, match="lacks dense, elementwise_s"):
        cal.read_rates(bad)
    with pytest.raises(ValueError, match="cannot read"):
        cal.read_rates(tmp_path / "none.json")


def test_the_kernels_are_timed() -> None:
    measured = cal.measure_kernels(rows=2000, width=32, degree=8, repeats=2)
    assert set(measured) == {"spmm", "dense", "elementwise_s", "codec"} and all(v > 0 for v in measured.values())
    assert 1e6 < measured["spmm"] < 1e12 and 1e7 < measured["dense"] < 1e14  # edge·features/s and flop/s, not seconds


def test_the_local_matrix_stays_near_its_diagonal() -> None:
    import torch

    a = cal.local_csr(1000, 8, 16, torch.Generator().manual_seed(0))
    rows = torch.arange(1000).repeat_interleave(8)
    assert a.shape == (1000, 2000) and a._nnz() == 8000
    assert ((a.col_indices() - 2 * rows).abs() <= 16).all()


@pytest.mark.parametrize("key", ["codec_bytes", "idle_bytes", "step_s"])
def test_a_calibration_missing_a_figure_is_refused_not_read_as_zero(tmp_path: Path, rates, key: str) -> None:
    """A file (or dict) without ``codec_bytes`` once planned quantized runs without the quantizer's kernels."""
    from lightning_halo.planner.plan import plan

    partial = {k: v for k, v in rates.items() if k != key}
    path = tmp_path / "partial.json"
    path.write_text(json.dumps(partial))
    with pytest.raises(ValueError, match=rf"partial.json is not a complete calibration: it lacks {key}"):
        cal.read_rates(path)
    with pytest.raises(ValueError, match=rf"the calibration given as rates is not a complete calibration: it lacks {key}"):
        plan(counts={"num_nodes": 1000, "num_edges": 5000, "num_features": 8, "num_classes": 2}, cut_ratio=0.1,
             ranks=[2], rates=partial)  # fmt: skip
    with pytest.raises(ValueError, match=rf"{key}=-1 must be non-negative"):
        cal.check_rates({**rates, key: -1}, "x")


def test_measuring_the_step_restores_lightnings_logger_level() -> None:
    import logging

    from lightning_halo.planner.step import _quiet_lightning, fit_epochs

    logger = logging.getLogger("lightning.pytorch")
    before = logger.level
    try:
        logger.setLevel(logging.DEBUG)
        assert len(fit_epochs(1, epochs=3)) == 3
        assert logger.level == logging.DEBUG, "the calibration left Lightning's logger at another level"
        with pytest.raises(RuntimeError), _quiet_lightning():
            assert logger.level == logging.ERROR
            raise RuntimeError("a failed calibration run")
        assert logger.level == logging.DEBUG, "restored after an error too"
    finally:
        logger.setLevel(before)


def test_a_calibration_file_of_an_older_version_is_refused_with_the_command_that_measures_again(tmp_path: Path, rates) -> None:
    """Version 3 had no step overhead per layer nor the sharing of cores: it would plan the issue's 52 % short."""
    old = {k: v for k, v in rates.items() if k not in ("layer_s", "dist_step_s", "dist_layer_s", "share", "share_ranks", "cores")}
    path = tmp_path / "v3.json"
    path.write_text(json.dumps({**old, "version": 3}))
    with pytest.raises(ValueError, match=r"the calibration file .*v3\.json is a calibration of version 3; this planner reads "
                       r"version 4 .*`python -m lightning_halo\.planner\.calibrate`"):  # fmt: skip
        cal.read_rates(path)
    path.write_text(json.dumps(old))  # no version: refused for the figures it lacks, each named
    with pytest.raises(ValueError, match=r"v3\.json is not a complete calibration: it lacks layer_s, dist_step_s, "
                       r"dist_layer_s, share, cores, share_ranks; measure this machine again with `python -m"):  # fmt: skip
        cal.read_rates(path)
    with pytest.raises(ValueError, match=r"share=0\.5 must be non-negative numbers \(share, cores, threads and share_ranks at least 1\)"):
        cal.check_rates({**rates, "share": 0.5}, "x")


def test_a_stored_calibration_of_an_older_version_is_measured_again_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, rates
) -> None:  # fmt: skip
    monkeypatch.setattr(cal, "calibrate", lambda threads: dict(rates))
    store = tmp_path / "cal.json"
    store.write_text(json.dumps({cal.machine_key(1): {**rates, "version": 3}}))
    with caplog.at_level(logging.WARNING, logger="lightning_halo.planner"):
        assert cal.load_rates(1, path=store) == rates
    assert f"stored in {store} for this machine is version 3, this planner reads version 4" in caplog.text
    assert json.loads(store.read_text())[cal.machine_key(1)]["version"] == 4


def test_the_overhead_is_the_line_through_the_tiny_epochs_less_their_kernels(rates) -> None:
    from lightning_halo.planner.step import overhead_fit, tiny_kernel_seconds

    k1, k3 = tiny_kernel_seconds(1, 2, rates), tiny_kernel_seconds(3, 2, rates)
    assert 0 < k1 < k3, "three layers have more kernels than one"
    step, layer = overhead_fit({1: 0.010 + k1, 3: 0.016 + k3}, 2, rates)
    assert (step, layer) == (pytest.approx(0.007), pytest.approx(0.003))
    assert overhead_fit({1: 0.010 + k1, 3: 0.009 + k3}, 2, rates)[1] == 0.0, "a noisy pair never gives a negative slope"


def test_sharing_is_the_median_slowdown_of_the_slowest_rank() -> None:
    alone = {"spmm": 4e9, "dense": 8e10, "elementwise_s": 1e-8}
    assert cal.sharing_slowdown(alone, [alone, alone]) == 1.0
    assert cal.sharing_slowdown(alone, [{"spmm": 2e9, "dense": 4e10, "elementwise_s": 3e-8}, alone]) == 2.0
    assert cal.sharing_slowdown(alone, [{"spmm": 8e9, "dense": 1.6e11, "elementwise_s": 1e-9}]) == 1.0, "never below 1"


@pytest.mark.multiprocess
def test_the_calibration_measures_the_overhead_through_real_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """One rank in this process and two ranks over gloo on this host, through Lightning and the strategy."""
    small = cal.measure_kernels(rows=4000, width=64, degree=8, repeats=2)
    monkeypatch.setattr(cal, "measure_kernels", lambda: dict(small))
    monkeypatch.setattr(cal, "measure_idle_bytes", lambda: (1, 1))  # measured by its own test
    rates = cal.calibrate(rounds=1)
    assert cal.check_rates(rates, "the calibration") is rates and rates["version"] == cal.CALIBRATION_VERSION
    assert rates["step_s"] + rates["layer_s"] > 0 and rates["dist_step_s"] + rates["dist_layer_s"] > 0
    assert rates["dist_step_s"] + 2 * rates["dist_layer_s"] < 5.0, "seconds per step, not milliseconds"
    assert rates["share"] >= 1.0 and rates["share_ranks"] == 2 and rates["cores"] >= 1
    assert cal.calibrate(rounds=1, step=False)["share"] == 1.0
