"""The schedule as a pure policy: one vocabulary of modes, checked once, decided by the epoch."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_halo.exchange.policy import (
    DRIFT_THRESHOLD, MODES, SYNC, HaloPolicy, check_count, check_drift, check_mode, check_smoothing,
)  # fmt: skip


def test_modes_are_one_tuple_in_metric_code_order() -> None:
    assert MODES == ("sync", "pipelined", "periodic", "adaptive")


def test_mode_at_is_a_function_of_the_epoch() -> None:
    assert [HaloPolicy("pipelined").mode_at(e) for e in range(3)] == ["sync", "pipelined", "pipelined"]
    assert [HaloPolicy("periodic", refresh_every=2, warmup_epochs=2).mode_at(e) for e in range(6)] == [
        "sync", "sync", "sync", "periodic", "sync", "periodic",
    ]  # fmt: skip
    assert {SYNC.mode_at(e) for e in range(20)} == {"sync"}
    # adaptive epochs leave the choice to each layer; warmup and sync_every are synchronous
    assert [HaloPolicy("adaptive", sync_every=3, warmup_epochs=2).mode_at(e) for e in range(7)] == [
        "sync", "sync", "adaptive", "sync", "adaptive", "adaptive", "sync",
    ]  # fmt: skip


def test_the_drift_bound_is_the_adaptive_modes_only() -> None:
    assert HaloPolicy("adaptive").drift_bound == DRIFT_THRESHOLD
    assert HaloPolicy("adaptive", drift_threshold=0.2).drift_bound == 0.2
    assert HaloPolicy("pipelined").drift_bound is None and SYNC.drift_bound is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(mode="stale"), "unknown mode 'stale'; choose 'sync', 'pipelined', 'periodic' or 'adaptive'"),
        (dict(mode="periodic", sync_every=2), "sync_every applies to mode='pipelined' or 'adaptive' only"),
        (dict(mode="pipelined", drift_threshold=0.1), "drift_threshold applies to mode='adaptive' only"),
        (dict(mode="adaptive", drift_threshold=0), "drift_threshold must be a positive number"),
        (dict(mode="adaptive", drift_threshold=float("inf")), "drift_threshold must be a positive number"),
        (dict(mode="adaptive", drift_threshold="0.1"), "drift_threshold must be a positive number"),
        (dict(refresh_every=0), "refresh_every must be a positive integer, got 0"),
        (dict(warmup_epochs=True), "warmup_epochs must be a non-negative integer"),
        (dict(smoothing=1.0), r"smoothing must be a number in \[0, 1\)"),
    ],
)
def test_a_policy_is_checked_when_built(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HaloPolicy(**kwargs)


def test_checkers_and_frozen_policy() -> None:
    check_mode("periodic")
    check_smoothing(0)
    check_count("sync_every", None, 1, allow_none=True)
    with pytest.raises(ValueError, match="or None"):
        check_count("sync_every", 0, 1, allow_none=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        SYNC.mode = "pipelined"  # type: ignore[misc]


def test_every_mode_is_defined_once_in_the_mode_table() -> None:
    """MODE_TABLE is the one description of the modes (docs/modes.md's table is generated from it)."""
    from lightning_halo.exchange.policy import MODE_TABLE

    assert {row.mode for row in MODE_TABLE} == set(MODES)
    assert all(row.forward and row.backward and row.traffic and row.exactness and row.method for row in MODE_TABLE)
    plain = [row.mode for row in MODE_TABLE if not row.option]
    assert len(plain) == len(set(plain)), "a mode without an option is described once"
