"""lightning_halo.dropout_edge through the strategy, in real processes: a GCN on the kept edges
(degrees over the kept edges of the whole graph) equals a single-process run of the same code."""

from __future__ import annotations

import pytest

from tests.support.parity import assert_parity, run_parity

CONFIGS = ["model:GCN-dropedge:cora", "model:GCN-dropedge:awkward"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_dropout_edge_is_exact(world_size: int, tmp_path) -> None:
    run_parity(CONFIGS, world_size, tmp_path)
    for config in CONFIGS:
        assert_parity(config, world_size, tmp_path)
