"""Fused adjacencies from a partition's stored CSR equal the ones built from its edges, product and gradient."""

from __future__ import annotations

import pytest
import torch
from torch_geometric import nn as gnn

from lightning_halo.layers.apply import join, layer_edges
from lightning_halo.layers.call import build_call
from lightning_halo.layers.fused import FusedAdjacency
from lightning_halo.layers.normalize import gcn_weights
from lightning_halo.layers.registry import layer_spec
from lightning_halo.layers.stored import StoredCSR
from lightning_halo.partition import build_halo_partitions
from tests.layers.test_apply import _setup
from tests.support.graphs import awkward_graph


def _parts(num_parts: int = 3):
    data = awkward_graph(1)  # duplicates, self-loops, isolated nodes
    assignment = torch.randint(0, num_parts, (data.num_nodes,), generator=torch.Generator().manual_seed(1))
    return build_halo_partitions(data, assignment, num_parts)


def _product_and_grad(adj: FusedAdjacency, x: torch.Tensor, reduce: str) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    out = adj.matmul_reduce(x, reduce)
    out.backward(torch.arange(out.numel(), dtype=out.dtype).view_as(out).sin())
    return out.detach(), x.grad


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("extra_rows", [0, 3])
def test_raw_adjacency_equals_the_built_one(reduce: str, weighted: bool, extra_rows: int) -> None:
    for part in _parts():
        stored = StoredCSR.of(part)
        assert stored is not None
        ei, n_inner, n_src = part.edge_index, int(part.n_inner), stored.n_src
        w = torch.rand(ei.size(1), dtype=torch.float64, generator=torch.Generator().manual_seed(2)) if weighted else None
        n_dst = n_inner + extra_rows
        got = stored.raw(w, reduce, n_dst, torch.float64)
        want = FusedAdjacency.build(ei, w, n_dst, n_src, reduce, torch.float64)
        assert got is not None and got.shape == want.shape == (n_dst, n_src)
        x = torch.randn(n_src, 5, dtype=torch.float64)
        for a, b in zip(_product_and_grad(got, x, reduce), _product_and_grad(want, x, reduce)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_max_is_left_to_the_build_path() -> None:
    stored = StoredCSR.of(_parts()[0])
    assert stored is not None and stored.raw(None, "max", stored.n_inner, torch.float32) is None


@pytest.mark.parametrize("self_loops", [False, True])
def test_normalized_adjacency_equals_the_built_one(self_loops: bool) -> None:
    part = _parts(1)[0]
    stored = StoredCSR.of(part)
    assert stored is not None
    n = int(part.n_inner)
    ei, w = gcn_weights(part.edge_index, None, n, n, improved=False, add_self_loops=self_loops,
                        to_halo=lambda t: t[:0], dtype=torch.float64)  # fmt: skip
    got = stored.normalized(part.edge_index, ei, w, n, self_loops)
    want = FusedAdjacency.build(ei, w, n, n, "sum", torch.float64)
    assert got is not None
    torch.testing.assert_close(got.to_dense(), want.to_dense(), rtol=1e-12, atol=1e-12)
    x = torch.randn(n, 4, dtype=torch.float64)
    for a, b in zip(_product_and_grad(got, x, "sum"), _product_and_grad(want, x, "sum")):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # weights that are not gcn_weights' layout of these edges are refused, not misplaced
    assert stored.normalized(part.edge_index, ei.flip(0), w, n, self_loops) is None


def test_changed_edges_have_no_stored_csr() -> None:
    part = _parts()[0]
    part.edge_index = part.edge_index[:, 1:]
    assert StoredCSR.of(part) is None


def test_layers_get_the_stored_adjacency_and_its_transpose() -> None:
    part, ex, edges = _setup()
    assert edges.sets["in"].stored is not None
    for conv in (gnn.GCNConv(8, 4).double(), gnn.SAGEConv(8, 4).double(), gnn.GraphConv(8, 4).double()):
        arguments = {"x": part.x, "edge_index": part.edge_index}
        call = build_call("conv", conv, layer_spec(conv), arguments, edges, "auto")
        got = layer_edges(call, part.edge_index, edges, ex.collectives, ex.plan(call.direction)).edge_index
        assert isinstance(got, FusedAdjacency)
        # the stored pattern holds every inner diagonal entry, a built one only the edges'
        assert got._nnz() == StoredCSR.of(part).nnz  # type: ignore[union-attr]


def test_the_first_layer_input_is_a_view_of_the_part_file_tensor() -> None:
    part = _parts()[0]
    rows = join(part.x, part.halo_x)
    assert rows.data_ptr() == part.x.data_ptr() and torch.equal(rows, torch.cat([part.x, part.halo_x]))
    grad_x = part.x.clone().requires_grad_(True)
    assert join(grad_x, part.halo_x).data_ptr() != grad_x.data_ptr(), "a copy where autograd needs one"
    moved = part.to("cpu")
    assert moved.x is part.x, "an unchanged .to() keeps the very tensors (caches key on them)"
