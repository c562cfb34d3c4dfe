"""Exact normalisation on partitions: the pure functions against PyG's own, on the whole graph.

Each partition's weighted aggregation ``sum_e w_e x_src`` must equal the whole graph's, with
PyG's weights, for its inner nodes. Ranks are threads; the halo degrees travel over the
in-process transport.
"""

from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import ChebConv, ClusterGCNConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.utils import scatter

from lightning_halo.exchange import HaloExchanger
from lightning_halo.layers import normalize
from lightning_halo.partition import build_halo_partitions, partition_graph
from lightning_halo.testing import ThreadGroup
from tests.support.graphs import awkward_graph
from tests.support.threaded import on_threads


def _aggregate(ei, w, x, n):
    return scatter(w.view(-1, 1) * x[ei[0]], ei[1], dim=0, dim_size=n, reduce="sum")


def _on_ranks(data, world_size, fn):
    parts = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, world_size), world_size)
    group = ThreadGroup(world_size, timeout=30)

    def main(r):
        ex = HaloExchanger(group.transport(r) if world_size > 1 else None, bits=32)
        ex.bind(parts[r])
        return fn(ex, parts[r])

    out = on_threads(world_size, main)
    return parts, out


def _check(data, parts, results, ref_ei, ref_w):
    x = torch.randn(data.num_nodes, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    want = _aggregate(ref_ei, ref_w, x, data.num_nodes)
    for part, (ei, w) in zip(parts, results):
        got = _aggregate(ei, w, x[part.global_id], int(part.n_inner))
        torch.testing.assert_close(got, want[part.inner_global_id], atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("improved", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_gcn_weights_equal_gcn_norm(world_size: int, improved: bool, weighted: bool) -> None:
    data = awkward_graph(world_size)  # repeated edges, self-loops, isolated nodes, directed
    w = torch.rand(data.edge_index.size(1), dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    data.edge_weight = w if weighted else None

    def fn(ex, part):
        return normalize.gcn_weights(
            part.edge_index, part.get("edge_weight"), int(part.n_inner), part.num_local_nodes, improved=improved,
            add_self_loops=True, to_halo=lambda v: ex.collectives.to_halo(v, ex.plan(), "t"), dtype=torch.float64,
        )  # fmt: skip

    parts, res = _on_ranks(data, world_size, fn)
    ref_ei, ref_w = gcn_norm(data.edge_index, data.get("edge_weight"), data.num_nodes, improved, True, dtype=torch.float64)
    _check(data, parts, res, ref_ei, ref_w)


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("normalization", ["sym", "rw", None])
@pytest.mark.parametrize("lambda_max", [None, 1.7])
def test_laplacian_weights_equal_chebconv(world_size: int, normalization, lambda_max) -> None:
    data = awkward_graph(world_size)
    w = torch.rand(data.edge_index.size(1), dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    data.edge_weight = w
    cheb = ChebConv(2, 2, K=2, normalization=normalization)

    def fn(ex, part):
        return normalize.laplacian_weights(
            part.edge_index, part.edge_weight, int(part.n_inner), part.num_local_nodes, normalization=normalization,
            lambda_max=lambda_max, to_halo=lambda v: ex.collectives.to_halo(v, ex.plan(), "t"),
            to_owners=lambda v: ex.collectives.to_owners(v, ex.plan(), "t"), global_max=lambda t: ex.collectives.global_max(t, "t"),
            dtype=torch.float64,
        )  # fmt: skip

    parts, res = _on_ranks(data, world_size, fn)
    lam = None if lambda_max is None else torch.tensor(lambda_max, dtype=torch.float64)
    ref_ei, ref_w = cheb.__norm__(data.edge_index, data.num_nodes, w, normalization, lam, dtype=torch.float64)
    _check(data, parts, res, ref_ei, ref_w)


def test_source_degrees_are_global_out_degrees() -> None:
    data = awkward_graph(3)
    ones = torch.ones(data.edge_index.size(1), dtype=torch.float64)

    def fn(ex, part):
        deg = normalize.source_degrees(
            part.edge_index, torch.ones(part.edge_index.size(1), dtype=torch.float64), int(part.n_inner),
            part.num_local_nodes, to_halo=lambda v: ex.collectives.to_halo(v, ex.plan(), "t"),
            to_owners=lambda v: ex.collectives.to_owners(v, ex.plan(), "t"),
        )  # fmt: skip
        return deg, None

    parts, res = _on_ranks(data, 3, fn)
    out_deg = scatter(ones, data.edge_index[0], dim=0, dim_size=data.num_nodes, reduce="sum")
    for part, (deg, _) in zip(parts, res):
        assert torch.equal(deg, out_deg[part.global_id])


def test_cluster_gcn_weights_equal_the_layer() -> None:
    data = awkward_graph(2)
    layer = ClusterGCNConv(2, 2, diag_lambda=0.4)
    # what the layer itself computes on the whole graph (its dense branch), replayed on ones
    from torch_geometric.utils import add_self_loops, degree, remove_self_loops

    ei, _ = remove_self_loops(data.edge_index)
    ei, _ = add_self_loops(ei, num_nodes=data.num_nodes)
    deg_inv = 1.0 / degree(ei[1], num_nodes=data.num_nodes).clamp_(1.0)
    w = deg_inv[ei[1]]
    w[ei[0] == ei[1]] += layer.diag_lambda * deg_inv

    parts, res = _on_ranks(data, 2, lambda ex, part: normalize.cluster_gcn_weights(
        part.edge_index, int(part.n_inner), diag_lambda=0.4, dtype=torch.float64))  # fmt: skip
    _check(data, parts, res, ei, w.double())
