"""The record of the suite's real-process launches, and the check that a whole run launches every listed one."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import launches


def test_a_launch_is_keyed_without_its_temporary_paths() -> None:
    a = launches.key(["tests/workers/parity_worker.py", "--out", "/tmp/pytest-of-root/pytest-3/x0", "--configs", "gcn:2:cora"], 3)
    b = launches.key(["tests/workers/parity_worker.py", "--out", "/tmp/other/y", "--configs", "gcn:2:cora"], 3)
    assert a == b == json.dumps([3, "tests/workers/parity_worker.py", "--out", "<tmp>", "--configs", "gcn:2:cora"])
    assert a != launches.key(["tests/workers/parity_worker.py", "--out", "/tmp/x", "--configs", "gcn:2:cora"], 2)
    assert a != launches.key(["tests/workers/parity_worker.py", "--out", "/tmp/x", "--configs", "gcn:3:cora"], 3)
    cli = launches.key(["-m", "lightning_halo.cli", "fit", "--data.cache_dir=/tmp/c/cache"], 2)
    assert json.loads(cli)[1:] == ["-m", "lightning_halo.cli", "fit", "--data.cache_dir=<tmp>"]


def test_a_launch_is_keyed_without_the_checkout_it_ran_in(tmp_path) -> None:
    here = launches.key(["-m", "lightning_halo.cli", "fit", "--config", str(launches.ROOT / "examples/configs/gcn.yaml")], 2)
    other = launches.key(["-m", "lightning_halo.cli", "fit", "--config", "/srv/ci/clone/examples/configs/gcn.yaml"], 2,
                         root=Path("/srv/ci/clone"))  # fmt: skip
    assert here == other and json.loads(here)[-1] == "<repo>/examples/configs/gcn.yaml"
    assert "/" not in json.loads(launches.key(["w.py", str(launches.ROOT)], 2))[-1].replace("<repo>", "")


def test_only_the_accuracy_runs_epochs_may_change() -> None:
    worker = "tests/workers/accuracy_worker.py"
    assert launches.key([worker, "--epochs", "100", "--runs", "32:0"], 2) == launches.key([worker, "--epochs", "25", "--runs", "32:0"], 2)
    assert launches.key([worker, "--epochs", "25", "--runs", "32:0"], 2) != launches.key([worker, "--epochs", "25", "--runs", "1:0"], 2)
    parity = "tests/workers/parity_worker.py"
    assert launches.key([parity, "--steps", "5"], 2) != launches.key([parity, "--steps", "3"], 2)


def test_a_listed_configuration_not_launched_is_reported(monkeypatch, tmp_path) -> None:
    listed = [{"key": launches.key(["w.py", "--configs", c], 2), "test": "t"} for c in ("a", "b")]
    path = tmp_path / "launches.json"
    path.write_text(json.dumps(listed))
    monkeypatch.setattr(launches, "LIST", path)
    monkeypatch.setenv(launches.ENV, str(tmp_path / "record.jsonl"))
    launches.record(["w.py", "--configs", "a"], 2)
    assert launches.missing() == [listed[1]]
    assert launches.missing(skipped=frozenset({"t"})) == [], "listed from a test this run skipped"
    launches.record(["w.py", "--configs", "b"], 2)
    assert launches.missing() == []


def test_the_committed_list_holds_every_parity_matrix() -> None:
    """The list (generated before issue 37's speed-up) names the exactness matrices' launches."""
    keys = [json.loads(e["key"]) for e in json.loads(launches.LIST.read_text())]
    parity = [k for k in keys if k[1] == "tests/workers/parity_worker.py"]
    assert {k[0] for k in parity} == {1, 2, 3, 4}
    assert any("kaminpar" in k for k in parity) and any("none" in k for k in parity)
    assert {k[1] for k in keys} >= {"tests/workers/link_worker.py", "tests/workers/resume_worker.py",
                                    "tests/workers/resize_worker.py", "tests/workers/accuracy_worker.py", "-m"}  # fmt: skip
