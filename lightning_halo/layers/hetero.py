r"""Layer calls on a heterogeneous partition: one relation at a time, or every type at once.

On a :class:`~lightning_halo.partition.hetero.HeteroHaloPartition` every edge type holds all
in-edges of its target type's inner nodes, with sources among the source type's inner *and*
halo nodes. So a layer computes every inner node exactly when each source type's rows come
with their halo rows appended, and its output is read on the inner rows only:

* per relation (the edge-type modules of ``to_hetero(model, metadata)`` and ``HeteroConv``):
  a ``"bipartite"`` layer runs as ``layer((x_src ++ halo_src, x_dst), edge_index)``; a
  ``"full"`` layer of a relation within one type runs on ``x ++ halo`` and its output is cut
  back to the inner rows (:func:`relation_call`);
* every type at once (``HGTConv``, ``HANConv``, kind ``"types"``): each source type's ``x`` gets
  its halo rows, each output is cut back to its type's inner rows (:func:`types_call`);
  ``HANConv``'s semantic attention, a mean over every node of a type, is summed over all ranks
  (:mod:`lightning_halo.layers.semantic`).

A source type's halo is fetched once per tensor and step (:class:`TypeFetches`), however many
relations read it: ``to_hetero`` and ``HeteroConv`` hand the same ``x_dict[src]`` to every edge
type that starts at ``src``. Rows may also be given for every local node (inner and halo, e.g.
``emb[t](batch[t].n_id)`` for a type without features): they need no exchange.

A layer that normalises with the degrees of its sources (kind ``"gcn"``: ``GCNConv``,
``LGConv``) runs on a relation within one type, as PyG allows it: its weights are computed on the
relation's local edges, each halo node's degree *in that relation* coming from its owner (one
32-bit exchange of a degree vector through the type's plan, kept per partition, relation and
edge weights), and its own normalisation is switched off for the call (:func:`relation_call`).

A layer that propagates several times in one call (kind ``"steps"``: ``TAGConv``, ``APPNP``,
``GatedGraphConv``, ...) runs on a relation within one type as on a homogeneous partition: it is
fed the type's inner rows and, before *every* propagation, the halo rows of what that step reads
are fetched through the type's plan (named ``<layer>#<k>[<type>]``); a normalising one gets the
relation's normalised edges, as a ``"gcn"`` layer (:func:`relation_step_inputs`).

Refused, with the reason: a ``"steps"`` or ``"gcn"`` layer between two types, a ``"steps"`` layer
that normalises without a flag to switch it off (``SGConv``, ``ChebConv``, ...), an edge set that
is none of the partition's edge types, and rows of another count than the type's inner or local
nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor
from torch.nn import Module

from lightning_halo._compat.pyg import switch_off
from lightning_halo.layers.batchnorm import AllSum
from lightning_halo.layers.call import Aggregation, AggregationChoice, choose_aggregation
from lightning_halo.layers.propagate import halo_step_inputs
from lightning_halo.layers.reasons import EdgeIndexReason
from lightning_halo.layers.registry import LayerSpec, Normalization, UnsupportedLayerError
from lightning_halo.layers.relation_cover import group_of
from lightning_halo.layers.semantic import SemanticCall, uses_semantic_attention
from lightning_halo.partition.halo_partition import stacked_view
from lightning_halo.partition.hetero import EdgeType, HeteroHaloPartition

#: ``fetch(rows, node_type, group)``: the halo rows ``[n_halo_t, ...]`` of ``rows`` ``[n_inner_t, ...]``.
TypeFetch = Callable[[Tensor, str, str], Tensor]
#: ``normalize(layer, edge_type, edge_index, edge_weight, norm, dtype)``: the relation's normalised local edges
#: ``(edge_index, weights)`` (the halo nodes' degrees from their owners).
RelationNorm = Callable[[str, EdgeType, Tensor, Optional[Tensor], Normalization, torch.dtype], tuple[Tensor, Tensor]]
#: ``adjacency(edge_type, edge_index, edge_weight, n_dst, n_src, reduce, dtype)``: the relation's fused adjacency.
RelationAdjacency = Callable[[EdgeType, Tensor, Optional[Tensor], int, int, str, torch.dtype], Tensor]


@dataclass(frozen=True)
class RelationSource:
    """What a relation's source rows get appended: the source type's halo rows, or the block of its layer's
    partial-sum exchange (:mod:`lightning_halo.layers.relation_cover`), whose ``covered(n_dst)`` is then the
    relation's adjacency over ``[inner | block]`` with ``n_dst`` rows."""

    halo: Tensor
    covered: Optional[Callable[[int], Tensor]] = None
    how: str = ""  # for the layer report: partial sums, or why rows


#: ``source(x_inner, edge_type, group, layer, reduce)``: the rows appended to a relation's source rows; ``reduce``
#: is the call's fused aggregation without edge weights (``None``: it cannot take partial sums).
RelationSourceFetch = Callable[[Tensor, EdgeType, str, str, Optional[str]], RelationSource]


@dataclass(frozen=True)
class RelationTools:
    """What a relation call takes from its layer context: the type fetches (rows or partial sums), the normalised
    edges of a ``"gcn"`` relation, fused adjacencies (both kept per partition) and the ``aggregation`` option."""

    fetch: TypeFetch
    normalize: RelationNorm
    adjacency: RelationAdjacency
    aggregation: Aggregation = "auto"
    source: Optional[RelationSourceFetch] = None  # None: every relation reads the type's halo rows

@dataclass(frozen=True)
class RelationSteps:
    """A ``"steps"`` call on a relation within one type: what each propagation's halo is fetched for."""

    node_type: str
    n_inner: int
    n_local: int  # inner and halo rows: the sources of the relation's edges
    fused: bool  # the relation aggregates with its fused adjacency (each step reads ``x`` only)


@dataclass(frozen=True)
class HeteroRunning:
    """One running call on a heterogeneous partition: what to cut from its output, and how often it may propagate."""

    layer: str
    cls: str
    keep_rows: Optional[int] = None  # a tensor output: its first rows (None: as it is)
    keep_types: Optional[dict[str, int]] = None  # a dict output: each type's first rows
    max_propagations: Optional[int] = 1
    how: str = "edge_index"  # the relation's aggregation: "fused", or "edge_index (why)"
    semantic: Optional[SemanticCall] = None  # HANConv: its semantic attention over every rank's nodes
    restore: Optional[tuple[str, Any]] = None  # a normalising layer's own flag, switched off for the call
    steps: Optional[RelationSteps] = None  # a "steps" layer: every propagation fetches its halo


def _propagations(spec: LayerSpec, module: Module) -> Optional[int]:
    allowed = spec.propagations
    return allowed(module) if callable(allowed) else allowed


def _rows(x: Any, node_type: str, part: HeteroHaloPartition, layer: str, what: str) -> Optional[bool]:
    """Whether ``x`` holds only the inner rows of ``node_type`` (``True``) or every local row (``False``);
    ``None`` for a missing input. Any other count is refused."""
    if x is None:
        return None
    if not isinstance(x, Tensor):
        raise UnsupportedLayerError(
            f"layer '{layer}' got {what} of type {type(x).__name__} for node type {node_type!r}; on a heterogeneous "
            "partition it must be a tensor with one row per node of the type"
        )
    store = part[node_type]
    n_inner, n_local = int(store.n_inner), int(store.num_nodes)
    if x.size(0) == n_inner:
        return True
    if x.size(0) == n_local:
        return False
    raise UnsupportedLayerError(
        f"layer '{layer}' got {what} with {x.size(0)} rows for node type {node_type!r}, whose partition has {n_inner} "
        f"inner nodes ({n_local} with its halo): pass the type's inner rows (batch[{node_type!r}].x, a layer's output) "
        f"or one row per local node (e.g. an embedding of batch[{node_type!r}].n_id)"
    )


def _with_halo(x: Tensor, inner_only: Optional[bool], node_type: str, group: str, fetch: TypeFetch) -> Tensor:
    if not inner_only:
        return x
    halo = fetch(x, node_type, group)
    whole = stacked_view(x, halo)  # input features and their stored halo are one tensor: no copy
    return whole if whole is not None else torch.cat([x, halo], dim=0)


def _edge_type(edge_index: Any, part: HeteroHaloPartition, layer: str, world_size: int) -> Optional[EdgeType]:
    found = part.edge_type_of(edge_index)
    if found is None and world_size > 1:
        raise UnsupportedLayerError(
            f"layer '{layer}' was called with edges that are none of the partition's edge types (batch[edge_type]."
            "edge_index, as batch.edge_index_dict hands them out): only those hold every in-edge of the inner nodes. "
            "Pass the batch's edge_index_dict unchanged; add reverse or metapath edge types before partitioning "
            "(T.ToUndirected(), T.AddMetaPaths)"
        )
    return found


def relation_call(
    name: str, module: Module, spec: LayerSpec, arguments: dict, part: HeteroHaloPartition, world_size: int,
    tools: RelationTools,
) -> Optional[HeteroRunning]:  # fmt: skip
    """Rewrite ``arguments`` (``x`` and ``edge_index`` of one relation) for the partition; ``None`` leaves the
    call as it is (one process, edges of the user's own). Where PyG's layer aggregates with a sparse
    adjacency exactly (as :func:`~lightning_halo.layers.call.choose_aggregation` decides on homogeneous
    partitions), it gets the relation's fused adjacency instead of ``edge_index``: one sparse product,
    no ``[E, d]`` message tensor."""
    cls = type(module).__name__
    edge_type = _edge_type(arguments.get("edge_index"), part, name, world_size)
    if edge_type is None:
        return None
    if getattr(module, "flow", "source_to_target") != "source_to_target":
        raise UnsupportedLayerError(
            f"layer '{name}' ({cls}) has flow='target_to_source': on a relation it would aggregate into the source "
            "type from edges the partition holds for the target type's nodes. A reversed relation is an edge type of "
            "its own (T.ToUndirected() before the data module)"
        )
    if spec.kind == "types":
        raise UnsupportedLayerError(f"layer '{name}' ({cls}) takes dicts of node and edge types, not one relation")
    src, _, dst = edge_type
    x = arguments["x"]
    pair = isinstance(x, (tuple, list))
    if spec.kind == "gcn":
        return _normalised_call(name, module, spec, arguments, part, edge_type, pair, tools)
    if spec.kind == "steps":
        return _steps_call(name, module, spec, arguments, part, edge_type, pair, tools)
    x_src, x_dst = (x[0], x[1]) if pair else (x, x)
    feed = spec.feed_for(module) if spec.feed_for is not None else spec.kind
    group = group_of(name)
    src_inner = _rows(x_src, src, part, name, "source rows")
    if pair or src != dst:
        if feed != "bipartite":
            raise UnsupportedLayerError(
                f"layer '{name}' ({cls}) runs on the relation {edge_type} between two node types, which needs "
                "(x_src, x_dst) input, and PyG's layer does not take it (it is registered as "
                f"'{feed}'); use a layer that does (SAGEConv, GraphConv, GATConv(add_self_loops=False), GINConv, ...)"
            )
        dst_inner = _rows(x_dst, dst, part, name, "target rows")
        n_inner = int(part[dst].n_inner)
        inner_dst = x_dst if x_dst is None or dst_inner else x_dst[:n_inner]
        full_src, source = (None, None) if x_src is None else _source_rows(
            name, module, spec, arguments, x_src, src_inner, edge_type, tools)  # fmt: skip
        arguments["x"] = (full_src, inner_dst)
        how = _aggregate(name, module, spec, arguments, edge_type, n_inner, int(part[src].num_nodes), tools, source)
        return HeteroRunning(name, cls, None, None, _propagations(spec, module), how=how)
    # one node type, one tensor: as on a homogeneous partition
    if x_src is None:
        return HeteroRunning(name, cls, None, None, _propagations(spec, module))
    full, source = _source_rows(name, module, spec, arguments, x_src, src_inner, edge_type, tools)
    n_inner, n_local = int(part[src].n_inner), int(part[src].num_nodes)
    if feed == "bipartite":
        arguments["x"] = (full, full[:n_inner])
        how = _aggregate(name, module, spec, arguments, edge_type, n_inner, n_local, tools, source)
        return HeteroRunning(name, cls, None, None, _propagations(spec, module), how=how)
    arguments["x"] = full
    n_rows = full.size(0)  # output rows: every local node (or inner and block)
    how = _aggregate(name, module, spec, arguments, edge_type, n_rows, n_local, tools, source)
    return HeteroRunning(name, cls, n_inner, None, _propagations(spec, module), how=how)


def _source_rows(
    name: str, module: Module, spec: LayerSpec, arguments: dict, x_src: Tensor, inner_only: Optional[bool],
    edge_type: EdgeType, tools: RelationTools,
) -> tuple[Tensor, Optional[RelationSource]]:  # fmt: skip
    """A relation's source rows with what its layer's exchange appends: the halo rows, or partial sums
    where the call aggregates linearly (``None``: the rows were given for every local node)."""
    if not inner_only:
        return x_src, None
    if tools.source is None:
        return _with_halo(x_src, inner_only, edge_type[0], group_of(name), tools.fetch), None
    weight_arg = spec.weight_arg
    weight = arguments.get(weight_arg) if weight_arg is not None else None
    choice = _relation_aggregation(tools.aggregation, name, spec, module, weight, x_src.is_cuda)
    reduce = choice.reduce if weight is None else None
    source = tools.source(x_src, edge_type, group_of(name), name, reduce)
    whole = stacked_view(x_src, source.halo) if source.covered is None else None
    return (whole if whole is not None else torch.cat([x_src, source.halo], dim=0)), source


def _aggregate(
    name: str, module: Module, spec: LayerSpec, arguments: dict, edge_type: EdgeType, n_dst: int, n_src: int,
    tools: RelationTools, source: Optional[RelationSource],
) -> str:  # fmt: skip
    """The relation's adjacency: over ``[inner | block]`` where its halo arrived as partial sums, else its fused
    adjacency where the layer can take it (:func:`_fuse`); returns how the call aggregates."""
    if source is None or source.covered is None:
        how = _fuse(name, module, spec, arguments, edge_type, n_dst, n_src, tools)
        return f"{how}; halo {source.how}" if source is not None and source.how else how
    arguments["edge_index"] = source.covered(n_dst)
    if spec.weight_arg is not None and spec.weight_arg in arguments:
        arguments[spec.weight_arg] = None
    return f"fused; halo {source.how}"


def _relation_aggregation(
    option: Aggregation, name: str, spec: LayerSpec, module: Module, weight: Optional[Tensor], on_cuda: bool
) -> AggregationChoice:  # fmt: skip
    """:func:`~lightning_halo.layers.call.choose_aggregation` for a relation's call, whose adjacency goes into
    the layer's ``forward``. A layer that normalises its input there (``spec.renormalizes``: ClusterGCNConv)
    stays on ``edge_index``: PyG normalises a sparse adjacency by its stored entries (repeated edges merged)
    and in the default float dtype, so neither the fused adjacency nor partial sums give its result."""
    if not spec.renormalizes:
        return choose_aggregation(option, name, spec, module, weight, False, on_cuda)
    if option == "sparse":
        raise UnsupportedLayerError(
            f"layer '{name}' ({type(module).__name__}) cannot use the fused sparse aggregation on a relation: "
            f"{EdgeIndexReason.RENORMALIZES.text()}. Use HaloQuantStrategy(aggregation='auto') to run such layers "
            "on edge_index."
        )
    return AggregationChoice(None, EdgeIndexReason.RENORMALIZES)


def _fuse(
    name: str, module: Module, spec: LayerSpec, arguments: dict, edge_type: EdgeType, n_dst: int, n_src: int,
    tools: RelationTools,
) -> str:  # fmt: skip
    """Put the relation's fused adjacency ``[n_dst, n_src]`` into ``arguments`` where the layer can take it
    (its edge weights folded in); returns how the call aggregates."""
    x = arguments["x"]
    first = x[0] if isinstance(x, (tuple, list)) else x
    if first is None:
        return "edge_index (no source rows)"
    weight_arg = spec.weight_arg
    weight = arguments.get(weight_arg) if weight_arg is not None else None
    choice = _relation_aggregation(tools.aggregation, name, spec, module, weight, first.is_cuda)
    if choice.reduce is None:
        return f"edge_index ({choice.why})"
    arguments["edge_index"] = tools.adjacency(edge_type, arguments["edge_index"], weight, n_dst, n_src, choice.reduce,
                                              first.dtype)  # fmt: skip
    if weight_arg is not None and weight_arg in arguments:
        arguments[weight_arg] = None  # folded into the adjacency's values
    return "fused"


def _normalised_call(
    name: str, module: Module, spec: LayerSpec, arguments: dict, part: HeteroHaloPartition, edge_type: EdgeType,
    pair: bool, tools: RelationTools,
) -> HeteroRunning:  # fmt: skip
    """A ``"gcn"`` layer on a relation within one type: ``x ++ halo``, the relation's normalised edges, the
    layer's own normalisation off, the output cut to the inner rows."""
    cls = type(module).__name__
    src, _, dst = edge_type
    if pair or src != dst:
        raise UnsupportedLayerError(
            f"layer '{name}' ({cls}) runs on the relation {edge_type} between two node types, but it normalises with "
            "the degrees of one node set and takes one tensor (PyG has no bipartite form of it); use it on a relation "
            "within one type, or SAGEConv, GraphConv or GATConv(add_self_loops=False) between types"
        )
    x = arguments["x"]
    n_inner = int(part[src].n_inner)
    if x is None:
        raise UnsupportedLayerError(f"layer '{name}' ({cls}) was called without node features")
    full = _with_halo(x, _rows(x, src, part, name, "rows"), src, group_of(name), tools.fetch)
    arguments["x"] = full
    restore = _relation_norm(name, module, spec, arguments, edge_type, full.dtype, tools)
    n_local = int(part[src].num_nodes)
    how = _fuse(name, module, spec, arguments, edge_type, n_local, n_local, tools)
    return HeteroRunning(name, cls, n_inner, None, _propagations(spec, module), restore=restore, how=how)


def _relation_norm(
    name: str, module: Module, spec: LayerSpec, arguments: dict, edge_type: EdgeType, dtype: torch.dtype,
    tools: RelationTools,
) -> Optional[tuple[str, Any]]:  # fmt: skip
    """Give a normalising layer the relation's normalised edges and switch its own normalisation off; returns
    the flag to restore after the call (``None``: the layer does not normalise here)."""
    cls = type(module).__name__
    norm = spec.norm(module, arguments) if spec.norm is not None else None
    if norm is None:
        return None
    weight = arguments.get(spec.weight_arg) if spec.weight_arg is not None else None
    if weight is not None and weight.requires_grad:
        raise UnsupportedLayerError(
            f"layer '{name}' ({cls}): learned edge weights with a normalisation would need gradients of remote "
            "degrees; normalise yourself and switch the layer's normalisation off (e.g. normalize=False)."
        )
    if spec.switch is None:
        raise UnsupportedLayerError(
            f"layer '{name}' ({cls}) normalises in its forward without a flag to switch it off, so on a relation it "
            "would normalise with the partition's degrees; normalise the relation's edges yourself before the data "
            "module, or use a layer with such a flag (TAGConv, APPNP, GCNConv: normalize=)"
        )
    ei, w = tools.normalize(name, edge_type, arguments["edge_index"], weight, norm, dtype)
    arguments["edge_index"] = ei
    arguments[spec.weight_arg or "edge_weight"] = w
    return spec.switch, switch_off(module, spec.switch)  # our weights are final already


def _steps_call(
    name: str, module: Module, spec: LayerSpec, arguments: dict, part: HeteroHaloPartition, edge_type: EdgeType,
    pair: bool, tools: RelationTools,
) -> HeteroRunning:  # fmt: skip
    """A ``"steps"`` layer on a relation within one type: fed the inner rows (each propagation fetches its halo,
    :func:`relation_step_inputs`), the relation's edges (normalised where the layer normalises) as an
    ``[n_inner, n_local]`` adjacency, its output the inner rows."""
    cls = type(module).__name__
    src, _, dst = edge_type
    if pair or src != dst:
        raise UnsupportedLayerError(
            f"layer '{name}' ({cls}) propagates several times in one call, each step reading the last one's output at "
            f"the same nodes, which needs one node set; on the relation {edge_type} between two node types PyG's "
            "layer cannot run either. Use it on a relation within one type"
        )
    x = arguments["x"]
    if x is None:
        raise UnsupportedLayerError(f"layer '{name}' ({cls}) was called without node features")
    n_inner, n_local = int(part[src].n_inner), int(part[src].num_nodes)
    if not _rows(x, src, part, name, "rows"):
        arguments["x"] = x[:n_inner]  # every local row given: the steps fetch the halo of what they read
    restore = _relation_norm(name, module, spec, arguments, edge_type, x.dtype, tools)
    how = _fuse(name, module, spec, arguments, edge_type, n_inner, n_local, tools)
    steps = RelationSteps(src, n_inner, n_local, how == "fused")
    return HeteroRunning(name, cls, None, None, _propagations(spec, module), restore=restore, how=how, steps=steps)


def relation_step_inputs(
    running: HeteroRunning, module: Module, edge_index: Any, kwargs: dict, count: int, fetch: TypeFetch
) -> tuple[Any, Optional[tuple[int, int]], dict]:
    """``propagate``'s ``(edge_index, size, kwargs)`` for the ``count``-th propagation of a ``"steps"`` call on a
    relation: what it reads at sources with its halo rows appended, fetched through the type's plan as
    ``<layer>#<count>[<type>]``."""
    steps = running.steps
    assert steps is not None
    fused = steps.fused and isinstance(edge_index, Tensor) and edge_index.layout != torch.strided
    step = f"{running.layer}#{count}"
    return halo_step_inputs(module, edge_index, kwargs, n_inner=steps.n_inner, n_src=steps.n_local, fused=fused,
                            flipped=False, layer=running.layer, cls=running.cls,
                            fetch=lambda rows: fetch(rows, steps.node_type, step))  # fmt: skip


def types_call(
    name: str, module: Module, spec: LayerSpec, arguments: dict, part: HeteroHaloPartition, world_size: int,
    fetch: TypeFetch, all_sum: AllSum,
) -> Optional[HeteroRunning]:  # fmt: skip
    """Rewrite ``arguments`` (``x_dict`` and ``edge_index_dict``) of a ``"types"`` layer for the partition; a
    ``HANConv`` call also gets its global semantic attention (:mod:`lightning_halo.layers.semantic`)."""
    cls = type(module).__name__
    x_dict, edge_index_dict = arguments.get("x_dict"), arguments.get("edge_index_dict")
    if not isinstance(x_dict, dict) or not isinstance(edge_index_dict, dict):
        raise UnsupportedLayerError(f"layer '{name}' ({cls}) must be called with x_dict and edge_index_dict (dicts)")
    sources: set[str] = set()
    for key, edge_index in edge_index_dict.items():
        edge_type = _edge_type(edge_index, part, name, world_size)
        if edge_type is None:
            return None
        if tuple(key) != edge_type:
            raise UnsupportedLayerError(f"layer '{name}' ({cls}) got the edges of {edge_type} under the key {key!r}")
        sources.add(edge_type[0])
    out: dict[str, Any] = {}
    keep: dict[str, int] = {}
    for node_type, x in x_dict.items():
        inner = _rows(x, node_type, part, name, "x_dict rows")
        keep[node_type] = int(part[node_type].n_inner)
        out[node_type] = _with_halo(x, inner, node_type, name, fetch) if node_type in sources and x is not None else x
    arguments["x_dict"] = out
    semantic = None
    if uses_semantic_attention(module):
        semantic = SemanticCall(name, cls, list(out), keep, all_sum)
    return HeteroRunning(name, cls, None, keep, _propagations(spec, module), semantic=semantic)


def check_propagation(running: HeteroRunning, count: int) -> None:
    """Refuse the ``count``-th propagation of one call if the layer is registered with fewer."""
    limit = running.max_propagations
    if limit is not None and count > limit:
        raise UnsupportedLayerError(
            f"layer '{running.layer}' ({running.cls}) called propagate {count} times in one forward on a heterogeneous "
            f"partition, but it is registered with {limit} propagation(s): a later propagation would read halo rows "
            "that no peer updated."
        )


def cut_output(running: HeteroRunning, output: Any) -> Any:
    """The output read on the inner rows (``None``: unchanged); a dict of types, or a tuple led by one
    (``HANConv(..., return_semantic_attention_weights=True)``), is cut per type."""
    if running.keep_types is not None:
        if isinstance(output, dict):
            return _cut_types(output, running.keep_types)
        if isinstance(output, tuple) and output and isinstance(output[0], dict):
            return (_cut_types(output[0], running.keep_types), *output[1:])
    return first_rows(output, running.keep_rows)


def _cut_types(output: dict, keep: dict[str, int]) -> dict:
    return {t: (v[: keep[t]] if isinstance(v, Tensor) and t in keep else v) for t, v in output.items()}


def first_rows(output: Any, keep: Optional[int]) -> Any:
    """A layer's output cut to its first ``keep`` rows (a tensor, or the first tensor of a tuple such as
    ``(out, attention)``); ``None`` (keep the output as it is) when there is nothing to cut."""
    if keep is None or output is None:
        return None
    if isinstance(output, Tensor):
        return output[:keep]
    if isinstance(output, tuple) and output and isinstance(output[0], Tensor):
        return (output[0][:keep], *output[1:])
    return None
