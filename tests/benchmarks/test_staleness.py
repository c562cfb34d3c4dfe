"""The staleness benchmark's method names (``python -m benchmarks.staleness``)."""

from __future__ import annotations

import pytest

from benchmarks.staleness import schedule_kwargs
from lightning_halo import HaloSchedule


@pytest.mark.parametrize(
    ("method", "want"),
    [
        ("32:sync", (32, {"mode": "sync"})),
        ("1:pipelined:5", (1, {"mode": "pipelined", "sync_every": 5})),
        ("1:adaptive", (1, {"mode": "adaptive"})),
        ("1:adaptive:0.2", (1, {"mode": "adaptive", "drift_threshold": 0.2})),
        ("1:adaptive:0.1:0", (1, {"mode": "adaptive", "drift_threshold": 0.1, "wait_threshold": 0.0})),
    ],
)
def test_a_method_names_its_bits_and_schedule(method: str, want: tuple) -> None:
    assert schedule_kwargs(method) == want
    HaloSchedule(**want[1])  # options the schedule takes


def test_an_option_on_another_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="take an option"):
        schedule_kwargs("1:sync:3")
