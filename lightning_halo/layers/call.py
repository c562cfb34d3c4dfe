r"""One call of a hooked layer, decided by small stages before anything runs.

When a hooked layer is called, :func:`build_call` turns the call's arguments into a frozen
:class:`LayerCall` through these stages, in this order (the forward pre-hook then only applies
it, see :mod:`lightning_halo.layers.apply`):

1. :func:`validate_call`: what lightning-halo sets itself (``size``) or cannot see
   (``torch.compile``) is refused;
2. :func:`resolve_edges`: the edges given are the partition's in-edges, their reverse or the
   partition's sparse adjacency (the guard of :mod:`lightning_halo.layers.edges`); under
   ``flow="target_to_source"`` the other direction is used; edge attributes are aligned;
3. :func:`choose_feed` and :func:`check_node_features`: how the node features are given to
   the layer (with halo rows appended, bipartite, or per propagation step);
4. :func:`choose_normalization`: the normalisation lightning-halo computes with global degrees;
5. :func:`choose_aggregation`: the fused sparse aggregation, or PyG's ``edge_index`` path and why;
6. :func:`~lightning_halo.layers.reduction.choose_reduction`: halo partial sums where they are
   exact (fewer rows on the wire), or every halo row and why.

Every stage is a function of its arguments; only :func:`resolve_edges` talks to the peers
(a tiny agreement for an edge tensor that is not the partition's own object, and the reversed
edges' one-time build), identically on every rank, so all ranks build the same call or all
refuse it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Optional, get_args

import torch
from torch import Tensor
from torch.nn import Module

from lightning_halo.exchange import Direction
from lightning_halo.layers.edges import EdgeSet, PartitionEdges, UnsupportedEdgesError
from lightning_halo.layers.reasons import SILENT_REDUCTIONS, EdgeIndexReason, ReductionReason
from lightning_halo.layers.reduction import HaloReduction, ReductionChoice, choose_reduction
from lightning_halo.layers.registry import (
    COMPILE_REFUSAL,
    Feed,
    LayerSpec,
    Normalization,
    UnsupportedLayerError,
    class_propagate_fuses,
)
from lightning_halo.partition.adjacency import Reduce

#: How layers aggregate: see :class:`~lightning_halo.HaloQuantStrategy`'s ``aggregation``.
Aggregation = Literal["auto", "edge_index", "sparse"]
AGGREGATIONS: tuple[Aggregation, ...] = get_args(Aggregation)


def check_aggregation(aggregation: str) -> None:
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation={aggregation!r} is not supported; choose one of {AGGREGATIONS}")


@dataclass(frozen=True)
class ResolvedEdges:
    """The edges a call was given (``given``) and those it runs on (``target``, reversed under ``flipped``)."""

    given: EdgeSet
    target: EdgeSet
    sparse_values: Optional[Tensor] = None  # a user's sparse adjacency's values, in the partition's CSR order
    flipped: bool = False  # flow="target_to_source"


@dataclass(frozen=True)
class AggregationChoice:
    """The fused kernel's aggregation (``reduce``), or ``None`` and why the call runs on ``edge_index``."""

    reduce: Optional[Reduce]
    reason: Optional[EdgeIndexReason] = None
    about: str = ""  # the aggregation a reason is about (the one that could not fuse)

    @property
    def fused(self) -> bool:
        return self.reduce is not None

    @property
    def why(self) -> str:
        """The reason in words (empty when it fuses)."""
        return "" if self.reason is None else self.reason.text(self.about)


@dataclass(frozen=True)
class LayerCall:
    """Everything one call of a hooked layer does on the partition, decided before it runs.

    Attributes:
        layer: the layer's qualified name.
        cls: its class name (for messages).
        edges: the edge set the layer runs on (its direction names the halo and plan).
        feed: how its node features are given.
        flipped: it aggregates at ``edge_index[0]`` (``flow="target_to_source"``).
        exact: its halo is exchanged synchronously at 32 bits outside the training slots
            (``cached=True`` layers keep their first result).
        dtype: the dtype of its features (float), for weights and adjacencies.
        weight: the per-edge weights it was given (a sparse adjacency's values included).
        normalization: what lightning-halo normalises for it with global degrees, or ``None``.
        aggregation: the fused aggregation, or why not.
        max_propagations: ``propagate`` calls allowed (``None``: any).
        sparse_values: the values of a sparse adjacency it was given (``None``: an ``edge_index``).
        edge_arguments: edge-level arguments replaced by the target edges' aligned tensors.
        reduction: whether its halo arrives with partial sums, or why not.
    """

    layer: str
    cls: str
    edges: EdgeSet
    feed: Feed
    flipped: bool
    exact: bool
    dtype: torch.dtype
    weight: Optional[Tensor]
    normalization: Optional[Normalization]
    aggregation: AggregationChoice
    max_propagations: Optional[int]
    sparse_values: Optional[Tensor] = None
    edge_arguments: Mapping[str, Tensor] = field(default_factory=dict)
    reduction: ReductionChoice = ReductionChoice(False, ReductionReason.OPTION)

    @property
    def direction(self) -> Direction:
        return self.edges.direction

    @property
    def n_inner(self) -> int:
        return self.edges.n_inner

    @property
    def n_dst(self) -> int:
        """Rows the aggregation produces: every local node when fed ``"full"``, else the inner ones."""
        return self.edges.n_src if self.feed == "full" else self.edges.n_inner

    @property
    def keep_rows(self) -> Optional[int]:
        """Rows of the output to keep (``"full"`` feeds compute halo rows nobody needs), else ``None``."""
        return self.edges.n_inner if self.feed == "full" else None

    def describe(self) -> str:
        """How the call runs, in the words of the layer report printed once per run."""
        agg = self.aggregation
        if agg.fused:
            how = f"fused sparse aggregation ({agg.reduce}, cached CSR and transpose)"
        else:
            how = f"on edge_index ({agg.why})"
        if self.feed == "steps":
            how += ", halo exchanged before every propagation"
        if self.normalization is not None:
            how += f", {self.normalization.rule} normalisation with global degrees"
        reason, why = self.reduction.reason, self.reduction.why
        if self.reduction.cover:
            how += ", halo partial sums where fewer rows cross (vertex cover)"
        elif reason is ReductionReason.STORED_INPUT:
            how += f", {why} (nothing crosses)"
        elif reason not in SILENT_REDUCTIONS:
            how += f", every halo row ({why})"
        return how + (" [reversed edges]" if self.direction == "out" else "")


# ---------------------------------------------------------------------- 1. validate
def validate_call(layer: str, arguments: Mapping[str, Any], compiling: bool) -> None:
    """Refuse what lightning-halo sets itself or could not see."""
    if compiling:
        raise UnsupportedLayerError(
            f"layer '{layer}' is being compiled (torch.compile): {COMPILE_REFUSAL}"
        )
    if arguments.get("size") is not None:
        raise ValueError(f"layer '{layer}' was called with size=...; lightning-halo sets sizes itself, drop it.")


# ---------------------------------------------------------------------- 2. resolve edges
def resolve_edges(edges: PartitionEdges, given: Any, layer: str, flipped: bool) -> Optional[ResolvedEdges]:
    """The partition's edge sets behind ``given``, or ``None`` for unknown edges on one process.

    Raises :class:`~lightning_halo.layers.edges.UnsupportedEdgesError` on every rank for an edge
    set the partition cannot answer (see :meth:`~lightning_halo.layers.edges.PartitionEdges.resolve`).
    """
    res = edges.resolve(given, layer)
    if not res.known:  # world size 1: the partition is the whole graph, so any edge set is exact
        return None
    assert res.edges is not None
    target = res.edges
    if flipped:  # it aggregates at edge_index[0]: the other direction's edges, handed over flipped
        if target.subset:
            raise UnsupportedEdgesError(
                f"layer '{layer}' has flow='target_to_source' and was given the edges lightning_halo.dropout_edge "
                "kept; their reverse is not built on partitions. Use flow='source_to_target' with dropped edges."
            )
        if res.sparse:
            raise UnsupportedLayerError(
                f"layer '{layer}' has flow='target_to_source', which PyG does not run on a sparse adjacency."
            )
        target = edges.sets["in"] if target.direction == "out" else edges.out_edges(layer)
    return ResolvedEdges(res.edges, target, res.sparse_values, flipped)


def aligned_edge_arguments(
    arguments: Mapping[str, Any], in_edges: EdgeSet, target: EdgeSet, layer: str
) -> dict[str, Tensor]:
    """Edge-level arguments (``edge_attr``, ``edge_weight``, ``edge_type``) in the order of ``target``.

    They are recognised by PyG's naming (``edge_*``), not by their length, so that every rank
    decides alike whatever its edge count. Nothing changes on the in-edges.
    """
    if target.direction == "in":  # given as the in-edges or flipped in-edges: same order
        return {}
    aligned = {}
    for name, value in arguments.items():
        if name == "edge_index" or not name.startswith("edge_") or not isinstance(value, Tensor):
            continue
        key = next((k for k, v in in_edges.attrs.items() if v is value), None)
        if key is None:
            raise UnsupportedEdgesError(
                f"layer '{layer}' runs on reversed edges, but its argument `{name}` ({tuple(value.shape)}) is "
                "not one of the partition's edge attributes, so lightning-halo cannot reorder it along the "
                "reversed edges. Pass the partition's own tensor (e.g. batch.edge_attr)."
            )
        aligned[name] = target.attrs[key]
    return aligned


# ---------------------------------------------------------------------- 3. feed
def choose_feed(spec: LayerSpec, module: Module, flipped: bool) -> Feed:
    """How the call's node features are given (see :mod:`~lightning_halo.layers.registry`)."""
    feed = spec.feed(module)
    if flipped and feed == "bipartite":
        return "full"  # PyG reverses pair semantics under target_to_source; full input needs none
    return feed


def _check_rows(layer: str, x: Tensor, n_inner: int, what: str) -> None:
    if x.size(0) != n_inner:
        raise ValueError(
            f"layer '{layer}' got {what} with {x.size(0)} rows, but this rank owns {n_inner} nodes. "
            "Pass node features of the partition's inner nodes (e.g. batch.x or an earlier layer's output); "
            "lightning-halo appends the halo rows itself."
        )


def check_node_features(layer: str, cls: str, x: Any, feed: Feed, n_inner: int, node_dim: int) -> torch.dtype:
    """Refuse node features the feed cannot take; returns the float dtype of weights built for them."""
    if feed == "steps":
        if not isinstance(x, Tensor):
            raise TypeError(f"layer '{layer}': node features must be one tensor, got {type(x).__name__}")
        _check_rows(layer, x.movedim(node_dim % x.dim(), 0), n_inner, "x")
        dtype = x.dtype
    elif isinstance(x, Tensor):
        _check_rows(layer, x, n_inner, "x")
        dtype = x.dtype
    elif isinstance(x, (tuple, list)) and len(x) == 2:
        if feed != "bipartite":
            raise UnsupportedLayerError(
                f"layer '{layer}' ({cls}) was called with a tuple (x_src, x_dst), but it does not take "
                "bipartite input here; call it with a single node-feature tensor."
            )
        x_src, x_dst = x
        if not isinstance(x_src, Tensor):
            raise TypeError(f"layer '{layer}': x_src must be a tensor, got {type(x_src).__name__}")
        _check_rows(layer, x_src, n_inner, "x_src")
        if x_dst is not None:
            _check_rows(layer, x_dst, n_inner, "x_dst")
        dtype = x_src.dtype
    else:
        raise TypeError(
            f"layer '{layer}': node features must be a tensor [n_inner, d] or a pair (x_src, x_dst), "
            f"got {type(x).__name__}"
        )
    return dtype if dtype.is_floating_point else torch.get_default_dtype()


# ---------------------------------------------------------------------- 4. normalisation
def edge_weight(spec: LayerSpec, arguments: Mapping[str, Any], edges: ResolvedEdges) -> Optional[Tensor]:
    """The per-edge weights of the call: a sparse adjacency's values, or the layer's weight argument."""
    if edges.sparse_values is not None:
        return edges.sparse_values
    return arguments.get(spec.weight_arg) if spec.weight_arg else None


def choose_normalization(
    layer: str, spec: LayerSpec, module: Module, arguments: Mapping[str, Any], weight: Optional[Tensor], flipped: bool
) -> Optional[Normalization]:
    """The layer's normalisation, computed by lightning-halo with global degrees, or ``None``."""
    norm = spec.norm(module, arguments) if spec.norm is not None else None  # type: ignore[arg-type]
    if norm is None:
        return None
    if norm.rule == "cheb" and flipped:
        raise UnsupportedLayerError(f"layer '{layer}': ChebConv with flow='target_to_source' is not supported.")
    if weight is not None and weight.requires_grad:
        raise UnsupportedLayerError(
            f"layer '{layer}': learned edge weights with a normalisation would need gradients of remote "
            "degrees; normalise yourself and switch the layer's normalisation off (e.g. normalize=False)."
        )
    return norm


# ---------------------------------------------------------------------- 5. aggregation
def _why_not_fused(
    spec: LayerSpec, module: Module, reduce: Optional[Reduce], weight: Optional[Tensor], flipped: bool, on_cuda: bool
) -> Optional[EdgeIndexReason]:
    if reduce is None and spec.sparse_reduce is not None and not class_propagate_fuses(type(module)):
        return EdgeIndexReason.UNFUSED_CLASS
    if reduce is None:
        return EdgeIndexReason.NO_SPARSE_PATH
    if flipped:
        return EdgeIndexReason.FLIPPED
    if weight is not None and weight.requires_grad:
        return EdgeIndexReason.WEIGHT_GRADIENTS
    if weight is not None and reduce in ("max", "min"):
        return EdgeIndexReason.WEIGHTED_MIN_MAX
    if reduce in ("max", "min") and on_cuda:
        return EdgeIndexReason.NO_CUDA_KERNEL
    return None


def choose_aggregation(
    option: Aggregation,
    layer: str,
    spec: LayerSpec,
    module: Module,
    weight: Optional[Tensor],
    flipped: bool,
    on_cuda: bool,
) -> AggregationChoice:
    """The fused sparse aggregation where PyG has one and it is exact here, else ``edge_index`` and why.

    ``option="sparse"`` refuses a call that cannot fuse; ``"edge_index"`` never fuses.
    """
    if option == "edge_index":
        return AggregationChoice(None, EdgeIndexReason.OPTION)
    reduce = spec.fused_reduce(module)
    reason = _why_not_fused(spec, module, reduce, weight, flipped, on_cuda)
    if reason is None:
        return AggregationChoice(reduce)
    choice = AggregationChoice(None, reason, reduce or "")
    if option == "sparse":
        raise UnsupportedLayerError(
            f"layer '{layer}' ({type(module).__name__}) cannot use the fused sparse aggregation: {choice.why}. "
            "Use HaloQuantStrategy(aggregation='auto') to run such layers on edge_index."
        )
    return choice


# ---------------------------------------------------------------------- all stages
def build_call(
    layer: str,
    module: Module,
    spec: LayerSpec,
    arguments: Mapping[str, Any],
    edges: PartitionEdges,
    option: Aggregation,
    reduction: HaloReduction = "none",
    stored_input: bool = False,
) -> Optional[LayerCall]:
    """The stages in order; ``None`` for unknown edges on one process (the layer then runs as written).

    ``stored_input``: the call's node features are the partition's own input features (their halo is held).
    """
    validate_call(layer, arguments, torch.compiler.is_compiling())
    flipped = getattr(module, "flow", "source_to_target") == "target_to_source"
    resolved = resolve_edges(edges, arguments["edge_index"], layer, flipped)
    if resolved is None:
        return None
    aligned = aligned_edge_arguments(arguments, edges.sets["in"], resolved.target, layer)
    if aligned:
        arguments = {**arguments, **aligned}  # the weights below are read in the target's edge order
    cls = type(module).__name__
    feed = choose_feed(spec, module, flipped)
    x = arguments["x"]
    dtype = check_node_features(layer, cls, x, feed, resolved.target.n_inner, getattr(module, "node_dim", -2))
    weight = edge_weight(spec, arguments, resolved)
    norm = choose_normalization(layer, spec, module, arguments, weight, flipped)
    on_cuda = (x[0] if isinstance(x, (tuple, list)) else x).is_cuda
    aggregation = choose_aggregation(option, layer, spec, module, weight, flipped, on_cuda)
    reduce_choice = choose_reduction(
        reduction, edges.collectives.world_size, resolved.target.direction, resolved.target.subset,
        resolved.sparse_values is not None, aggregation.reduce, spec.linear_before_aggregation(module),
        stored_input and feed != "steps",  # a steps layer's later propagations read computed rows
    )  # fmt: skip
    return LayerCall(
        layer=layer,
        cls=cls,
        edges=resolved.target,
        feed=feed,
        flipped=flipped,
        exact=bool(spec.caches) and bool(getattr(module, "cached", False)),
        dtype=dtype,
        weight=weight,
        normalization=norm,
        aggregation=aggregation,
        max_propagations=spec.max_propagations(module),
        sparse_values=resolved.sparse_values,
        edge_arguments=aligned,
        reduction=reduce_choice,
    )
