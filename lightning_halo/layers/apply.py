r"""Applying a :class:`~lightning_halo.layers.call.LayerCall`: node features with their halo, and the edges.

The forward pre-hook gives the layer

* its node features with the halo rows appended (:func:`with_halo`; the rows are fetched
  from their owners, differentiably), except for ``"steps"`` layers, whose halo is fetched
  before every propagation (:mod:`lightning_halo.layers.propagate`);
* edges that compute the whole-graph result on the partition (:func:`layer_edges`): globally
  normalised weights where the layer normalises, a
  :class:`~lightning_halo.layers.fused.FusedAdjacency` where it aggregates with the fused
  kernel, the canonical edges (flipped for ``flow="target_to_source"``) otherwise;
* those edges in its arguments (:func:`rewrite_arguments`).

Normalised weights and fused adjacencies are computed once per edge set and kept while the
weights they come from are the same, unchanged tensors (the edge set's
:class:`~lightning_halo.memo.TensorMemo`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional

import torch
from torch import Tensor

from lightning_halo.errors import internal_error
from lightning_halo.exchange import Collectives, ExchangePlan, HaloExchanger
from lightning_halo.exchange.cover import CoverRoute
from lightning_halo.layers import normalize
from lightning_halo.layers.call import LayerCall
from lightning_halo.layers.edges import EdgeSet, PartitionEdges
from lightning_halo.layers.fused import FusedAdjacency
from lightning_halo.layers.reduction import covered_adjacency
from lightning_halo.layers.registry import LayerSpec, Normalization
from lightning_halo.partition.adjacency import Reduce
from lightning_halo.partition.halo_partition import stacked_view


@dataclass(frozen=True)
class LayerEdges:
    """What a layer gets as its edges (an ``edge_index``, a sparse adjacency) and per-edge weights."""

    edge_index: Any
    weight: Optional[Tensor] = None


def with_halo(x: Any, feed: str, fetch: Callable[[Tensor], Tensor]) -> Any:
    """The node features as the layer takes them: ``[x; halo]``, ``([x; halo], x)``, or ``x`` for ``"steps"``."""
    if feed == "steps":
        return x  # its halo is fetched before every propagation instead
    if isinstance(x, Tensor):
        full = join(x, fetch(x))
        return (full, x) if feed == "bipartite" else full
    x_src, x_dst = x
    return (join(x_src, fetch(x_src)), x_dst)


def join(x: Tensor, halo: Tensor) -> Tensor:
    """``[x; halo]``: a view when neither needs a gradient and the halo follows ``x`` in memory
    (a partition's ``x`` and its stored ``halo_x``: no copy of the input features), else a copy."""
    if not (x.requires_grad or halo.requires_grad):
        view = stacked_view(x, halo)
        if view is not None:
            return view
    return torch.cat([x, halo], dim=0)


def normalized_edges(
    call: LayerCall, norm: Normalization, edges: PartitionEdges, collectives: Collectives, plan: ExchangePlan
) -> tuple[Tensor, Tensor]:
    """The layer's normalised edges on this partition, ``(edge_index, weights)`` (kept per edge set)."""
    target, sparse = call.edges, call.sparse_values is not None
    key: Hashable = ("norm", norm, sparse, call.dtype)
    hit = target.memo.get(key, (call.weight,))
    if hit is not None:
        return hit
    ei = edges.sparse_edges() if sparse else target.edge_index
    layer = call.layer

    def to_halo(v: Tensor) -> Tensor:
        return collectives.to_halo(v, plan, layer)

    def to_owners(v: Tensor) -> Tensor:
        return collectives.to_owners(v, plan, layer)

    with torch.no_grad():
        if norm.rule == "gcn":
            out = normalize.gcn_weights(
                ei, call.weight, target.n_inner, target.n_src, improved=norm.improved,
                add_self_loops=norm.add_self_loops, to_halo=to_halo, loops="all" if sparse else "remaining",
                dtype=call.dtype,
            )  # fmt: skip
        elif norm.rule == "cheb":
            out = normalize.laplacian_weights(
                ei, call.weight, target.n_inner, target.n_src, normalization=norm.normalization,  # type: ignore[arg-type]
                lambda_max=norm.lambda_max, to_halo=to_halo, to_owners=to_owners,
                global_max=lambda t: collectives.global_max(t, layer), dtype=call.dtype,
            )  # fmt: skip
        else:
            out = normalize.cluster_gcn_weights(ei, target.n_inner, diag_lambda=norm.diag_lambda, dtype=call.dtype)
    return target.memo.put(key, (call.weight,), out)


def fused_adjacency(
    target: EdgeSet, ei: Tensor, weight: Optional[Tensor], n_dst: int, reduce: Reduce, dtype: torch.dtype,
    tag: Hashable, source: Optional[Tensor] = None,
) -> FusedAdjacency:  # fmt: skip
    """The fused adjacency of ``(ei, weight)`` (kept per edge set, ``tag`` and the tensors it comes from)."""

    def build() -> FusedAdjacency:
        with torch.no_grad():
            return FusedAdjacency.build(ei, weight, n_dst, target.n_src, reduce, dtype)

    return target.memo.get_or_build(("fused", tag, n_dst, reduce, dtype), (weight, source), build)


def wrapped_adjacency(target: EdgeSet, user: Tensor) -> FusedAdjacency:
    """A user's sparse adjacency as a :class:`FusedAdjacency` (kept: its transposes are built once)."""

    def build() -> FusedAdjacency:
        return FusedAdjacency.wrap(user if user.layout == torch.sparse_csr else user.to_sparse_csr())

    return target.memo.get_or_build("wrapped", (user,), build)


def stored_adjacency(call: LayerCall, norm: Optional[Normalization], ei: Optional[Tensor], w: Optional[Tensor]) -> Optional[FusedAdjacency]:
    """The fused adjacency from the partition's stored CSR (:mod:`~lightning_halo.layers.stored`), if it serves this call.

    It serves the in-edges (not a user's sparse adjacency) for ``sum``/``mean`` aggregations and
    GCN's normalisation; kept per edge set like the built ones.
    """
    target, agg = call.edges, call.aggregation
    stored = target.stored
    if stored is None or call.sparse_values is not None or not agg.fused:
        return None
    if norm is None:
        if agg.reduce not in ("sum", "mean"):
            return None
        key: Hashable = ("stored", agg.reduce, call.n_dst, call.dtype)
        return target.memo.get_or_build(key, (call.weight,), lambda: stored.raw(call.weight, agg.reduce, call.n_dst, call.dtype))  # type: ignore[arg-type]
    if norm.rule != "gcn" or ei is None or w is None:
        return None
    key = ("stored", norm, call.n_dst, call.dtype)

    def build() -> Optional[FusedAdjacency]:
        with torch.no_grad():
            return stored.normalized(target.edge_index, ei, w, call.n_dst, norm.add_self_loops)

    return target.memo.get_or_build(key, (call.weight,), build)


def layer_edges(
    call: LayerCall, given: Any, edges: PartitionEdges, collectives: Collectives, plan: ExchangePlan
) -> LayerEdges:
    """The edges and weights that make the layer compute the whole-graph result on the partition."""
    target, agg, norm = call.edges, call.aggregation, call.normalization
    sparse = call.sparse_values is not None
    canonical = edges.sparse_edges() if sparse else target.edge_index
    if norm is not None:
        ei, w = normalized_edges(call, norm, edges, collectives, plan)
        if agg.fused:
            adj = stored_adjacency(call, norm, ei, w)
            return LayerEdges(adj if adj is not None else fused_adjacency(target, ei, w, call.n_dst, "sum", call.dtype, ("norm", norm)))
        return LayerEdges(ei.flip(0) if call.flipped else ei, w)
    if sparse:
        if not agg.fused:
            return LayerEdges(given)
        if call.n_dst == call.n_inner:
            return LayerEdges(wrapped_adjacency(target, given))
        return LayerEdges(fused_adjacency(target, canonical, call.weight, call.n_dst, "sum", call.dtype, "user", given))
    if agg.reduce is not None:
        adj = stored_adjacency(call, None, None, None)
        return LayerEdges(adj if adj is not None else fused_adjacency(target, canonical, call.weight, call.n_dst, agg.reduce, call.dtype, "raw"))
    return LayerEdges(canonical.flip(0) if call.flipped else canonical, call.weight)


def covered_edges(call: LayerCall, edges: LayerEdges, exchanger: HaloExchanger) -> tuple[LayerEdges, CoverRoute]:
    """The call's fused adjacency over ``[inner | block]`` with halo partial sums, and the route that fetches the block.

    Kept per edge set and adjacency (every rank builds it at the same call: the owners are sent
    the coefficients once, :meth:`~lightning_halo.exchange.HaloExchanger.cover_route`).
    """
    adj, reduce = edges.edge_index, call.aggregation.reduce
    if not isinstance(adj, Tensor) or reduce is None:  # the call's stages choose partial sums only for these
        raise internal_error(f"halo partial sums were chosen for a call with edges {type(adj).__name__}, reduce {reduce!r}")

    def build() -> tuple[LayerEdges, CoverRoute]:
        plan = exchanger.cover_plan()
        n_dst = call.n_inner + plan.block if call.feed == "full" else call.n_inner
        with torch.no_grad():
            covered, coefficients = covered_adjacency(adj, reduce, plan, n_dst, call.dtype)
        return LayerEdges(covered, edges.weight), exchanger.cover_route(coefficients, adj.device)

    return call.edges.memo.get_or_build(("cover", call.feed, reduce, call.dtype), (adj,), build)


def rewrite_arguments(
    call: LayerCall, spec: LayerSpec, arguments: dict[str, Any], edges: LayerEdges, takes_weight: bool
) -> Optional[LayerEdges]:
    """Put ``edges`` into the layer's ``arguments``.

    A layer that normalises in ``forward`` without a switch (``spec.renormalizes``) gets an
    empty placeholder instead; the edges to put into every ``propagate`` call are returned.
    """
    arguments.update(call.edge_arguments)
    if spec.renormalizes and call.normalization is not None:
        arguments["edge_index"] = torch.empty(2, 0, dtype=torch.long, device=call.edges.edge_index.device)
        if spec.weight_arg in arguments:
            arguments[spec.weight_arg] = None  # type: ignore[index]
        return edges
    arguments["edge_index"] = edges.edge_index
    weight_arg = spec.weight_arg
    if weight_arg and takes_weight and (weight_arg in arguments or edges.weight is not None):
        arguments[weight_arg] = edges.weight
    return None
