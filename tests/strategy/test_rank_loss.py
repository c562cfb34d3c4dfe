"""A dead or frozen rank stops its peers with a clear error in bounded time; a relaunch resumes."""

from __future__ import annotations

import json

import pytest

from tests.support.launch import run_workers

TIMEOUT = 10.0


@pytest.mark.multiprocess
@pytest.mark.parametrize("how", ["kill", "freeze"])
def test_peer_loss_is_a_clear_error_then_resume(how: str, tmp_path) -> None:
    results = run_workers(
        ["tests/workers/rankloss_worker.py", "--out", str(tmp_path), "--phase", "crash", "--how", how,
         "--timeout", str(TIMEOUT)],
        2, timeout=240, kill_on_failure=False, until_rank_exits=0,
    )  # fmt: skip
    assert results[1].returncode != 0, "rank 1 was supposed to die"
    survivor = json.loads((tmp_path / "crash-rank0.json").read_text())
    assert not survivor["ok"], "the surviving rank must stop, not finish"
    assert "halo exchange failed on rank 0" in survivor["error"] or "HaloExchangeError" in survivor["error"], survivor
    # a killed peer closes its sockets: the error is immediate; a frozen one: after halo_timeout
    if how == "kill":
        assert survivor["seconds"] < 60, survivor
    else:
        assert TIMEOUT <= survivor["seconds"] < TIMEOUT + 60, survivor
        assert "Timed out" in survivor["error"], survivor
    assert results[0].returncode == 1, "the survivor exits by itself (no hang in clean-up)"
    assert (tmp_path / "ckpt" / "last.ckpt").is_file()

    resumed = run_workers(
        ["tests/workers/rankloss_worker.py", "--out", str(tmp_path), "--phase", "resume"], 2, timeout=300
    )
    for r in range(2):
        rec = json.loads((tmp_path / f"resume-rank{r}.json").read_text())
        assert rec["ok"], rec
        assert resumed[r].returncode == 0
        assert rec["epoch"] == 6


@pytest.mark.multiprocess
def test_nan_halo_rows_stop_training_naming_where(tmp_path) -> None:
    results = run_workers(
        ["tests/workers/rankloss_worker.py", "--out", str(tmp_path), "--phase", "crash", "--how", "nan",
         "--timeout", str(TIMEOUT)],
        2, timeout=240, kill_on_failure=False,
    )  # fmt: skip
    culprit = json.loads((tmp_path / "crash-rank1.json").read_text())
    peer = json.loads((tmp_path / "crash-rank0.json").read_text())
    assert "NonFiniteError" in culprit["error"] and "layer 'conv2' on rank 1" in culprit["error"], culprit
    assert not peer["ok"] and peer["seconds"] < 120, peer
    assert all(r.returncode == 1 for r in results)
