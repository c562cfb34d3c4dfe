"""Run parity workers and compare their records with single-process plain PyG."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from tests.support.graphs import WORLD_DEPENDENT, graph_by_name
from tests.support.launch import check, run_workers
from tests.support.models import build_any, edges_for, reference_run

TOL = dict(atol=1e-8, rtol=1e-7)  # float64: far tighter than the required 1e-5


def run_parity(configs: list[str], world_size: int, out: Path, extra: list[str] | None = None) -> None:
    results = run_workers(
        ["tests/workers/parity_worker.py", "--out", str(out), "--configs", *configs, *(extra or [])],
        world_size,
        timeout=900,
    )
    check(results)


def load_records(config: str, world_size: int, out: Path) -> list[dict]:
    # map_location: workers on CUDA save CUDA tensors; the reference is computed on the CPU
    path = out / config.replace(":", "_").replace("/", "-")
    return [torch.load(path / f"rank{r}.pt", map_location="cpu") for r in range(world_size)]


def assemble(recs: list[dict], num_nodes: int, loss: str = "mean") -> tuple[torch.Tensor, float]:
    """Full-graph logits from every rank's inner rows, and the global loss (mean: weighted by
    train nodes; the other forms return shares, which sum to it)."""
    d = recs[0]["out0"].size(1)
    out = torch.full((num_nodes, d), float("nan"), dtype=recs[0]["out0"].dtype)
    total = sum(r["n_train"] for r in recs)
    value = 0.0
    for r in recs:
        out[r["inner_global_id"]] = r["out0"]
        if loss != "mean":  # shares of the global objective: they sum to it
            value += r["loss0"]
        elif r["n_train"]:
            value += r["loss0"] * r["n_train"] / total
    return out, value


#: Single-process references computed in this session. A reference depends on the model, the
#: graph (the generated one on the world size), the steps, the input kind and the loss: the
#: matrices compare the same Cora run at every world size and partitioner.
_REFERENCES: dict[tuple, dict] = {}


def reference(config: str, world_size: int, steps: int = 5, sparse: bool = False, loss: str = "mean") -> dict:
    """Plain single-process PyG's run of ``config`` (:func:`~tests.support.models.reference_run`), computed once."""
    kind, depth, graph = config.split(":")
    key = (kind, depth, graph, world_size if graph in WORLD_DEPENDENT else None, steps, sparse, loss)
    if key not in _REFERENCES:
        data = graph_by_name(graph, world_size)
        edges = edges_for(kind, data, sparse)
        _REFERENCES[key] = reference_run(build_any(f"{kind}:{depth}", data), data, steps=steps, edge_index=edges, loss=loss)
    return _REFERENCES[key]


def assert_parity(
    config: str, world_size: int, out: Path, steps: int = 5, sparse: bool = False, loss: str = "mean"
) -> list[dict]:
    """Logits, loss, gradients after one step and parameters after the run equal the reference.

    With ``sparse`` the reference is single-process PyG on the same kind of input: the
    graph's sparse adjacency.
    """
    ref = reference(config, world_size, steps, sparse, loss)
    recs = load_records(config, world_size, out)
    logits, loss_value = assemble(recs, ref["out0"].size(0), loss)
    assert not torch.isnan(logits).any(), f"{config}: some node's logits were produced by no rank"
    torch.testing.assert_close(logits, ref["out0"], **TOL, msg=lambda m: f"{config} logits: {m}")
    assert math.isclose(loss_value, ref["loss0"], rel_tol=1e-9, abs_tol=1e-10), (config, loss_value, ref["loss0"])
    for r, rec in enumerate(recs):
        for name, g in ref["grad0"].items():
            torch.testing.assert_close(rec["grad0"][name], g, **TOL, msg=lambda m: f"{config} rank {r} grad {name}: {m}")
        for name, p in ref["params"].items():
            if name not in ref["grad0"]:
                continue  # unused by the model (PyG's RGATConv leaves some parameters unused, and uninitialised)
            torch.testing.assert_close(rec["params"][name], p, **TOL, msg=lambda m: f"{config} rank {r} param {name}: {m}")
        for name, b in ref["buffers"].items():  # batch norms' running statistics
            torch.testing.assert_close(rec["buffers"][name], b, **TOL, msg=lambda m: f"{config} rank {r} buffer {name}: {m}")
    return recs
