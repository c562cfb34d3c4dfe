"""PyTorch Geometric internals lightning-halo relies on (pinned by ``tests/_compat/test_pyg.py``)."""

from __future__ import annotations

import inspect
from typing import Any, Optional

from torch.nn import Module

_FUSED_BRANCH: dict[type, bool] = {}


def source_arguments(layer: Module) -> list[str]:
    """The names of ``propagate``'s keyword arguments a layer's ``message`` reads at edge sources.

    PyG's convention is the ``_j`` suffix (``x_j``, ``alpha_j``); the parsed names are kept in
    ``MessagePassing._user_args``.

    Example:
        >>> from torch_geometric.nn import GATConv, FAConv
        >>> source_arguments(GATConv(4, 4)), source_arguments(FAConv(4))
        (['x'], ['alpha', 'x'])
    """
    return sorted({a[:-2] for a in layer._user_args if a.endswith("_j")})


def propagate_has_fused_branch(cls: type) -> bool:
    """Whether PyG generated ``cls.propagate`` with its fused (sparse-input) branch.

    PyG generates one ``propagate`` per class from a template when the first instance is built,
    with that instance's ``fuse``: after e.g. ``SAGEConv(aggr=SoftmaxAggregation())`` every later
    ``SAGEConv(aggr="mean")`` of the process has a propagate that raises on a sparse input. The
    generated source says so with this error string.
    """
    if cls not in _FUSED_BRANCH:
        try:
            source = inspect.getsource(cls.propagate)
        except (OSError, TypeError):
            source = ""  # not generated (or no source): PyG's generic propagate checks `fuse` per call
        _FUSED_BRANCH[cls] = "'message_and_aggregate' not implemented" not in source
    return _FUSED_BRANCH[cls]


def clear_layer_caches(layer: Module, names: tuple[str, ...]) -> None:
    """Drop a layer's cached results (``GCNConv._cached_edge_index`` and friends), computed on another graph."""
    for name in names:
        if getattr(layer, name, None) is not None:
            setattr(layer, name, None)


def switch_off(layer: Module, flag: str) -> Any:
    """Turn a layer's own option ``flag`` (e.g. ``GCNConv.normalize``) off; returns its value, for :func:`restore`."""
    value = getattr(layer, flag)
    setattr(layer, flag, False)
    return value


def restore(layer: Module, flag: str, value: Any) -> None:
    """Put back what :func:`switch_off` turned off."""
    setattr(layer, flag, value)


def explicit_num_nodes(data: Any) -> Optional[int]:
    """``data.num_nodes`` if it was set explicitly, else ``None`` (PyG infers it otherwise; ``Data._store``).

    Example:
        >>> from torch_geometric.data import Data
        >>> explicit_num_nodes(Data(x=torch.zeros(3, 1))), explicit_num_nodes(Data(x=torch.zeros(3, 1), num_nodes=4))
        (None, 4)
    """
    store = data._store
    return store["num_nodes"] if "num_nodes" in store else None


def pair_ids(edge_index: Any, num_nodes: "int | tuple[int, int]", force_undirected: bool = False) -> tuple[Any, int]:
    """Node pairs as one id each and the number of possible pairs (PyG's negative-sampling vector).

    ``torch_geometric.utils._negative_sampling.edge_index_to_vector``: the numbering PyG's
    ``negative_sampling`` draws from, so our sampler draws from the same population. An ``int``
    ``num_nodes`` is one node set (self-loops are no pairs); a tuple ``(N_src, N_dst)`` is
    bipartite (two node types: every ``(u, v)`` is a pair), as PyG's ``size`` argument.

    Example:
        >>> pair_ids(torch.tensor([[0, 1], [1, 0]]), 3)
        (tensor([0, 2]), 6)
        >>> pair_ids(torch.tensor([[0, 1], [1, 0]]), (2, 3))
        (tensor([1, 3]), 6)
    """
    from torch_geometric.utils._negative_sampling import edge_index_to_vector

    size, bipartite = _pair_size(num_nodes)
    return edge_index_to_vector(edge_index, size, bipartite, force_undirected and not bipartite)


def pairs_of(ids: Any, num_nodes: "int | tuple[int, int]", force_undirected: bool = False) -> Any:
    """The inverse of :func:`pair_ids`: ``[2, k]`` pairs (with ``force_undirected``, both directions)."""
    from torch_geometric.utils._negative_sampling import vector_to_edge_index

    size, bipartite = _pair_size(num_nodes)
    return vector_to_edge_index(ids, size, bipartite, force_undirected and not bipartite)


def _pair_size(num_nodes: "int | tuple[int, int]") -> tuple[tuple[int, int], bool]:
    if isinstance(num_nodes, (tuple, list)):
        return (int(num_nodes[0]), int(num_nodes[1])), True
    return (int(num_nodes), int(num_nodes)), False
