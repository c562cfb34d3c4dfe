"""lightning_halo.planner.calibrate: measured once, stored, reused; re-measured when stale."""

from __future__ import annotations

import json
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

    from lightning_halo.planner.step import _quiet_lightning, measure_step_seconds

    logger = logging.getLogger("lightning.pytorch")
    before = logger.level
    try:
        logger.setLevel(logging.DEBUG)
        assert measure_step_seconds(epochs=3) > 0
        assert logger.level == logging.DEBUG, "the calibration left Lightning's logger at another level"
        with pytest.raises(RuntimeError), _quiet_lightning():
            assert logger.level == logging.ERROR
            raise RuntimeError("a failed calibration run")
        assert logger.level == logging.DEBUG, "restored after an error too"
    finally:
        logger.setLevel(before)
