"""PyG's "Processing..."/"Done!" lines are dropped when a pyg: dataset is built; everything else it prints stays."""

from __future__ import annotations

import sys

import pytest

from lightning_halo.data.pyg_datasets import _quietly


class _Chatty:
    def __init__(self, root: str, fail: bool = False) -> None:
        print("Processing...", file=sys.stderr)
        print("UserWarning: something the user should see", file=sys.stderr)
        if fail:
            raise RuntimeError("raw files missing")
        print("Done!", file=sys.stderr)
        self.root = root


def test_processing_lines_dropped_other_output_kept(capsys: pytest.CaptureFixture) -> None:
    dataset = _quietly(_Chatty, "root")
    assert dataset.root == "root"
    assert capsys.readouterr().err == "UserWarning: something the user should see\n"


def test_output_kept_when_the_dataset_fails(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(RuntimeError, match="raw files missing"):
        _quietly(lambda root: _Chatty(root, fail=True), "root")
    assert "something the user should see" in capsys.readouterr().err
