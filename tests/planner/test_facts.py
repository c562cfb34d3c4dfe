"""lightning_halo.planner.facts: counts from a manifest, a partitioned graph, or estimates."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_halo.planner.facts import expected_halo, from_counts, from_graph, from_manifest


def test_a_manifest_gives_the_partitions_own_counts(cora_dir: Path) -> None:
    from lightning_halo.data.partition_dir import load_part, read_manifest

    manifest = read_manifest(cora_dir)
    parts = from_manifest(manifest)
    assert parts.ranks == 2 and parts.source == "manifest" and not parts.graph_in_memory
    assert (parts.num_nodes, parts.num_features, parts.num_classes) == (2708, 1433, 7)
    for p in range(2):
        part = load_part(cora_dir, manifest, p)
        assert (parts.n_inner[p], parts.n_halo[p], parts.edges[p]) == (
            part.n_inner,
            part.n_halo,
            part.edge_index.size(1),
        )
        assert parts.send_rows[p] == int(part.send_counts.sum())
        assert parts.part_bytes[p] == (cora_dir / f"part_{p}.pt").stat().st_size


def test_a_graph_is_partitioned_into_the_cache_once(tmp_path: Path, cora_dir: Path) -> None:
    from lightning_halo.data.partition_dir import read_manifest

    parts = from_graph("cora", 2, cache_dir=str(tmp_path))
    assert parts.source == "partitioned" and parts.graph_in_memory, "a graph given by name is loaded by every rank"
    assert parts.n_halo == from_manifest(read_manifest(cora_dir)).n_halo, "the same partitions as the directory's"
    assert from_graph(str(cora_dir), 2).source == "manifest"


def test_estimates_from_counts() -> None:
    parts = from_counts(1_000_000, 20_000_000, 128, 10, 4, 0.1)
    assert parts.ranks == 4 and parts.n_inner == [250_000] * 4 and parts.edges == [5_000_000] * 4
    cut = 0.1 * 5_000_000
    assert parts.n_halo[0] == round(expected_halo(cut, 750_000)) and parts.n_halo[0] < min(cut, 750_000)
    assert parts.source == "estimate" and "10 % of edges cut (assumed)" in parts.note
    assert from_counts(1000, 5000, 8, 2, 1, 0.5).n_halo == [0], "one rank has no halo"
    assert expected_halo(0, 10) == 0.0 and expected_halo(1e9, 10) == pytest.approx(10)
    with pytest.raises(ValueError, match=r"cut_ratio must be in \[0, 1\]"):
        from_counts(1000, 5000, 8, 2, 2, 1.5)


def test_a_heterogeneous_graph_is_refused_with_the_reason(tmp_path) -> None:
    import pytest

    from lightning_halo.planner.facts import from_graph
    from tests.support.hetero import generated_hetero

    with pytest.raises(ValueError, match="homogeneous graphs only so far"):
        from_graph(generated_hetero(), 2, cache_dir=str(tmp_path))
