"""The bundled Cora equals PyG's Planetoid Cora (checked against ../shared/datasets when present)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from lightning_halo.data import load_bundled

from tests.support.cli import shared_datasets

_SHARED = shared_datasets()
SHARED = (_SHARED / "Cora") if _SHARED is not None else Path("/nonexistent")


def test_bundled_cora_shape() -> None:
    data = load_bundled("CORA")
    assert (data.num_nodes, data.num_edges, data.num_features) == (2708, 10556, 1433)
    assert int(data.y.max()) + 1 == 7
    assert (int(data.train_mask.sum()), int(data.val_mask.sum()), int(data.test_mask.sum())) == (140, 500, 1000)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/datasets/Cora not present on this machine")
def test_bundled_cora_equals_planetoid(tmp_path) -> None:
    from torch_geometric.datasets import Planetoid

    shutil.copytree(SHARED, tmp_path / "Cora")
    ref = Planetoid(str(tmp_path), "Cora")[0]
    data = load_bundled("cora")
    for key in ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(data[key], ref[key]), key
