"""lightning_halo.planner.memory: each term against what was measured on real partitions and ranks."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lightning_halo.planner import memory as mem
from lightning_halo.planner.facts import from_counts, from_manifest

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "benchmarks" / "results" / "memory" / "sbm"
RANKS = sorted(MEASURED.glob("train-dir-*-[248].json"))


def _sbm(record: Path):
    """A measured training cell of the memory benchmark and the partitioning it ran on."""
    partitioner, world = record.stem.split("-")[2:4]
    step = json.loads((MEASURED / f"partition-{partitioner}-{world}.json").read_text())
    files = {f"part_{p}.pt": {"bytes": b} for p, b in enumerate(step["part_bytes"])}
    files |= {f"adj_{p}.pt": {"bytes": b} for p, b in enumerate(step["adj_bytes"])}
    manifest = {"num_parts": int(world), "stats": step["stats"], "graph": step["graph_facts"], "files": files}
    return json.loads(record.read_text()), from_manifest(manifest)


def test_the_measured_cells_are_there() -> None:
    assert len(RANKS) == 6, "the SBM training cells of benchmarks.memory (metis/kaminpar x 2/4/8 ranks)"


@pytest.mark.parametrize("record", RANKS, ids=lambda p: p.stem)
def test_each_term_matches_the_measured_rank(record: Path) -> None:
    cell, parts = _sbm(record)
    for r in cell["ranks"]:
        p = r["rank"]
        assert (parts.n_inner[p], parts.n_halo[p]) == (r["n_inner"], r["n_halo"])
        terms = mem.rank_memory(parts, p, "sage", cell["hidden"], 2, idle=r["idle_rss"])
        # the values of the adjacency and its transpose (StoredCSR's nnz, measured) and the halo block: exact or nearly
        assert terms["adjacency"] == pytest.approx(r["adjacency_bytes"], rel=0.01)
        assert terms["halo"] == r["halo_bytes"]
        assert terms["model"] == pytest.approx(r["model_bytes"] + r["grad_bytes"] + r["optimizer_bytes"], rel=1e-3)
        # what autograd saved (saved_tensors_hooks) and the part pages the step touched (smaps)
        assert terms["activations"] == pytest.approx(r["saved_bytes"], rel=0.10)
        assert terms["pages"] == pytest.approx(r["part_pages"], rel=0.10)
        if cell["world"] <= 4:
            assert terms["peak"] == pytest.approx(r["peak_rss"], rel=0.20), "the issue's target: peak within 20 %"
        else:  # 8 real ranks on 2 cores: glibc keeps freed activations (docs/benchmarks.md), documented as missed
            assert 0.75 * r["peak_rss"] < terms["peak"] <= 1.05 * r["peak_rss"]


def test_partition_file_sizes_from_counts_match_the_written_files(cora_dir: Path) -> None:
    from lightning_halo.data.partition_dir import read_manifest

    parts = from_manifest(read_manifest(cora_dir))
    estimated = dataclasses.replace(parts, part_bytes=None, adj_bytes=None)
    for p in range(parts.ranks):
        (part, adj), (part_est, adj_est) = mem.part_file_bytes(parts, p), mem.part_file_bytes(estimated, p)
        assert part_est == pytest.approx(part, rel=0.05) and adj_est == pytest.approx(adj, rel=0.15)


def test_model_parameters_are_the_models_own() -> None:
    from lightning_halo.models import GCN, GraphSAGE

    for cls, name in ((GCN, "gcn"), (GraphSAGE, "sage")):
        for layers in (2, 3):
            model = cls(1433, 7, hidden_channels=64, num_layers=layers)
            dims = mem.layer_dims(1433, 64, layers, 7)
            assert mem.model_params(name, dims) == sum(p.numel() for p in model.parameters()), (name, layers)


def test_pipelined_and_quantized_runs_hold_more_halo() -> None:
    parts = from_counts(100_000, 2_000_000, 32, 4, 4, 0.2)
    sync = mem.rank_memory(parts, 0, "gcn", 128, 3)
    piped = mem.rank_memory(parts, 0, "gcn", 128, 3, mode="pipelined")
    quant = mem.rank_memory(parts, 0, "gcn", 128, 3, wire_row_bytes=21)
    assert piped["halo"] - sync["halo"] == 2 * 2 * parts.n_halo[0] * 128 * 4  # rows and gradients of 2 later layers
    assert quant["halo"] - sync["halo"] == (parts.n_halo[0] + parts.send_rows[0]) * 21
    assert sync["peak"] == sum(v for k, v in sync.items() if k not in ("peak", "part_file", "adjacency_file"))


@pytest.mark.parametrize(
    "record", sorted(MEASURED.parent.glob("*/partition-metis-*.json")), ids=lambda p: p.parent.name + "-" + p.stem
)
def test_the_metis_partition_step_is_within_target(record: Path) -> None:
    rec = json.loads(record.read_text())
    facts = rec["graph_facts"]
    predicted = mem.partition_step_bytes(facts["num_nodes"], facts["num_edges"], "metis", rec["parts"], rec["idle_rss"])
    if "csr_bytes" in rec:  # measured: E counts the few duplicate edges the CSR drops
        assert predicted["csr"] == pytest.approx(rec["csr_bytes"], rel=0.01)
    assert predicted["peak"] == pytest.approx(rec["peak_rss"], rel=0.20)
    with pytest.raises(ValueError, match="no memory formula for partitioner 'random'"):
        mem.partition_step_bytes(10, 10, "random", 2)
