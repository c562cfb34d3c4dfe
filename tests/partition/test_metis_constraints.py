"""METIS with several balance constraints through pymetis' METIS: one constraint is pymetis' own partition node for
node, two keep both weights balanced, bad weights are refused naming the problem."""

from __future__ import annotations

import numpy as np
import pymetis
import pytest
import torch

from lightning_halo.partition.graph import assign_parts, symmetric_csr
from lightning_halo.partition.metis_constraints import part_graph_constraints


def _graph(n: int, degree: int, seed: int) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    gen = torch.Generator().manual_seed(seed)
    edges = torch.randint(0, n, (2, n * degree), generator=gen)
    xadj, adjncy = symmetric_csr(edges, n)
    return edges, xadj, adjncy


@pytest.mark.parametrize(("n", "parts"), [(300, 2), (500, 3), (700, 8), (900, 9), (1200, 16)])
@pytest.mark.parametrize("seed", [0, 7])
def test_one_constraint_partitions_as_pymetis_does(n: int, parts: int, seed: int) -> None:
    # the same METIS, called through its C API: same options (seed), same algorithm (recursive up to 8 parts)
    _, xadj, adjncy = _graph(n, 4, seed)
    weights = 1 + np.arange(n, dtype=np.int64) % 3
    _, expected = pymetis.part_graph(parts, adjacency=pymetis.CSRAdjacency(xadj, adjncy), vweights=weights,
                                     options=pymetis.Options(seed=seed))  # fmt: skip
    ours = part_graph_constraints(xadj, adjncy, weights, parts, seed)
    assert ours.dtype == np.int64 and np.array_equal(ours, np.asarray(expected))


@pytest.mark.parametrize("parts", [2, 3, 4, 8, 12])
def test_two_constraints_balance_both_weights(parts: int) -> None:
    n = 2000
    _, xadj, adjncy = _graph(n, 5, parts)
    # a labelled type concentrated on low ids, which a node balance alone would not spread
    labelled = (np.arange(n) < 400).astype(np.int64)
    out = part_graph_constraints(xadj, adjncy, np.stack([np.ones(n, dtype=np.int64), labelled], 1), parts, 0)
    assert set(out.tolist()) == set(range(parts))
    for column in (np.ones(n), labelled):
        load = np.bincount(out, weights=column, minlength=parts)
        # METIS' default imbalance is 1.03 per constraint; a part's share is whole nodes
        assert load.max() <= 1.03 * column.sum() / parts + 1, (parts, load.tolist())


def test_bad_weights_are_refused() -> None:
    _, xadj, adjncy = _graph(50, 3, 0)
    with pytest.raises(ValueError, match=r"weights must be \[num_nodes=50, ncon\], got \[49, 2\]"):
        part_graph_constraints(xadj, adjncy, np.ones((49, 2), dtype=np.int64), 2)
    with pytest.raises(ValueError, match="non-negative weights summing to more than zero; column sums: \\[50, 0\\]"):
        part_graph_constraints(xadj, adjncy, np.stack([np.ones(50), np.zeros(50)], 1).astype(np.int64), 2)
    with pytest.raises(ValueError, match="num_parts must be at least 2"):
        part_graph_constraints(xadj, adjncy, np.ones(50, dtype=np.int64), 1)


def test_assign_parts_passes_the_second_constraint_to_metis_only() -> None:
    n = 1500
    edges, _, _ = _graph(n, 4, 3)
    members = torch.arange(n) < 300
    a = assign_parts(edges, n, 4, constraint=members)
    assert a.details["constraints"] == 2
    assert int(torch.bincount(a.parts[members], minlength=4).max()) <= 1.03 * 300 / 4 + 1
    assert assign_parts(edges, n, 4).details["constraints"] == 1
    none = assign_parts(edges, n, 4, constraint=torch.zeros(n, dtype=torch.long))
    assert (
        none.details["constraints"] == 1 and none.details["constraints_why"] == "the second constraint weighs nothing"
    )
    assert "constraints" not in assign_parts(edges, n, 4, partitioner="kaminpar", constraint=members).details
    with pytest.raises(ValueError, match=r"constraint must be \[num_nodes=1500\] non-negative weights, got \[3\]"):
        assign_parts(edges, n, 4, constraint=torch.ones(3))
