"""Batch norms through the strategy, in real processes over gloo (CPU): exact by default.

PyG's ready models with ``norm="batch_norm"`` (PyG's ``BatchNorm``, a ``torch.nn.BatchNorm1d``
inside; the second with ``momentum=None``, a cumulative average): logits, loss, gradients
after one step, parameters and running statistics after 5 Adam steps equal single-process PyG.
"""

from __future__ import annotations

import pytest

from tests.support.parity import assert_parity, run_parity

CONFIGS = ["model:GIN-batchnorm:cora", "model:GCN-batchnorm-cumulative:awkward"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_batch_norm_is_exact_on_cpu(world_size: int, tmp_path) -> None:
    run_parity(CONFIGS, world_size, tmp_path)
    for config in CONFIGS:
        recs = assert_parity(config, world_size, tmp_path)
        assert any("running_var" in name for name in recs[0]["buffers"]), "the model has batch norms"
