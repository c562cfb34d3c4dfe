"""Every supported layer gives the full-graph result through the strategy, in real processes.

Each supported PyG layer class (and the variants that change how it runs: reversed flow, max
aggregation, cached, ...) runs in a two-conv model (with edge attributes or relation types
where the layer takes them) on a directed graph with isolated nodes; logits, loss, gradients
and parameters after 3 Adam steps must equal plain PyG. Layers that propagate several times
per call (and the other layers new in this release) run at 1-4 processes, the rest at 2 and 3;
PyG's ready models (``torch_geometric.nn.models`` with ``jk`` and norms) at 1-4.
"""

from __future__ import annotations

import pytest

from tests.support.models import HOMOGENEOUS_LAYERS, LAYER_VARIANTS, READY_MODELS
from tests.support.parity import assert_parity, run_parity

NEW = {"APPNP", "SGConv", "SSGConv", "TAGConv", "ARMAConv", "GatedGraphConv", "MixHopConv", "GCN2Conv", "FAConv",
       "ChebConv", "RGCNConv", "FastRGCNConv", "RGATConv", *LAYER_VARIANTS}  # fmt: skip
ALL = [*HOMOGENEOUS_LAYERS, *LAYER_VARIANTS]


def _configs(world_size: int) -> list[str]:
    names = ALL if world_size in (2, 3) else [n for n in ALL if n in NEW]
    # and PyG's ready models (jumping knowledge, node-wise layer norm, GATv2, EdgeCNN), as PyG ships them
    return [f"layer:{name}:awkward" for name in names] + [f"model:{name}:awkward" for name in READY_MODELS]


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_supported_layer_matches_full_graph(world_size: int, tmp_path) -> None:
    configs = _configs(world_size)
    run_parity(configs, world_size, tmp_path, extra=["--steps", "3"])
    for config in configs:
        assert_parity(config, world_size, tmp_path, steps=3)
