"""KaMinPar: the ParHIP file it reads, its partitions, determinism, the "auto" choice, a missing package."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from lightning_halo.partition import partition_graph, symmetric_csr
from lightning_halo.partition.graph import METIS_FACTOR, assign_parts, choose_partitioner, csr_bytes
from lightning_halo.partition.kaminpar import EPS, KaMinParUnavailableError, parhip_version, run_kaminpar, write_parhip
from tests.support.graphs import awkward_graph, cora


def _read_parhip(path) -> dict:
    """The file, parsed by the layout KaMinPar's reader uses (kaminpar-io/parhip_parser.cc)."""
    raw = np.fromfile(path, dtype=np.uint8)
    version, n, m = (int(v) for v in raw[:24].view(np.uint64))
    offsets = raw[24 : 24 + 8 * (n + 1)].view(np.uint64).astype(np.int64)
    edges_at = 24 + 8 * (n + 1)
    ids = raw[edges_at : edges_at + 4 * m].view(np.uint32).astype(np.int64)
    rest = raw[edges_at + 4 * m :]
    return {"version": version, "n": n, "m": m, "xadj": (offsets - edges_at) // 4, "adjncy": ids,
            "weights": rest.view(np.int64) if rest.size else None}  # fmt: skip


@pytest.mark.parametrize("weights", [False, True])
def test_parhip_file_holds_the_csr_in_kaminpars_layout(tmp_path, weights: bool) -> None:
    data = cora()
    xadj, adjncy = symmetric_csr(data.edge_index, data.num_nodes, index_dtype=torch.int32)
    w = torch.arange(1, data.num_nodes + 1) if weights else None
    size = write_parhip(tmp_path / "g.parhip", torch.from_numpy(xadj), torch.from_numpy(adjncy), w, window=1000)
    got = _read_parhip(tmp_path / "g.parhip")
    assert size == (tmp_path / "g.parhip").stat().st_size == 24 + 8 * (data.num_nodes + 1) + 4 * adjncy.size + 8 * weights * data.num_nodes
    assert got["version"] == parhip_version(weights) and (got["version"] & 2 == 0) == weights  # bit 1 clear: node weights
    assert got["version"] & 8 and not got["version"] & 4  # 32-bit node ids, 64-bit edge offsets
    assert (got["n"], got["m"]) == (data.num_nodes, adjncy.size)
    assert np.array_equal(got["xadj"], xadj) and np.array_equal(got["adjncy"], adjncy)
    assert (got["weights"] is None) if not weights else np.array_equal(got["weights"], w.numpy())


def test_int32_csr_equals_the_int64_one() -> None:
    ei = torch.randint(0, 300, (2, 5000), generator=torch.Generator().manual_seed(1))
    x64, a64 = symmetric_csr(ei, 300, chunk_edges=333)
    x32, a32 = symmetric_csr(ei, 300, chunk_edges=333, index_dtype=torch.int32)
    assert a32.dtype == np.int32 and np.array_equal(x64, x32) and np.array_equal(a64, a32)


def test_bad_parhip_input_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="xadj ends at"):
        write_parhip(tmp_path / "g", torch.tensor([0, 2]), torch.tensor([0]))
    with pytest.raises(ValueError, match="node_weights has 1 entries"):
        write_parhip(tmp_path / "g", torch.tensor([0, 1, 2]), torch.tensor([1, 0]), torch.tensor([1]))
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        partition_graph(cora().edge_index, 2708, 2, partitioner="kaminpar", threads=0)


@pytest.mark.parametrize("num_parts", [2, 3, 4, 8])
def test_kaminpar_partitions_are_balanced_and_cut_like_metis(num_parts: int) -> None:
    data = cora()
    src, dst = data.edge_index
    kp = partition_graph(data.edge_index, data.num_nodes, num_parts, partitioner="kaminpar")
    metis = partition_graph(data.edge_index, data.num_nodes, num_parts, partitioner="metis")
    rand = partition_graph(data.edge_index, data.num_nodes, num_parts, partitioner="random")
    assert kp.shape == (data.num_nodes,) and kp.dtype == torch.long and set(kp.tolist()) == set(range(num_parts))
    sizes = torch.bincount(kp, minlength=num_parts).double()
    assert sizes.max() <= (1 + EPS) * sizes.mean() + 1  # the stated tolerance (one node of rounding)

    def cut(parts: torch.Tensor) -> int:
        return int((parts[src] != parts[dst]).sum())

    assert cut(kp) < 1.5 * cut(metis) and cut(kp) * 3 < cut(rand)


def test_kaminpar_balances_in_edges_when_asked() -> None:
    data = cora()
    parts = partition_graph(data.edge_index, data.num_nodes, 4, partitioner="kaminpar", balance="edges")
    load = torch.zeros(4).index_add_(0, parts, (torch.bincount(data.edge_index[1], minlength=data.num_nodes) + 1).float())
    nodes = torch.bincount(parts, minlength=4).float()
    assert load.max() <= (1 + EPS) * load.mean() + 200  # 200: the largest vertex weight (Cora's max in-degree + 1 is 169)
    assert nodes.max() / nodes.mean() > load.max() / load.mean()  # it balanced the load, not the node count


def test_kaminpar_is_deterministic_for_a_seed_and_the_seed_matters() -> None:
    data = cora()
    runs = [partition_graph(data.edge_index, data.num_nodes, 4, partitioner="kaminpar", seed=s) for s in (3, 3, 4)]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


@pytest.mark.parametrize("num_parts", [1, 2, 3, 7])
def test_every_node_assigned_no_empty_part_on_an_awkward_graph(num_parts: int) -> None:
    data = awkward_graph(1)
    parts = partition_graph(data.edge_index, data.num_nodes, num_parts, partitioner="kaminpar")
    assert set(parts.tolist()) == set(range(num_parts))


def test_kaminpar_edge_cases() -> None:
    assert sorted(partition_graph(torch.empty(2, 0, dtype=torch.long), 5, 2, partitioner="kaminpar").bincount().tolist()) == [2, 3]
    assert sorted(partition_graph(torch.tensor([[0, 1], [1, 0]]), 3, 3, partitioner="kaminpar").tolist()) == [0, 1, 2]


def test_run_kaminpar_reads_the_file_it_is_given(tmp_path) -> None:
    # two triangles joined by one edge: the cut of 2 parts is that edge
    ei = torch.tensor([[0, 1, 2, 3, 4, 5, 2], [1, 2, 0, 4, 5, 3, 3]])
    xadj, adjncy = symmetric_csr(ei, 6, index_dtype=torch.int32)
    write_parhip(tmp_path / "g", torch.from_numpy(xadj), torch.from_numpy(adjncy))
    parts = run_kaminpar(tmp_path / "g", 2).tolist()
    assert parts[0] == parts[1] == parts[2] != parts[3] == parts[4] == parts[5]


def test_auto_compares_metis_predicted_memory_with_the_budget() -> None:
    n, nnz = 1000, 20_000
    need = METIS_FACTOR * csr_bytes(n, nnz)
    assert csr_bytes(n, nnz) == 8 * 1001 + 8 * nnz
    assert choose_partitioner(n, nnz, need) == "metis" and choose_partitioner(n, nnz, need - 1) == "kaminpar"
    data = cora()
    small = assign_parts(data.edge_index, data.num_nodes, 3, partitioner="auto", memory_budget=1 << 40)
    tight = assign_parts(data.edge_index, data.num_nodes, 3, partitioner="auto", memory_budget=1 << 20)
    assert small.partitioner == "metis" and tight.partitioner == "kaminpar"
    nnz_cora = int(symmetric_csr(data.edge_index, data.num_nodes)[1].size)
    assert small.details["metis_predicted_bytes"] == METIS_FACTOR * csr_bytes(data.num_nodes, nnz_cora)
    assert torch.equal(small.parts, partition_graph(data.edge_index, data.num_nodes, 3, partitioner="metis"))
    assert torch.equal(tight.parts, partition_graph(data.edge_index, data.num_nodes, 3, partitioner="kaminpar"))


def test_a_missing_kaminpar_is_named_with_the_alternative(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "kaminpar", None)  # `import kaminpar` now raises ImportError
    data = cora()
    with pytest.raises(KaMinParUnavailableError, match="partitioner='metis'"):
        partition_graph(data.edge_index, data.num_nodes, 2, partitioner="kaminpar")
    assert isinstance(KaMinParUnavailableError("x"), ImportError)
    parts = partition_graph(data.edge_index, data.num_nodes, 2, partitioner="metis")  # unaffected
    assert set(parts.tolist()) == {0, 1}


@pytest.mark.parametrize(
    "num_parts, message",
    [(0, "num_parts must be a positive integer, got 0"), (-2, "got -2"), (2.0, "got 2.0"), (True, "got True"),
     (7, "num_parts=7 exceeds the number of nodes \\(6\\)")],
)  # fmt: skip
def test_run_kaminpar_checks_num_parts_before_it_runs(num_parts: object, message: str, tmp_path, monkeypatch) -> None:
    import lightning_halo.partition.kaminpar as kaminpar

    ei = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    xadj, adjncy = symmetric_csr(ei, 6, index_dtype=torch.int32)
    write_parhip(tmp_path / "g", torch.from_numpy(xadj), torch.from_numpy(adjncy))
    monkeypatch.setattr(kaminpar, "import_kaminpar", lambda: pytest.fail("KaMinPar must not be started"))
    with pytest.raises(ValueError, match=message):
        run_kaminpar(tmp_path / "g", num_parts)  # type: ignore[arg-type]
