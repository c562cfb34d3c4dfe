"""Graphs for tests: bundled Cora and generated graphs with the awkward cases built in."""

from __future__ import annotations

import torch
from torch_geometric.data import Data

from lightning_halo.data.datasets import load_bundled
from lightning_halo.partition import partition_graph


def cora(dtype: torch.dtype = torch.float64) -> Data:
    """The bundled Cora, with seeded edge attributes and relation types for the layers that take them."""
    data = load_bundled("cora")
    data.x = data.x.to(dtype)
    g = torch.Generator().manual_seed(0)
    data.edge_attr = torch.rand(data.edge_index.size(1), 3, generator=g, dtype=dtype)
    data.edge_type = torch.randint(0, 3, (data.edge_index.size(1),), generator=g)
    return data


def awkward_graph(
    world_size: int,
    num_nodes: int = 160,
    num_edges: int = 700,
    num_isolated: int = 12,
    num_features: int = 8,
    num_classes: int = 3,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> Data:
    """A directed random graph with isolated nodes whose last METIS part has no train node.

    Edges are directed (no reverse edges added), duplicates and self-loops occur, the last
    ``num_isolated`` nodes have no edge at all, and the train mask leaves out every node that
    ``partition_graph(..., world_size)`` puts in the last part, so one rank trains on nothing.
    """
    g = torch.Generator().manual_seed(seed)
    active = num_nodes - num_isolated
    src = torch.randint(0, active, (num_edges,), generator=g)
    dst = torch.randint(0, active, (num_edges,), generator=g)
    # some structure so METIS has something to cut: a chain through the active nodes
    chain = torch.arange(active - 1)
    edge_index = torch.cat([torch.stack([src, dst]), torch.stack([chain, chain + 1])], dim=1)
    x = torch.randn(num_nodes, num_features, generator=g, dtype=dtype)
    y = torch.randint(0, num_classes, (num_nodes,), generator=g)
    perm = torch.randperm(num_nodes, generator=g)
    train = torch.zeros(num_nodes, dtype=torch.bool)
    train[perm[: num_nodes // 2]] = True
    val = torch.zeros(num_nodes, dtype=torch.bool)
    val[perm[num_nodes // 2 : 3 * num_nodes // 4]] = True
    test = ~(train | val)
    if world_size > 1:
        parts = partition_graph(edge_index, num_nodes, world_size)
        train &= parts != world_size - 1
    edge_attr = torch.rand(edge_index.size(1), 3, generator=g, dtype=dtype)
    edge_type = torch.randint(0, 3, (edge_index.size(1),), generator=g)
    return Data(
        x=x, edge_index=edge_index, edge_attr=edge_attr, edge_type=edge_type, y=y, train_mask=train, val_mask=val,
        test_mask=test,
    )


#: The graphs of :func:`graph_by_name` built for the world size (the others ignore it).
WORLD_DEPENDENT = frozenset({"awkward"})


def graph_by_name(name: str, world_size: int) -> Data:
    if name == "cora":
        return cora()
    if name == "cora32":
        return cora(torch.float32)
    if name == "awkward":
        return awkward_graph(world_size)
    raise KeyError(name)
