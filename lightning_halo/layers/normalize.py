r"""Edge weights of normalising layers, computed on a partition exactly as on the whole graph.

Pure functions. A partition holds every in-edge of its inner nodes, in *canonical*
orientation: ``edge_index[0]`` are sources (inner or halo, local ids in
:math:`[0, n_{src})`), ``edge_index[1]`` targets (inner, :math:`[0, n_{in})`). Normalisations
that read the degree of a *source* cannot be computed from local edges alone; the caller
passes the two exact exchanges they need:

* ``to_halo(values_inner) -> values_halo``: the owners' values of the halo nodes (forward);
* ``to_owners(partial_halo) -> sums_inner``: per inner node, the sum of the partial values
  the peers computed for it as *their* halo node (the reverse direction, as for gradients).

Example:
    >>> ei = torch.tensor([[1, 0], [0, 1]])  # one partition = the whole graph: no halo
    >>> _, w = gcn_weights(ei, None, 2, 2, improved=False, add_self_loops=True, to_halo=lambda v: v[:0])
    >>> [round(v, 6) for v in w.tolist()]  # both degrees are 2 (one edge and the self-loop): 1/sqrt(2*2)
    [0.5, 0.5, 0.5, 0.5]
"""

from __future__ import annotations

from typing import Callable, Literal, Optional

import torch
from torch import Tensor
from torch_geometric.utils import add_remaining_self_loops, scatter

Exchange = Callable[[Tensor], Tensor]


def _inv_sqrt(deg: Tensor) -> Tensor:
    out = deg.pow(-0.5)
    return out.masked_fill_(torch.isinf(out), 0.0)


def gcn_weights(
    edge_index: Tensor,
    edge_weight: Optional[Tensor],
    n_inner: int,
    n_src: int,
    *,
    improved: bool,
    add_self_loops: bool,
    to_halo: Exchange,
    loops: Literal["remaining", "all"] = "remaining",
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    r"""GCN's symmetric normalisation :math:`\hat D^{-1/2} \hat A \hat D^{-1/2}` of a partition.

    Equals ``torch_geometric.nn.conv.gcn_conv.gcn_norm`` on the whole graph, restricted to the
    edges into inner nodes. An inner node's degree is complete locally (all its in-edges are
    here); a halo node's comes from its owner through ``to_halo``.

    Args:
        edge_index (Tensor): ``[2, E]`` canonical local edges.
        edge_weight (Tensor, optional): ``[E]`` weights (default 1).
        n_inner (int): inner nodes (targets).
        n_src (int): local nodes, inner + halo (sources).
        improved (bool): self-loop weight 2 instead of 1 (``GCNConv(improved=True)``).
        add_self_loops (bool): add self-loops first.
        to_halo (callable): inner degrees ``[n_inner]`` to halo degrees ``[n_src - n_inner]``.
        loops (str, optional): ``"remaining"``: a node's existing self-loop is kept, as PyG does
            for an ``edge_index``; ``"all"``: a loop is added to every node even where one
            exists, as PyG does for a ``torch.sparse`` adjacency. (default: ``"remaining"``)
        dtype (torch.dtype, optional): dtype of the weights. (default: ``torch.float32``)

    Returns:
        ``(edge_index, weights)``: the edges with the inner nodes' self-loops, and their weights.
    """
    fill = 2.0 if improved else 1.0
    ei, ew = edge_index, edge_weight
    if add_self_loops:
        if loops == "remaining":
            ei, ew = add_remaining_self_loops(ei, ew, fill, n_inner)
        else:
            loop = torch.arange(n_inner, device=ei.device)
            ei = torch.cat([ei, torch.stack([loop, loop])], dim=1)
            if ew is not None:
                ew = torch.cat([ew, ew.new_full((n_inner,), fill)])
            else:
                ew = torch.cat([torch.ones(edge_index.size(1), dtype=dtype, device=ei.device),
                                torch.full((n_inner,), fill, dtype=dtype, device=ei.device)])  # fmt: skip
    ew = torch.ones(ei.size(1), dtype=dtype, device=ei.device) if ew is None else ew.to(dtype)
    deg_inner = scatter(ew, ei[1], dim=0, dim_size=n_inner, reduce="sum")
    dis = _inv_sqrt(torch.cat([deg_inner, to_halo(deg_inner)]))
    return ei, dis[ei[0]] * ew * dis[ei[1]]


def source_degrees(
    edge_index: Tensor,
    edge_weight: Tensor,
    n_inner: int,
    n_src: int,
    *,
    to_halo: Exchange,
    to_owners: Exchange,
) -> Tensor:
    r"""Out-degree (weighted) of every local node over the *whole* graph, ``[n_src]``.

    Every edge :math:`u \to v` lives on the partition of :math:`v`, so each partition holds a
    part of its sources' out-degrees: the halo nodes' parts are summed by their owners
    (``to_owners``), and the totals sent back to the partitions that hold them as halo
    (``to_halo``).
    """
    partial = scatter(edge_weight, edge_index[0], dim=0, dim_size=n_src, reduce="sum")
    inner = partial[:n_inner] + to_owners(partial[n_inner:])
    return torch.cat([inner, to_halo(inner)])


def _laplacian_entries(
    ei: Tensor, ew: Tensor, deg: Tensor, n_inner: int, normalization: Optional[Literal["sym", "rw"]]
) -> tuple[Tensor, Tensor]:
    """The Laplacian's off-diagonal entries (one per edge, no self-loops) and its inner nodes' diagonal."""
    src, dst = ei[0], ei[1]
    ones = torch.ones(n_inner, dtype=ew.dtype, device=ei.device)
    if normalization == "sym":
        dis = _inv_sqrt(deg)
        return -dis[src] * ew * dis[dst], ones
    if normalization == "rw":
        inv = 1.0 / deg
        inv.masked_fill_(torch.isinf(inv), 0.0)
        return -inv[src] * ew, ones
    return -ew, deg[:n_inner]


def laplacian_weights(
    edge_index: Tensor,
    edge_weight: Optional[Tensor],
    n_inner: int,
    n_src: int,
    *,
    normalization: Optional[Literal["sym", "rw"]],
    lambda_max: Optional[float],
    to_halo: Exchange,
    to_owners: Exchange,
    global_max: Exchange,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    r"""``ChebConv``'s scaled Laplacian :math:`\frac{2}{\lambda_{max}} L - I` of a partition.

    Equals ``ChebConv.__norm__`` (``get_laplacian``, then scaling) on the whole graph,
    restricted to the edges into inner nodes. The degrees are those of the *sources*
    (``get_laplacian`` sums weights over ``edge_index[0]``), i.e. global out-degrees
    (:func:`source_degrees`).

    Args:
        edge_index (Tensor): ``[2, E]`` canonical local edges.
        edge_weight (Tensor, optional): ``[E]`` weights (default 1).
        n_inner (int): inner nodes.
        n_src (int): inner + halo nodes.
        normalization (str, optional): ``None`` (:math:`L = D - A`), ``"sym"`` or ``"rw"``.
        lambda_max (float, optional): largest eigenvalue used for the scaling; ``None``: twice
            the largest Laplacian entry of the whole graph, as PyG computes it.
        to_halo (callable): see the module docstring.
        to_owners (callable): see the module docstring.
        global_max (callable): a 0-d tensor to its maximum over all ranks.
        dtype (torch.dtype, optional): dtype of the weights. (default: ``torch.float32``)

    Returns:
        ``(edge_index, weights)`` with the inner nodes' self-loops appended.
    """
    keep = edge_index[0] != edge_index[1]
    ei = edge_index[:, keep]
    ew = torch.ones(ei.size(1), dtype=dtype, device=ei.device) if edge_weight is None else edge_weight[keep].to(dtype)
    deg = source_degrees(ei, ew, n_inner, n_src, to_halo=to_halo, to_owners=to_owners)
    off, diag = _laplacian_entries(ei, ew, deg, n_inner, normalization)
    loop = torch.arange(n_inner, device=ei.device)
    out_ei = torch.cat([ei, torch.stack([loop, loop])], dim=1)
    w = torch.cat([off, diag])
    if lambda_max is None:  # every Laplacian entry lives on exactly one partition
        local = w.max() if w.numel() else torch.tensor(float("-inf"), dtype=dtype, device=w.device)
        lam: Tensor | float = 2.0 * global_max(local)
    else:
        lam = lambda_max
    w = (2.0 * w) / lam
    w.masked_fill_(torch.isinf(w), 0.0)
    w[ei.size(1):] -= 1.0
    return out_ei, w


def cluster_gcn_weights(
    edge_index: Tensor, n_inner: int, *, diag_lambda: float, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    r"""``ClusterGCNConv``'s weights (with ``add_self_loops=True``) of a partition.

    :math:`w_{ij} = 1/\deg_i` plus :math:`\lambda/\deg_i` on the self-loop, with the target's
    in-degree counting its one self-loop: local, no exchange needed.
    PyG computes these weights in the default float dtype (``degree``'s default), whatever
    the features' dtype; so does this function, so that both agree to the last bit.
    """
    keep = edge_index[0] != edge_index[1]
    loop = torch.arange(n_inner, device=edge_index.device)
    ei = torch.cat([edge_index[:, keep], torch.stack([loop, loop])], dim=1)
    deg = torch.bincount(ei[1], minlength=n_inner).to(torch.get_default_dtype())
    inv = 1.0 / deg.clamp(min=1.0)
    w = inv[ei[1]]
    if n_inner:
        w[-n_inner:] += diag_lambda * inv
    return ei, w.to(dtype)
