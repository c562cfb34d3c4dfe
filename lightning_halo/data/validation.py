"""Checks on a user's graph before anything is partitioned: fail early, name the fix."""

from __future__ import annotations

import copy
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

from lightning_halo.partition.chunks import iter_rows
from lightning_halo.partition.halo_partition import RESERVED_KEYS
from lightning_halo.partition.options import MASK_KEYS


class GraphValidationError(ValueError):
    """The input graph cannot be partitioned; the message names the problem and the fix."""


def validate_graph(data: object, *, source: str = "the graph") -> Data:
    r"""Check that ``data`` is a node-classification graph lightning-halo can partition.

    Requirements: a :class:`~torch_geometric.data.Data` with a floating ``x`` ``[N, F]``
    (finite), an integer ``edge_index`` ``[2, E]`` with ids in ``[0, N)``, ``y`` with ``N``
    rows, and boolean ``train_mask`` / ``val_mask`` / ``test_mask`` of length ``N``.
    An ``int32`` ``edge_index`` comes back as ``int64`` in a shallow copy (int32 would overflow
    past :math:`2^{31}` edges downstream); ``data`` itself is never modified. The value checks
    read ``x`` and ``edge_index`` a window at a time, so memory-mapped tensors are never held
    whole.

    Args:
        data (object): the candidate graph.
        source (str, optional): how to name it in error messages (e.g. a file path).

    Returns:
        ``data``, or a shallow copy of it with an ``int64`` ``edge_index``.

    Raises:
        GraphValidationError: naming the first problem found and how to fix it.

    Example:
        >>> validate_graph(Data(x=torch.ones(2, 1)))  # doctest: +SKIP
        GraphValidationError: the graph has no `edge_index` ...
    """
    data = check_graph(data, source=source)
    if data.edge_index.dtype != torch.long:
        data = copy.copy(data)  # the caller's graph keeps its own edge_index
        data.edge_index = data.edge_index.long()
    return data


def is_hetero(data: object) -> bool:
    """Whether ``data`` is a :class:`~torch_geometric.data.HeteroData`."""
    from torch_geometric.data import HeteroData

    return isinstance(data, HeteroData)


def check_graph(data: object, *, source: str = "the graph") -> Data:
    """The checks of :func:`validate_graph`, changing nothing (a memory-mapped graph stays as it is)."""
    if is_hetero(data):
        raise GraphValidationError(
            f"{source} is a HeteroData, and this reads a homogeneous graph (a Data). Give a heterogeneous graph to "
            "HaloDataModule itself (in memory, or a file written with torch.save(hetero_data, path)): it partitions all "
            "node types together (docs: Heterogeneous graphs)."
        )
    if not isinstance(data, Data):
        raise GraphValidationError(
            f"{source} is a {type(data).__name__}, not a torch_geometric.data.Data; pass a Data "
            "(or a path to a file written with torch.save(data, path)). HeteroData is not supported."
        )
    reserved = sorted(k for k in data.to_dict() if k in RESERVED_KEYS)
    if reserved:
        hint = (
            " Every partition batch has `n_id` already: the global ids of its rows, as NeighborLoader's batch.n_id "
            "(on one process torch.arange(num_nodes)); delete data.n_id."
            if "n_id" in reserved
            else ""
        )
        raise GraphValidationError(
            f"{source} has attribute(s) {', '.join(map(repr, reserved))}, name(s) lightning-halo gives to what it adds "
            f"to every partition (ids, exchange plan, halo features, adjacency); rename them before partitioning.{hint}"
        )
    x = data.get("x")
    if not isinstance(x, Tensor):
        raise GraphValidationError(f"{source} has no node features `x`; set data.x to a float tensor [num_nodes, F].")
    if x.dim() != 2:
        raise GraphValidationError(
            f"{source}: `x` must be 2-D [num_nodes, F], got shape {tuple(x.shape)}; use x.view(-1, 1) for one feature."
        )
    if not x.is_floating_point():
        raise GraphValidationError(f"{source}: `x` must be floating point, got {x.dtype}; use data.x = data.x.float().")
    num_nodes = x.size(0)
    if num_nodes == 0:
        raise GraphValidationError(f"{source} has no nodes (x has 0 rows).")
    if "num_nodes" in data._store and data._store["num_nodes"] != num_nodes:
        raise GraphValidationError(
            f"{source}: data.num_nodes={data._store['num_nodes']} but x has {num_nodes} rows; they must agree."
        )
    for start, rows in iter_rows(x):
        finite = torch.isfinite(rows)
        if not finite.all():
            bad = start + int(torch.nonzero(~finite)[0, 0])
            raise GraphValidationError(
                f"{source}: `x` holds NaN or Inf (first at node {bad}); clean the features "
                "(e.g. torch.nan_to_num) before training."
            )

    ei = data.get("edge_index")
    if not isinstance(ei, Tensor):
        raise GraphValidationError(
            f"{source} has no `edge_index`; set data.edge_index to an int64 tensor [2, num_edges]. An adjacency "
            "such as `adj_t` (T.ToSparseTensor) cannot be partitioned: keep edge_index and build the partition's "
            "sparse adjacency in the step with lightning_halo.sparse_adjacency(batch)."
        )
    if ei.dim() != 2 or ei.size(0) != 2:
        raise GraphValidationError(
            f"{source}: `edge_index` must have shape [2, num_edges], got {tuple(ei.shape)}"
            + ("; it looks transposed, use edge_index.t().contiguous()." if ei.dim() == 2 and ei.size(1) == 2 else ".")
        )
    if ei.dtype.is_floating_point or ei.dtype == torch.bool or ei.dtype.is_complex:
        raise GraphValidationError(f"{source}: `edge_index` must be an integer tensor, got {ei.dtype}; use .long().")
    if ei.numel():
        lo, hi = num_nodes, -1
        for _, rows in _edge_windows(ei):
            lo, hi = min(lo, int(rows.min())), max(hi, int(rows.max()))
        if lo < 0 or hi >= num_nodes:
            raise GraphValidationError(
                f"{source}: `edge_index` refers to node {lo if lo < 0 else hi}, outside [0, {num_nodes}) "
                f"(num_nodes is taken from x: {num_nodes} rows). Fix the edge list or x."
            )

    y = data.get("y")
    if not isinstance(y, Tensor):
        raise GraphValidationError(f"{source} has no labels `y`; set data.y to a tensor with {num_nodes} rows.")
    if y.dim() == 0 or y.size(0) != num_nodes:
        raise GraphValidationError(
            f"{source}: `y` has {y.size(0) if y.dim() else 0} rows but there are {num_nodes} nodes; "
            "node-level labels are required."
        )

    for key in MASK_KEYS:
        mask = data.get(key)
        if not isinstance(mask, Tensor):
            raise GraphValidationError(
                f"{source} has no `{key}`; set it to a bool tensor [{num_nodes}] "
                f"(an empty split is fine: torch.zeros({num_nodes}, dtype=torch.bool))."
            )
        if mask.dtype != torch.bool:
            raise GraphValidationError(
                f"{source}: `{key}` must be a bool mask, got {mask.dtype}; for an index tensor use "
                f"torch_geometric.utils.index_to_mask({key}, size={num_nodes})."
            )
        if mask.dim() != 1 or mask.size(0) != num_nodes:
            hint = (
                f"; it holds several splits, pick one, e.g. data.{key} = data.{key}[:, 0]."
                if mask.dim() == 2 and mask.size(0) == num_nodes
                else "."
            )
            raise GraphValidationError(
                f"{source}: `{key}` has shape {tuple(mask.shape)} but must be [{num_nodes}] (one entry per node){hint}"
            )
    check_attribute_types(data._store, source, num_nodes, int(ei.size(1)))
    return data


def check_attribute_types(store: Any, source: str, num_nodes: int, num_edges: Optional[int]) -> None:
    """Refuse attributes a partition cannot carry as PyG means them: a list or tuple with one entry per node or edge
    (PyG's ``is_node_attr``/``is_edge_attr`` count them as node or edge attributes, and slice them in ``subgraph``; a
    partition would hand every rank the whole list, in the whole graph's order), and any NumPy array (the partition
    cache stores tensors; PyG also counts arrays as node or edge attributes).

    Args:
        store: the attributes (a ``Data``'s store, or one type's store of a ``HeteroData``), name -> value.
        source (str): how errors name the graph (and the type).
        num_nodes (int): the store's node count (``0``: an edge store).
        num_edges (int, optional): the store's edge count (``None``: a node store).

    Example:
        >>> check_attribute_types({"names": ["a", "b"]}, "the graph", 2, 5)
        Traceback (most recent call last):
        ...
        lightning_halo.data.validation.GraphValidationError: the graph: `names` is a list with one entry per node...
    """
    for key, value in store.items():
        if isinstance(value, np.ndarray):
            raise GraphValidationError(
                f"{source}: `{key}` is a NumPy array; partitions carry tensors (PyG treats an array with one row per "
                "node or edge as node or edge data). Convert it with torch.from_numpy, or delete it before partitioning."
            )
        if not isinstance(value, (list, tuple)) or key in ("edge_type_names", "node_type_names"):
            continue
        level = "node" if num_nodes and len(value) == num_nodes else "edge" if num_edges and len(value) == num_edges else None
        if level is not None:
            kind = type(value).__name__
            lookup = " and look its entries up by global id (batch.n_id)" if level == "node" else ""
            raise GraphValidationError(
                f"{source}: `{key}` is a {kind} with one entry per {level}. PyG treats it as {level} data, but a "
                f"partition would give every rank the whole {kind} in the whole graph's order, not its own {level}s'. "
                f"Store it as a tensor (e.g. an index into the {kind}), or delete it before partitioning{lookup}."
            )


def _edge_windows(ei: Tensor):  # noqa: ANN202
    for row in ei:  # sources, then targets
        yield from iter_rows(row)


def infer_num_classes(y: Tensor) -> int:
    """Classes of ``y``: ``max + 1`` for integer labels (``-1`` = unlabelled), columns for 2-D targets."""
    if y.dim() > 1 and y.size(1) > 1:
        return int(y.size(1))
    y = y.view(-1)
    if y.is_floating_point():
        y = y[~torch.isnan(y)]
    return int(y.max()) + 1 if y.numel() else 0
