"""lightning_halo.planner.options: link speeds, latencies, models."""

from __future__ import annotations

import pytest

from lightning_halo.planner.options import PLAN_MODELS, check_model, format_bytes, parse_latency, parse_rate


@pytest.mark.parametrize(("text", "bytes_per_s"), [("100mbit", 12.5e6), ("1gbit", 125e6), ("10Gbit", 1.25e9),
                                                   ("25gbps", 3.125e9), ("1.25GB/s", 1.25e9), (8e9, 1e9)])  # fmt: skip
def test_rates_read_like_tc_and_bytes_per_second(text, bytes_per_s) -> None:
    assert parse_rate(text) == pytest.approx(bytes_per_s)


@pytest.mark.parametrize("bad", ["fast", "10 gigabit", "-1gbit", "0mbit", ""])
def test_a_bad_rate_names_the_format(bad) -> None:
    with pytest.raises(ValueError, match="10gbit|positive"):
        parse_rate(bad)


def test_latencies() -> None:
    assert parse_latency("50us") == pytest.approx(50e-6)
    assert parse_latency("0.2ms") == pytest.approx(2e-4)
    assert parse_latency(0.001) == 0.001 and parse_latency("1e-5") == pytest.approx(1e-5)
    with pytest.raises(ValueError, match="50us"):
        parse_latency("soon")


def test_models_and_bytes() -> None:
    assert PLAN_MODELS == ("gcn", "sage") and check_model("gcn") == "gcn"
    with pytest.raises(ValueError, match="no formulas for model 'gat'"):
        check_model("gat")
    assert format_bytes(1.93e9) == "1.93 GB" and format_bytes(12) == "12 B"


def test_every_formula_refuses_a_model_it_has_none_for() -> None:
    """Memory once took any model but "sage" for GCN, timing any but "gcn" for SAGE."""
    from lightning_halo.planner.memory import activation_bytes, model_params
    from lightning_halo.planner.timing import compute_seconds

    r = {"spmm": 1e9, "dense": 1e10, "elementwise_s": 1e-8, "step_s": 0.0}
    for call in (lambda: model_params("gat", [4, 8, 2]), lambda: activation_bytes("GCN", [4, 8, 2], 10, 12),
                 lambda: compute_seconds("sage2", [4, 8, 2], 10, 12, 40, r)):  # fmt: skip
        with pytest.raises(ValueError, match="no formulas for model"):
            call()
    # and the two it has differ where they should: SAGE has two weight matrices, GCN keeps halo rows
    assert model_params("sage", [4, 8, 2]) - model_params("gcn", [4, 8, 2]) == 4 * 8 + 8 * 2
    assert activation_bytes("gcn", [4, 8, 2], 10, 12) != activation_bytes("sage", [4, 8, 2], 10, 12)
