"""Heterogeneous graphs in real processes: Lightning's fit on heterogeneous partitions equals single-process PyG.

The zoo's HeteroNodeClassifier (HeteroConv of SAGEConv or GATConv per relation, or HGTConv; a
learned embedding for the type without features) trains for a few epochs at bits=32 on 2 and 3
gloo processes; its parameters and the gathered predictions of the labelled type equal those of
plain PyG trained on the whole graph. Quantized and pipelined runs train and move fewer bytes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.hetero import generated_hetero, train_reference
from tests.support.launch import check, run_workers
from tests.workers.hetero_worker import EPOCHS

WORKER = "tests/workers/hetero_worker.py"
EXACT = ["sage:32:sync", "gat:32:sync", "hgt:32:sync"]


def _records(out: Path, config: str, world_size: int) -> list[dict]:
    return [torch.load(out / config.replace(":", "_") / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_fit_on_heterogeneous_partitions_equals_single_process_pyg(world_size: int, tmp_path: Path) -> None:
    configs = [*EXACT, "sage:1:sync", "hgt:2:pipelined"] if world_size == 2 else EXACT
    check(run_workers([WORKER, "--out", str(tmp_path), "--configs", *configs], world_size, timeout=900))
    data = generated_hetero()
    for config in EXACT:
        ref = train_reference(config.split(":")[0], data, EPOCHS)
        for r, rec in enumerate(_records(tmp_path, config, world_size)):
            for name, value in ref["params"].items():
                torch.testing.assert_close(rec["params"][name], value, atol=1e-10, rtol=1e-9,
                                           msg=lambda m: f"{config} rank {r} {name}: {m}")  # fmt: skip
            torch.testing.assert_close(rec["pred"], ref["pred"], atol=1e-10, rtol=1e-9)
            assert rec["traffic"], f"{config}: halos must have travelled"
    if world_size == 2:
        exact = _records(tmp_path, "sage:32:sync", 2)[0]["traffic"]
        one_bit = _records(tmp_path, "sage:1:sync", 2)[0]["traffic"]
        fwd = lambda t: sum(v for (layer, kind), v in t.items() if kind == "fwd")  # noqa: E731
        assert 0 < fwd(one_bit) * 8 < fwd(exact), (one_bit, exact)
        for config in ("sage:1:sync", "hgt:2:pipelined"):
            for rec in _records(tmp_path, config, 2):
                assert all(torch.isfinite(v).all() for v in rec["params"].values()), config
                assert rec["pred"].shape == (data["paper"].num_nodes, 3)
