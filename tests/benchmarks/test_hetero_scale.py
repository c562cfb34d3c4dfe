"""benchmarks.hetero_scale's arithmetic: the fused adjacencies' share of the memory bound, and the report."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import hetero_scale
from lightning_halo.partition.hetero import assign_hetero_parts, build_hetero_partitions
from tests.support.hetero import generated_hetero


def test_the_adjacency_bytes_count_each_relation_the_model_reads_once() -> None:
    data = generated_hetero()
    part = build_hetero_partitions(data, assign_hetero_parts(data, 2))[0]
    num_features = {t: int(data[t].x.size(1)) if "x" in data[t] else 0 for t in data.node_types}
    from lightning_halo.models import HeteroNodeClassifier

    model = HeteroNodeClassifier(3, data.metadata(), num_features, {t: int(data[t].num_nodes) for t in data.node_types},
                                 "paper", hidden_channels=8, featureless="type")  # fmt: skip
    read = {e for conv in model.convs for e in conv.convs.keys()}
    want = 0
    for src, rel, dst in read:
        pairs = {(int(d), int(s)) for s, d in part[src, rel, dst].edge_index.t().tolist()}  # distinct (target, source)
        n_src, n_dst = int(part[src].num_nodes), int(part[dst].n_inner)
        want += 2 * len(pairs) * 4 + 4 * (n_dst + 1 + len(pairs)) + 4 * (n_src + 1 + len(pairs))
    assert read and hetero_scale.relation_adjacency_bytes(part, model) == want


def test_the_report_compares_like_with_like(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hetero_scale, "RESULTS", tmp_path)

    def run(bits: int, rate: str, epochs: list[float], sent: int, phase: str = "", **extra) -> dict:
        rank = {"epoch_s": epochs, "traffic": [{"convs.1.convs[paper]/fwd": sent}], "peak_rss": 3 * 10**9,
                "idle_rss": 10**9, "bound": 10**9, **({"peak_phase": phase} if phase else {})}  # fmt: skip
        return {"ranks": 2, "bits": bits, "rate": rate, "records": [rank, rank], **extra}

    for name, rec in {"train-2r-b32-100mbit": run(32, "100mbit", [9.0, 6.0, 8.0], 320),
                      "train-2r-b1-100mbit": run(1, "100mbit", [5.0, 2.0, 2.0], 10),
                      "train-2r-b32-local-sums": run(32, "local", [4.0, 3.0, 3.0], 20, halo_reduction="cover",
                                                     phase="backward"),
                      "train-2r-b32-100mbit-partial-sums": run(32, "100mbit", [9.0, 4.0, 5.0], 2_000_000, halo_reduction="cover"),
                      "train-2r-b1-100mbit-partial-sums": run(1, "100mbit", [5.0, 2.5, 2.5], 100_000, halo_reduction="cover"),
                      "single-1core": {"epoch_s": [30.0, 20.0, 20.0], "peak_rss": 4 * 10**9}}.items():  # fmt: skip
        (tmp_path / f"{name}.json").write_text(json.dumps(rec))
    text = hetero_scale.markdown()
    assert "1-bit sync is 3.50 x faster than 32-bit sync (7.00 s vs 2.00 s per epoch)" in text, text
    # a record without the field predates partial sums on heterogeneous partitions: it fetched every row
    assert "| 2 ranks, 32 bits, 100mbit, every row | 7.00 s | 0.0 | 2.00 GB | 1.00 GB | 2.00 | – |" in text, text
    assert "| 2 ranks, 32 bits, local, partial sums | 3.00 s | 0.0 | 2.00 GB | 1.00 GB | 2.00 | backward |" in text, text
    assert "10.00 x faster than one process on one core" in text
    assert ("With partial sums (both widths), 1-bit sync is 1.80 x faster than 32-bit sync (4.50 s vs 2.50 s per epoch; "
            "2.0 and 0.1 MB per epoch per rank)") in text, text
