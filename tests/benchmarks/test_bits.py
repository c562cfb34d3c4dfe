"""The adaptive-bits benchmark (``python -m benchmarks.bits``): its math on made-up runs."""

from __future__ import annotations

import math

import pytest

from benchmarks.bits import (
    ADAPTIVE,
    bytes_per_epoch,
    judge,
    noise_points,
    render,
    render_noise,
    summarise_method,
    width_gain_pp,
    width_shares,
)


def _rec(vals: list[float], tests: list[float], fwd: list[int], widths: list[dict] | None = None) -> dict:
    """A two-rank record, one second per epoch; each rank sends ``fwd[i]`` forward and half that backward."""
    ranks = []
    for r in (0, 1):
        epochs = []
        for i, (v, t, f) in enumerate(zip(vals, tests, fwd)):
            e = {"epoch": i, "train_wall_s": float(i + 1), "val_acc": v, "test_acc": t, "fwd_bytes": f, "bwd_bytes": f // 2}
            if widths:
                e["widths"] = widths[i]
            epochs.append(e)
        ranks.append({"rank": r, "epochs": epochs, "stopped_by": "patience"})
    return {"ranks": ranks}


def test_bytes_per_epoch_sums_ranks_and_directions_and_averages_epochs() -> None:
    rec = _rec([0.1, 0.2], [0.1, 0.2], fwd=[100, 300])
    assert bytes_per_epoch(rec) == ((100 + 50) * 2 + (300 + 150) * 2) / 2


def test_width_shares_count_every_exchange_direction_and_epoch() -> None:
    widths = [{"a": {"fwd": 1, "bwd": 2}, "b": {"fwd": 1}}, {"a": {"fwd": 4, "bwd": 2}, "b": {"fwd": 1}}]
    shares = width_shares(_rec([0.1, 0.2], [0.1, 0.2], [1, 1], widths))
    assert shares == {1: 3 / 6, 2: 2 / 6, 4: 1 / 6}
    assert width_shares(_rec([0.1], [0.1], [1])) == {}


def test_summary_time_to_target_and_seeds_that_never_reach_it() -> None:
    fast = _rec([0.5, 0.8, 0.9], [0.4, 0.7, 0.85], [10, 10, 10])
    slow = _rec([0.5, 0.6, 0.7], [0.4, 0.5, 0.6], [10, 10, 10])
    s = summarise_method([fast, slow, fast], target=0.8)
    assert s["time_to_target_s"] == 2.0 and s["reached"] == 2  # median of (2, inf, 2)
    assert s["test"] == pytest.approx((0.85 + 0.6 + 0.85) / 3) and s["seeds"] == 3
    assert math.isinf(summarise_method([slow], target=0.8)["time_to_target_s"])


def _row(test: float, nbytes: float, t: float) -> dict:
    return {"test": test, "test_sd": 0.0, "bytes_per_epoch": nbytes, "time_to_target_s": t, "reached": 1, "seeds": 1,
            "metric": "val_acc", "best_val": test, "epochs": 3.0}  # fmt: skip


def test_judge_applies_the_three_targets() -> None:
    rows = {"b32-sync": _row(0.800, 3200, 5.0), "b1-sync": _row(0.790, 100, 4.0), "b4-sync": _row(0.800, 400, 3.0),
            ADAPTIVE: _row(0.7992, 200, 3.0)}  # fmt: skip
    j = judge(rows)
    assert j["score_gap_pp"] == pytest.approx(-0.08) and j["score_ok"]
    assert j["bytes_x"] == 2.0 and j["bytes_ok"] and j["time_ok"] and j["best_fixed_time_s"] == 3.0
    rows[ADAPTIVE] = _row(0.798, 201, 3.5)
    j = judge(rows)
    assert not j["score_ok"] and not j["bytes_ok"] and not j["time_ok"]
    assert judge({"b32-sync": rows["b32-sync"]})["score_ok"] is None  # adaptive not run: no verdict


def test_render_names_every_method_and_verdict() -> None:
    plateau = "badaptive-plateau-sync"
    rows = {"b32-sync": _row(0.8, 3200, 5.0), "b1-sync": _row(0.79, 100, math.inf), ADAPTIVE: _row(0.8, 150, 4.0),
            plateau: _row(0.79, 110, 6.0)}  # fmt: skip
    judged = {ADAPTIVE: judge(rows), plateau: judge(rows, plateau)}
    widths = {ADAPTIVE: {1: 0.5, 2: 0.5}, plateau: {1: 0.9, 2: 0.1}}
    text = render({"g/gcn": {"target": 0.8, "rows": rows, "judge": judged, "adaptive_widths": widths}})
    assert "| g/gcn | 32-bit |" in text and "| g/gcn | 1-bit |" in text and "never; 1/1" in text
    assert "| g/gcn | adaptive (1/2/4/8, budget 2x) | yes (+0.00 pp) | yes (1.50x) | yes | 1-bit 50 %, 2-bit 50 % |" in text
    assert ("| g/gcn | adaptive, budget on trial after a plateau (patience 5) | **no** (-1.00 pp) | yes (1.10x) | **no** | "
            "1-bit 90 %, 2-bit 10 % |") in text, text


def test_noise_points_take_the_largest_exchange_at_the_first_middle_and_last_measured_epoch() -> None:
    noise = [{"a": {}, "b": {}}, {"a": {"fwd": 1.0, "bwd": 2.0}, "b": {"fwd": 3.0, "bwd": 0.5}},
             {"a": {"fwd": 4.0, "bwd": 1.0}, "b": {"fwd": 0.0, "bwd": 0.0}}, {"a": {"fwd": 0.5, "bwd": 7.0}}]  # fmt: skip
    rec = {"ranks": [{"epochs": [{"epoch": i, "noise": n} for i, n in enumerate(noise)]}]}
    assert noise_points(rec) == {"fwd": [3.0, 4.0, 0.5], "bwd": [2.0, 1.0, 7.0]}, "epoch 0 measured nothing"
    assert noise_points({"ranks": [{"epochs": [{"epoch": 0}]}]}) == {}


def test_the_noise_table_shows_what_eight_bits_gain() -> None:
    results = {"g/gcn": {"rows": {"b8-sync": {"test": 0.71}, "b1-sync": {"test": 0.70}}}}
    assert width_gain_pp(results, "g/gcn") == pytest.approx(1.0) and width_gain_pp(results, "g/sage") is None
    table = render_noise({"g/gcn/cover": {"fwd": [1.0, 2.5, 3.0], "bwd": [0.5, 0.25, 0.125]}}, results)
    assert "| g/gcn | partial sums | 1 / 2.5 / 3 | 0.5 / 0.25 / 0.125 | +1.00 pp |" in table
