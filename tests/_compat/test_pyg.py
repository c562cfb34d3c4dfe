"""What lightning-halo assumes about PyG's internals (lightning_halo._compat.pyg)."""

from __future__ import annotations

import torch
from torch_geometric.data import Data
from torch_geometric.nn import FAConv, GATConv, GCNConv, MessagePassing, SAGEConv, aggr

from lightning_halo._compat.pyg import (
    clear_layer_caches,
    explicit_num_nodes,
    propagate_has_fused_branch,
    restore,
    source_arguments,
    switch_off,
)


def test_source_arguments_are_the_messages_j_arguments() -> None:
    class Mine(MessagePassing):
        def forward(self, x, edge_index, h):
            return self.propagate(edge_index, x=x, h=h)

        def message(self, x_j, h_i, h_j, edge_weight=None):
            return x_j + h_j - h_i

    assert source_arguments(Mine()) == ["h", "x"]
    assert source_arguments(SAGEConv(4, 4)) == ["x"]
    assert source_arguments(GATConv(4, 4)) == ["x"]  # its attention arrives as one per-edge `alpha`
    assert source_arguments(FAConv(4)) == ["alpha", "x"]


class _Mean(MessagePassing):
    def __init__(self, aggregation="mean"):
        super().__init__(aggr=aggregation)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message_and_aggregate(self, adj_t, x):
        return torch.sparse.mm(adj_t, x, reduce=self.aggr)


class _FusingMean(_Mean):  # PyG generates a class's propagate for its first instance (named by class)
    pass


class _BlockedMean(_Mean):
    pass


def test_the_generated_propagate_says_whether_it_has_its_fused_branch() -> None:
    _FusingMean("mean")
    assert _FusingMean("mean").fuse and propagate_has_fused_branch(_FusingMean)
    _BlockedMean(aggr.SoftmaxAggregation(learn=True))  # its first instance cannot fuse
    later = _BlockedMean("mean")
    assert later.fuse, "the instance would fuse ..."
    assert not propagate_has_fused_branch(_BlockedMean), "... but its class's generated propagate cannot"
    adj = torch.eye(3).to_sparse_csr()
    try:
        later(torch.ones(3, 2), adj)
    except NotImplementedError as err:
        assert "'message_and_aggregate' not implemented" in str(err)
    else:
        raise AssertionError("PyG's generated propagate no longer raises; revisit propagate_has_fused_branch")


def test_cache_names_and_the_normalisation_flag_are_what_gcn_uses() -> None:
    conv = GCNConv(2, 2, cached=True)
    ei = torch.tensor([[0, 1], [1, 0]])
    conv(torch.ones(2, 2), ei)
    assert conv._cached_edge_index is not None
    clear_layer_caches(conv, ("_cached_edge_index", "_cached_adj_t"))
    assert conv._cached_edge_index is None and conv._cached_adj_t is None
    value = switch_off(conv, "normalize")
    assert value is True and conv.normalize is False
    restore(conv, "normalize", value)
    assert conv.normalize is True


def test_explicit_num_nodes_is_only_what_was_set() -> None:
    x = torch.zeros(3, 1)
    assert explicit_num_nodes(Data(x=x)) is None
    assert explicit_num_nodes(Data(x=x, num_nodes=5)) == 5
    d = Data(x=x)
    d.num_nodes = 3
    assert explicit_num_nodes(d) == 3 and d.num_nodes == 3


def test_pair_ids_number_pairs_without_self_loops_and_invert() -> None:
    from lightning_halo._compat.pyg import pair_ids, pairs_of

    n = 5
    every = torch.tensor([(i, j) for i in range(n) for j in range(n) if i != j]).t()
    ids, population = pair_ids(every, n)
    assert population == n * (n - 1) and sorted(ids.tolist()) == list(range(population))
    assert torch.equal(pairs_of(ids, n), every)
    upper = every[:, every[0] < every[1]]
    und, und_population = pair_ids(every, n, force_undirected=True)
    assert und_population == n * (n - 1) // 2 and len(set(und.tolist())) == und_population
    back = pairs_of(torch.unique(und), n, force_undirected=True)
    assert set(map(tuple, back.t().tolist())) == set(map(tuple, every.t().tolist())) and upper.size(1) == und_population
