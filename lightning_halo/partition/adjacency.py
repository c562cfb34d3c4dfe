"""Sparse adjacency of a graph or a partition, for layers that aggregate with a fused spmm."""

from __future__ import annotations

import warnings
from typing import Any, Literal, Optional

import torch
from torch import Tensor

Reduce = Literal["sum", "mean", "max", "min"]


def sparse_adjacency(data: Any, reduce: Reduce = "sum", dtype: Optional[torch.dtype] = None) -> Tensor:
    r"""Transposed adjacency :math:`A^\top` as a ``torch.sparse_csr`` tensor, for ``layer(x, adj_t)``.

    PyG layers with a fused ``message_and_aggregate`` (``SAGEConv``, ``GINConv``,
    ``GCNConv``, ``GraphConv``, ...) then aggregate with one sparse-dense product instead of
    materialising an ``[E, d]`` message tensor. That matters when ``d`` is large: ``SAGEConv``
    aggregates raw input features, e.g. 4,735 columns on cornell5, i.e. 12 GB of messages
    for 650k edges.

    Row :math:`i` lists the in-edges of target :math:`i`. For a
    :class:`~lightning_halo.HaloPartition` the shape is :math:`[n_{in}, n_{in} + n_{halo}]`
    (targets are the inner nodes, sources include the halo), so the layer hook of
    :class:`~lightning_halo.HaloQuantStrategy` passes it through unchanged; for a plain
    :class:`~torch_geometric.data.Data` it is :math:`[N, N]`.

    A CSR matrix stores each (target, source) pair once, while ``edge_index`` may repeat an
    edge. The values are chosen so that PyG's ``spmm(adj_t, x, reduce)`` equals message
    passing over the original, repeated edges:

    .. math::
        v_{ij} = \begin{cases}
            m_{ij} & \text{sum} \\
            m_{ij}\, \mathrm{nnz}_i / \deg_i & \text{mean (spmm divides by } \mathrm{nnz}_i) \\
            1 & \text{max, min}
        \end{cases}

    with :math:`m_{ij}` the multiplicity of edge :math:`j \to i` and :math:`\deg_i` the
    in-degree counted with repeats. Without repeated edges every value is 1. The features must
    have the values' dtype (32 or 64 bit): torch's sparse-dense product has no 16-bit kernels
    for these reductions, so mixed precision needs the ``edge_index`` path.

    Args:
        data (Data or HaloPartition): the graph (needs ``edge_index`` and ``x`` or ``num_nodes``).
        reduce (str, optional): the aggregation of the layer that will consume it: ``"sum"``
            (GIN, GCN, GraphConv), ``"mean"`` (SAGE's default), ``"max"`` or ``"min"``.
            (default: ``"sum"``)
        dtype (torch.dtype, optional): dtype of the values; must equal the features' dtype
            for ``torch.sparse.mm``. (default: ``data.x.dtype``, else ``float32``)

    Returns:
        ``torch.sparse_csr`` tensor on ``edge_index``'s device.

    Shapes:
        - **input:** ``edge_index`` :math:`[2, E]`, sources in :math:`[0, n_{src})`,
          targets in :math:`[0, n_{dst})`
        - **output:** :math:`[n_{dst}, n_{src}]` with at most :math:`E` stored values

    Example:
        >>> adj_t = sparse_adjacency(batch, reduce="mean")  # doctest: +SKIP
        >>> out = SAGEConv(16, 32)(batch.x, adj_t)  # doctest: +SKIP
    """
    if reduce not in ("sum", "mean", "max", "min"):
        raise ValueError(f"reduce must be 'sum', 'mean', 'max' or 'min' (the layer's aggregation), got {reduce!r}")
    edge_index = getattr(data, "edge_index", None)
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError("sparse_adjacency needs data.edge_index as a [2, E] integer tensor")
    n_dst, n_src = _sizes(data)
    if dtype is None:
        x = getattr(data, "x", None)
        dtype = x.dtype if isinstance(x, Tensor) and x.is_floating_point() else torch.float32
    dst, src = edge_index[1].long(), edge_index[0].long()
    if edge_index.numel() and (int(dst.max()) >= n_dst or int(src.max()) >= n_src or int(edge_index.min()) < 0):
        raise ValueError(
            f"edge_index has node ids outside the graph: targets must lie in [0, {n_dst}) and sources in [0, {n_src})"
        )
    # One int64 key per (target, source): sorting it gives CSR order, unique_consecutive the repeats.
    key, counts = torch.unique_consecutive(torch.sort(dst * n_src + src).values, return_counts=True)
    row = torch.div(key, n_src, rounding_mode="floor")
    col = key - row * n_src
    nnz = torch.bincount(row, minlength=n_dst)  # stored entries per row
    values = counts.to(dtype)
    if reduce in ("max", "min"):
        values = torch.ones_like(values)
    elif reduce == "mean":
        deg = torch.bincount(dst, minlength=n_dst)
        values = values * (nnz.to(dtype) / deg.clamp(min=1).to(dtype))[row]
    crow = torch.zeros(n_dst + 1, dtype=torch.long, device=edge_index.device)
    crow[1:] = torch.cumsum(nnz, 0)
    with warnings.catch_warnings():  # torch notes once per process that sparse CSR is "beta"
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        # built sorted and duplicate-free above, so torch's O(nnz) invariant check is skipped
        return torch.sparse_csr_tensor(crow, col, values, size=(n_dst, n_src), check_invariants=False)


def _sizes(data: Any) -> tuple[int, int]:
    """``(targets, sources)``: ``(n_inner, n_inner + n_halo)`` for a partition, ``(N, N)`` otherwise."""
    if getattr(data, "n_halo", None) is not None and getattr(data, "n_inner", None) is not None:
        return int(data.n_inner), int(data.n_inner) + int(data.n_halo)
    n = data.num_nodes
    if n is None:
        raise ValueError("sparse_adjacency needs the number of nodes: set data.x or data.num_nodes")
    return int(n), int(n)
