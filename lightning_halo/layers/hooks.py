r"""The hooks that run one PyG layer on a partition exactly, or refuse with the reason.

For every call of a hooked layer, the forward pre-hook builds a
:class:`~lightning_halo.layers.call.LayerCall` (the stages of :mod:`lightning_halo.layers.call`)
and applies it (:mod:`lightning_halo.layers.apply`): the node features get their halo rows,
the edges become those that compute the whole-graph result on the partition. The propagate
pre-hook counts propagations and, for ``"steps"`` layers, fetches each step's halo
(:mod:`lightning_halo.layers.propagate`). The forward hook cuts the output back to the inner rows.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor
from torch.nn import Module
from torch_geometric.nn import MessagePassing

from lightning_halo._compat.pyg import restore, switch_off
from lightning_halo._compat.torch import compiled_function, compiled_original
from lightning_halo.exchange import Direction, HaloExchanger
from lightning_halo.exchange.cover import CoverRoute
from lightning_halo.exchange.plan import type_plan_key
from lightning_halo.layers.aggregations import QuantileGuard, find_quantile_aggregations
from lightning_halo.layers.apply import LayerEdges, covered_edges, layer_edges, rewrite_arguments, with_halo
from lightning_halo.layers.around import AroundForward
from lightning_halo.layers.batchnorm import BatchNormHook, BoundRows, NormHook, find_batch_norms
from lightning_halo.layers.call import Aggregation, LayerCall, build_call, check_aggregation
from lightning_halo.layers.edges import PartitionEdges
from lightning_halo.layers.fused import FusedAdjacency
from lightning_halo.layers.graphnorm import GraphNormHook, find_graph_norms
from lightning_halo.layers.hetero import (
    HeteroRunning,
    RelationSource,
    RelationTools,
    check_propagation,
    cut_output,
    first_rows,
    relation_call,
    relation_step_inputs,
    types_call,
)
from lightning_halo.layers.normalize import gcn_weights
from lightning_halo.layers.propagate import count_propagation, step_inputs
from lightning_halo.layers.reduction import HaloReduction, check_halo_reduction
from lightning_halo.layers.registry import (
    COMPILE_REFUSAL,
    LayerSpec,
    Normalization,
    UnsupportedLayerError,
    clear_caches,
    layer_spec,
    recomputed_in_backward,
    refused_instance,
    refused_wrapper,
)
from lightning_halo.layers.relation_cover import TypeCover, build_type_cover, group_of, predict_member, relation_layers
from lightning_halo.memo import TensorMemo, WarnOnce
from lightning_halo.partition.halo_partition import HaloPartition
from lightning_halo.partition.hetero import EdgeType, HeteroHaloPartition

#: How a layer call on a heterogeneous partition runs, in the layer report.
HETERO_CALL = "heterogeneous partition: each source type's halo appended, PyG's own forward"


class LayerContext:
    """What the hooks of one model share: the exchange, the bound partition's edges, the options.

    Owned by :class:`~lightning_halo.HaloQuantStrategy`, which binds it to each new partition.

    Args:
        exchanger (HaloExchanger): the rank's exchange (its collectives are given to the layer calls).
        aggregation (str): ``"auto"``, ``"edge_index"`` or ``"sparse"`` (see the strategy).
        halo_reduction (str): ``"cover"`` or ``"none"`` (see the strategy).
    """

    def __init__(
        self, exchanger: HaloExchanger, aggregation: Aggregation = "auto", halo_reduction: HaloReduction = "cover"
    ) -> None:
        check_aggregation(aggregation)
        check_halo_reduction(halo_reduction)
        self.exchanger, self.aggregation, self.halo_reduction = exchanger, aggregation, halo_reduction
        self.collectives = exchanger.collectives
        self.edges: Optional[PartitionEdges] = None
        #: How each layer ran (fused or edge_index, and why), by layer name.
        self.choices: dict[str, str] = {}
        self.warn_once = WarnOnce()
        self.hetero: Optional[HeteroHaloPartition] = None
        # a source type's halo per tensor, this step only (layers.hetero): an older step's entries can never be
        # read again and would hold their blocks and autograd graphs (135 MB a step on a 4-part MAG-shaped graph)
        self._type_halos = TensorMemo(limit=256)
        self._halos_step = -1
        self._relation_norms = TensorMemo(limit=64)  # a relation's normalised edges per edge weights (layers.hetero)
        self._relation_adjs = TensorMemo(limit=64)  # a relation's fused adjacency per edges and weights
        self._relations: dict[str, tuple[Module, LayerSpec, EdgeType]] = {}  # edge-type modules (relation_cover)
        self.relation_tools = RelationTools(self.fetch_type, self.relation_norm, self.relation_adjacency, aggregation,
                                            self.relation_source)  # fmt: skip

    def set_relations(self, relations: dict[str, tuple[Module, LayerSpec, EdgeType]]) -> None:
        """The hooked edge-type modules of the model (:func:`~lightning_halo.layers.relation_cover.relation_layers`),
        whose layer's exchange of a source type carries the partial sums of each."""
        self._relations = dict(relations)

    def bind(self, part: HaloPartition | HeteroHaloPartition) -> None:
        self._type_halos.clear()
        self._relation_norms.clear()
        self._relation_adjs.clear()
        if isinstance(part, HeteroHaloPartition):
            self.edges, self.hetero = None, part
        else:
            self.edges, self.hetero = PartitionEdges(part, self.exchanger, self.collectives), None

    def begin_step(self) -> None:
        """A step begins: drop the halos the last one fetched (:meth:`fetch_type`), so they are not held through
        this step's forward."""
        self._step_halos()

    def end_step(self) -> None:
        """The step's backward is done: its fetched halos are not needed again (a synchronous run keeps no halo
        rows between steps)."""
        self._type_halos.clear()

    def _step_halos(self) -> TensorMemo:
        """The memo of this step's fetched halos, emptied when the exchanger's step has moved on."""
        if self._halos_step != self.exchanger.steps:
            self._type_halos.clear()
            self._halos_step = self.exchanger.steps
        return self._type_halos

    def release(self) -> None:
        """Let go of the bound partition's edges (at teardown)."""
        self.edges, self.hetero = None, None
        self._type_halos.clear()
        self._relation_norms.clear()
        self._relation_adjs.clear()

    def record(self, layer: str, how: str) -> None:
        """Note how ``layer`` ran (the strategy prints each change once, on rank 0)."""
        self.choices[layer] = how

    @property
    def bound(self) -> bool:
        return (self.edges is not None or self.hetero is not None) and self.exchanger.bound

    def norm_rows(self) -> Optional[BoundRows]:
        """What a batch or graph norm needs to be global (:class:`~lightning_halo.layers.batchnorm.BoundRows`):
        the all-reduce and the row counts of the partition's node sets (one per node type on a heterogeneous
        partition); ``None`` when nothing is to be shared (no partition bound, or one process)."""
        if not self.exchanger.active:
            return None
        if self.hetero is not None:
            part = self.hetero
            counts = {t: (int(part[t].n_inner), int(part[t].num_nodes)) for t in part.node_types}
            return BoundRows(self.collectives.all_sum, frozenset(n for n, _ in counts.values()),
                             {local: f"type {t!r}" for t, (n, local) in counts.items() if local > n})  # fmt: skip
        plan = self.exchanger.plan()
        local = {plan.n_inner + plan.n_halo: ""} if plan.n_halo else {}
        return BoundRows(self.collectives.all_sum, frozenset([plan.n_inner]), local)

    def fetch(
        self, x_inner: Tensor, layer: str, direction: Direction, exact: bool, route: Optional[CoverRoute] = None
    ) -> Tensor:
        """The halo rows of ``x_inner`` (differentiable): the route's block with partial sums, if given."""
        return self.exchanger.fetch(x_inner, layer, direction=direction, exact=exact, route=route)

    def fetch_type(self, x_inner: Tensor, node_type: str, group: str) -> Tensor:
        """The halo rows of ``x_inner`` (rows of ``node_type``), fetched once per tensor and step however many
        relations read them; named ``group[node_type]`` in the traffic and the slots."""
        key = (self.exchanger.steps, node_type)
        hit = self._step_halos().get(key, (x_inner,))
        if hit is None:
            halo = self.exchanger.fetch(x_inner, f"{group}[{node_type}]", direction=type_plan_key(node_type))  # type: ignore[arg-type]
            hit = self._step_halos().put(key, (x_inner,), halo)
        return hit


    def fetch_step(self, rows: Tensor, node_type: str, step: str) -> Tensor:
        """The halo rows of one propagation of a ``"steps"`` layer on a relation (``rows``: the type's inner rows it
        reads), named ``step[node_type]``: every step its own exchange, not shared with other relations."""
        return self.exchanger.fetch(rows, f"{step}[{node_type}]", direction=type_plan_key(node_type))  # type: ignore[arg-type]

    def relation_source(
        self, x_inner: Tensor, edge_type: EdgeType, group: str, layer: str, reduce: Optional[str]
    ) -> RelationSource:
        """What relation ``layer`` appends to its source rows ``x_inner``: the layer's exchange of the source type
        carries partial sums where ``halo_reduction="cover"`` and a relation of the layer aggregates linearly
        (:mod:`~lightning_halo.layers.relation_cover`), else the type's halo rows (:meth:`fetch_type`)."""
        node_type = edge_type[0]
        plain = self._step_halos().get((self.exchanger.steps, node_type), (x_inner,))
        if plain is not None:  # this step fetched these rows already: nothing more crosses
            return RelationSource(plain)
        covered = self._type_cover(x_inner, node_type, group)
        if covered is None:
            return RelationSource(self.fetch_type(x_inner, node_type, group))
        cover, block = covered
        member = cover.members.get(layer)
        direction = type_plan_key(node_type)
        if member is None or member.edge_type != tuple(edge_type) or (member.reduce is not None and member.reduce != reduce):
            # not the call its layer's exchange was built for (all ranks alike): its own rows, exact
            halo = self.exchanger.fetch(x_inner, f"{layer}[{node_type}]", direction=direction)  # type: ignore[arg-type]
            return RelationSource(halo, how=f"rows of its own ({layer}[{node_type}]): not the call of the layer's "
                                            "partial-sum exchange (other edges, weights or aggregation)")  # fmt: skip
        if member.reduce is None:
            return RelationSource(cover.halo(block), how=f"rows ({member.why})")
        part = self.hetero
        assert part is not None
        n_rows, n_src = int(part[edge_type[-1]].n_inner), int(part[node_type].num_nodes)
        relation, red, dtype = self._covered_relation_adjacency(part), member.reduce, x_inner.dtype

        def adjacency(n_dst: int) -> Tensor:
            return cover.adjacency(layer, n_dst, n_rows, lambda: relation(edge_type, n_rows, n_src, red, dtype), dtype)

        return RelationSource(block, adjacency, how=f"partial sums ({group}[{node_type}]: {cover.block} rows, "
                                                    f"{cover.plan.n_halo} halo rows)")  # fmt: skip

    def _type_cover(self, x_inner: Tensor, node_type: str, group: str) -> Optional[tuple[TypeCover, Tensor]]:
        """The block of ``group``'s partial-sum exchange of ``node_type``, once per tensor and step; ``None`` where it
        has none (``halo_reduction="none"``, one process, input features whose halo is held, or no relation of the
        layer that reads the type aggregates linearly). Decided alike on every rank."""
        ex, part = self.exchanger, self.hetero
        if self.halo_reduction != "cover" or ex.world_size == 1 or part is None or ex.holds_input(x_inner):
            return None
        key = (ex.steps, node_type, group, "cover")
        hit = self._step_halos().get(key, (x_inner,))
        if hit is not None:
            return hit
        members = [
            predict_member(name, module, spec, et, self.aggregation, self.halo_reduction, ex.world_size, x_inner.is_cuda)
            for name, (module, spec, et) in self._relations.items()
            if group_of(name) == group and et[0] == node_type and spec.kind not in ("steps", "types")
            and et in part.edge_types
        ]  # fmt: skip
        if not any(m.reduce is not None for m in members):
            return None
        dtype, device = x_inner.dtype, x_inner.device
        direction = type_plan_key(node_type)

        def build() -> TypeCover:
            exchange = lambda chunks: self.collectives.all_to_all_rows(chunks, f"{group}[{node_type}]")  # noqa: E731
            return build_type_cover(
                part, node_type, members, ex.plan(direction), self._covered_relation_adjacency(part), dtype, device,  # type: ignore[arg-type]
                exchange,
            )  # fmt: skip

        cover = ex.partition_value(f"relation-cover:{group}[{node_type}]:{dtype}:{device}", build)
        block = ex.fetch(x_inner, f"{group}[{node_type}]", direction=direction, route=cover.route)  # type: ignore[arg-type]
        return self._step_halos().put(key, (x_inner,), (cover, block))

    @staticmethod
    def _covered_relation_adjacency(part: HeteroHaloPartition):  # noqa: ANN205
        def adjacency(edge_type: EdgeType, n_dst: int, n_src: int, reduce: str, dtype: torch.dtype) -> Tensor:
            return FusedAdjacency.build(part[edge_type].edge_index, None, n_dst, n_src, reduce, dtype)  # type: ignore[arg-type]

        return adjacency

    def relation_norm(
        self, layer: str, edge_type: tuple[str, str, str], edge_index: Tensor, weight: Optional[Tensor],
        norm: Normalization, dtype: torch.dtype,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        """A relation's normalised local edges (within one type): its halo nodes' degrees in the relation come
        from their owners through the type's plan (32 bits, ``aux`` traffic); kept per relation and weights."""
        if norm.rule != "gcn":
            raise UnsupportedLayerError(f"layer '{layer}': a {norm.rule!r} normalisation on a relation is not supported")
        key = ("norm", tuple(edge_type), norm, dtype)
        hit = self._relation_norms.get(key, (edge_index, weight))
        if hit is not None:
            return hit
        plan = self.exchanger.plan(type_plan_key(edge_type[0]))
        assert self.hetero is not None
        n_inner, n_local = int(self.hetero[edge_type[0]].n_inner), int(self.hetero[edge_type[0]].num_nodes)
        with torch.no_grad():
            out = gcn_weights(
                edge_index, weight, n_inner, n_local, improved=norm.improved, add_self_loops=norm.add_self_loops,
                to_halo=lambda v: self.collectives.to_halo(v, plan, f"{layer}[{edge_type[0]}]"), dtype=dtype,
            )  # fmt: skip
        return self._relation_norms.put(key, (edge_index, weight), out)

    def relation_adjacency(
        self, edge_type: tuple[str, str, str], edge_index: Tensor, weight: Optional[Tensor], n_dst: int, n_src: int,
        reduce: str, dtype: torch.dtype,
    ) -> Tensor:  # fmt: skip
        """A relation's fused adjacency ``[n_dst, n_src]`` (kept per edges, weights, shape and aggregation)."""
        key = ("adj", tuple(edge_type), n_dst, n_src, reduce, dtype)
        hit = self._relation_adjs.get(key, (edge_index, weight))
        if hit is None:
            with torch.no_grad():
                adj = FusedAdjacency.build(edge_index, weight, n_dst, n_src, reduce, dtype)  # type: ignore[arg-type]
            hit = self._relation_adjs.put(key, (edge_index, weight), adj)
        return hit


_SIGNATURES: dict[type, inspect.Signature] = {}


def _signature(module: Module) -> inspect.Signature:
    cls = type(module)
    if cls not in _SIGNATURES:
        _SIGNATURES[cls] = inspect.signature(module.forward)
    return _SIGNATURES[cls]


@dataclass
class _Running:
    """One running call: its decisions, what its propagations get, and a flag to put back."""

    call: LayerCall
    propagate_edges: Optional[LayerEdges] = None  # renormalising layers: every propagate gets these edges
    restore: Optional[tuple[str, Any]] = None
    route: Optional[CoverRoute] = None  # its halo arrives with partial sums
    propagations: int = 0


class _FirstCachedCall:
    """A ``cached=True`` layer must see the edges and weights of its first call every time.

    PyG normalises on the first call and reuses that result, edges included, on every later
    one; lightning-halo normalises each call, so a change would be honoured here and ignored
    on one process. Refused instead of differing.
    """

    def __init__(self) -> None:
        self.seen: Optional[tuple[Direction, Optional[Tensor]]] = None

    def check(self, call: LayerCall) -> None:
        if call.edges.subset:
            raise UnsupportedLayerError(
                f"layer '{call.layer}' ({call.cls}) has cached=True and was given the edges lightning_halo.dropout_edge "
                "kept: PyG would reuse the first call's normalised edges for every later draw. Set cached=False."
            )
        weight = call.weight
        if self.seen is None:
            self.seen = (call.direction, None if weight is None else weight.detach().clone())
            return
        direction, w0 = self.seen
        same_weight = (weight is None and w0 is None) or (
            weight is not None and w0 is not None and weight.shape == w0.shape and torch.equal(weight.detach(), w0)
        )
        if direction != call.direction or not same_weight:
            what = "edges" if direction != call.direction else "edge weights"
            raise UnsupportedLayerError(
                f"layer '{call.layer}' ({call.cls}) has cached=True and was called with other {what} than on its "
                "first call: PyG reuses the first call's normalised edges and weights on every later call, so on one "
                "process these would be ignored. Set cached=False when edges or weights change between calls."
            )


class LayerHook:
    """The hooks of one message-passing layer (see the module docstring).

    Args:
        module: the message-passing layer.
        name: its qualified name in the model (for traffic accounting and errors).
        spec: its :class:`~lightning_halo.layers.registry.LayerSpec`.
        ctx: the shared :class:`LayerContext`.
    """

    def __init__(self, module: Module, name: str, spec: LayerSpec, ctx: LayerContext) -> None:
        self.module, self.name, self.spec, self.ctx = module, name, spec, ctx
        self.kind = spec.kind
        self._stack: list[Optional[_Running | HeteroRunning]] = []
        self._hetero_propagations = 0
        self._handles: list[Any] = []
        self._guards: list[QuantileGuard] = []
        self._first_cached = _FirstCachedCall()
        sig = _signature(module)
        if spec.kind == "types":
            if "x_dict" not in sig.parameters or "edge_index_dict" not in sig.parameters:
                raise UnsupportedLayerError(f"{type(module).__name__}.forward must take x_dict and edge_index_dict")
        elif "x" not in sig.parameters or "edge_index" not in sig.parameters:
            raise UnsupportedLayerError(
                f"{type(module).__name__}.forward must take arguments named `x` and `edge_index` to be partitioned."
            )

    def install(self) -> LayerHook:
        clear_caches(self.module)
        self._handles = [
            self.module.register_forward_pre_hook(self._pre, with_kwargs=True),
            self.module.register_forward_hook(self._post, with_kwargs=True, always_call=True),
            self.module.register_propagate_forward_pre_hook(self._propagate),  # type: ignore[operator]
        ]
        # PyG's quantile aggregations fail where a call's first node has no message: on partitions that can be any
        self._guards = [QuantileGuard(a, lambda: self.ctx.bound).install() for a in find_quantile_aggregations(self.module)]
        return self

    def remove(self) -> None:
        for h in [*self._handles, *self._guards]:
            h.remove()
        self._handles, self._guards = [], []
        self._first_cached = _FirstCachedCall()
        clear_caches(self.module)  # a partition's partial results must not outlive the run

    # ------------------------------------------------------------------ forward pre-hook
    def _pre(self, module: Module, args: tuple, kwargs: dict) -> Optional[tuple[tuple, dict]]:
        ctx = self.ctx
        if not ctx.bound:
            self._stack.append(None)
            return None
        bound = _signature(module).bind(*args, **kwargs)
        if ctx.hetero is not None:
            return self._pre_hetero(module, bound, ctx.hetero)
        if self.kind == "types":
            raise UnsupportedLayerError(
                f"layer '{self.name}' ({type(module).__name__}) takes dicts of node and edge types: train it on a "
                "heterogeneous graph (HaloDataModule(hetero_data))"
            )
        assert ctx.edges is not None
        stored = ctx.exchanger.holds_input(bound.arguments.get("x"))
        call = build_call(self.name, module, self.spec, bound.arguments, ctx.edges, ctx.aggregation, ctx.halo_reduction, stored)
        if call is None:
            ctx.warn_once(
                ("unknown-edges", self.name),
                f"lightning-halo: layer '{self.name}' runs on an edge set that is not the partition's "
                "batch.edge_index; that is exact on one process, but would be refused on several (a partition holds "
                "only the in-edges of its own nodes).",
                stacklevel=4,
            )
            self._stack.append(None)
            return None
        if call.normalization is not None and getattr(module, "cached", False):
            self._first_cached.check(call)
        self._stack.append(self._apply(module, call, bound.arguments))
        ctx.record(self.name, call.describe())
        return bound.args, bound.kwargs

    def _pre_hetero(self, module: Module, bound: inspect.BoundArguments, part: HeteroHaloPartition) -> Optional[tuple[tuple, dict]]:
        ctx = self.ctx
        world = ctx.exchanger.world_size
        if self.kind == "types":
            running = types_call(
                self.name, module, self.spec, bound.arguments, part, world, ctx.fetch_type, ctx.collectives.all_sum
            )
        else:
            running = relation_call(self.name, module, self.spec, bound.arguments, part, world, ctx.relation_tools)
        self._stack.append(running)
        if running is None:
            return None
        self._hetero_propagations = 0
        if running.semantic is not None:
            running.semantic.open()
        ctx.record(self.name, HETERO_CALL if self.kind == "types" else f"{HETERO_CALL}; aggregation {running.how}")
        return bound.args, bound.kwargs

    def _apply(self, module: Module, call: LayerCall, arguments: dict) -> _Running:
        """Rewrite ``arguments`` (the features with their halo, the edges) as ``call`` says."""
        ctx, spec = self.ctx, self.spec
        assert ctx.edges is not None

        plan = ctx.exchanger.plan(call.direction)
        edges = layer_edges(call, arguments["edge_index"], ctx.edges, ctx.collectives, plan)
        route = None
        if call.reduction.cover:
            edges, route = covered_edges(call, edges, ctx.exchanger)

        def fetch(rows: Tensor) -> Tensor:
            return ctx.fetch(rows, self.name, call.direction, call.exact, route)

        arguments["x"] = with_halo(arguments["x"], call.feed, fetch)
        takes_weight = spec.weight_arg is not None and spec.weight_arg in _signature(module).parameters
        propagate_edges = rewrite_arguments(call, spec, arguments, edges, takes_weight)
        restore_flag = None
        if spec.switch is not None and call.normalization is not None:
            restore_flag = (spec.switch, switch_off(module, spec.switch))  # our weights are final already
        return _Running(call, propagate_edges, restore_flag, route)

    # ------------------------------------------------------------------ propagate pre-hook
    def _propagate(self, module: Module, inputs: tuple) -> Optional[tuple]:
        running = self._stack[-1] if self._stack else None
        if running is None:
            return None
        if isinstance(running, HeteroRunning):
            self._hetero_propagations += 1
            check_propagation(running, self._hetero_propagations)
            if running.steps is None:
                return None
            edge_index, _, kwargs = inputs
            return relation_step_inputs(running, module, edge_index, kwargs, self._hetero_propagations, self.ctx.fetch_step)
        edge_index, size, kwargs = inputs
        call = running.call
        running.propagations += 1
        count_propagation(call, self.kind, running.propagations)
        if running.propagate_edges is not None:
            edge_index = running.propagate_edges.edge_index
            kwargs = {**kwargs, self.spec.weight_kwarg: running.propagate_edges.weight}
        if call.feed == "steps":
            step = f"{self.name}#{running.propagations}"

            def fetch(rows: Tensor, name: str) -> Tensor:
                return self.ctx.fetch(rows, name, call.direction, call.exact, running.route)

            return step_inputs(call, module, step, edge_index, kwargs, fetch)
        return None if running.propagate_edges is None else (edge_index, size, kwargs)

    # ------------------------------------------------------------------ forward hook
    def _post(self, module: Module, args: tuple, kwargs: dict, output: Any) -> Any:
        running = self._stack.pop() if self._stack else None
        if running is None:
            return None
        if isinstance(running, HeteroRunning):
            if running.restore is not None:
                restore(module, *running.restore)
            if running.semantic is not None:
                running.semantic.close(failed=output is None)  # None: the forward raised (always_call)
            return cut_output(running, output)
        if running.restore is not None:
            restore(module, *running.restore)
        return first_rows(output, running.call.keep_rows)


def find_message_passing(model: Module) -> OrderedDict[str, Module]:
    """Outermost :class:`MessagePassing` modules of ``model`` by qualified name.

    A message-passing module nested inside another one is the outer layer's business.
    """
    found: OrderedDict[str, Module] = OrderedDict()
    for name, module in model.named_modules():
        if isinstance(module, MessagePassing) and not any(name.startswith(p + ".") for p in found):
            found[name or type(module).__name__] = module
    return found


def check_model(model: Module, require_layers: bool = True) -> OrderedDict[str, LayerSpec]:
    """The spec of every layer of ``model``, or the error that refuses it (no partition needed).

    Args:
        model: the model.
        require_layers: refuse a model without message-passing layers (off before
            ``configure_model`` has run, which may still build them).

    Raises:
        UnsupportedLayerError: naming the first layer (or wrapper module) that cannot run on partitions.
    """
    for name, module in model.named_modules():
        methods = [m for m in ("forward", "training_step", "validation_step", "test_step", "predict_step")
                   if compiled_function(getattr(module, m, None))]  # fmt: skip
        if methods and find_message_passing(module):
            raise UnsupportedLayerError(
                f"'{name or type(model).__name__}.{methods[0]}' is compiled with torch.compile and reaches message-passing "
                f"layers: {COMPILE_REFUSAL}"
            )
        inner = compiled_original(module)
        if inner is not None and find_message_passing(inner):
            raise UnsupportedLayerError(
                f"'{name or type(model).__name__}' was compiled with torch.compile and holds message-passing layers: "
                f"{COMPILE_REFUSAL}"
            )
        why = refused_wrapper(module)
        if why is not None:
            raise UnsupportedLayerError(f"'{name}' ({type(module).__name__}) cannot run on graph partitions: {why}.")
    layers = find_message_passing(model)
    for name, layer in layers.items():
        layer_spec(layer)  # an unknown or refused class first: its error says more
        why = refused_instance(layer)
        if why is not None:
            raise UnsupportedLayerError(f"layer '{name}' ({type(layer).__name__}) cannot run on graph partitions: {why}.")
    if not layers and require_layers:
        raise UnsupportedLayerError(
            f"{type(model).__name__} has no torch_geometric MessagePassing layer (GCNConv, SAGEConv, ...): "
            "HaloQuantStrategy partitions the graph between processes, which only makes sense for a GNN. "
            "For other models use strategy='ddp'."
        )
    return OrderedDict((name, layer_spec(layer)) for name, layer in layers.items())


class RecomputeHook(AroundForward):
    """Marks the forward of a block that runs its layers without autograd and again in backward
    (:func:`~lightning_halo.layers.registry.recomputed_in_backward`: ``GroupAddRev``, ``DeepGCNLayer(ckpt_grad=True)``).

    The exchange then takes its layers' fetches as training exchanges at the run's widths, and the calls in backward
    replay their rows (:mod:`lightning_halo.exchange.replay`). Only where the block itself is called with gradients in
    a training step: under an outer ``torch.no_grad()`` no backward follows.
    """

    kind = "recomputed"

    def __init__(self, module: Module, name: str, ctx: LayerContext) -> None:
        super().__init__(module)
        self.name, self.ctx = name, ctx
        self._entered: list[bool] = []

    def _pre(self, module: Module, args: tuple) -> None:
        entered = torch.is_grad_enabled() and self.ctx.exchanger.training
        if entered:
            self.ctx.exchanger.begin_recomputed()
        self._entered.append(entered)

    def _post(self, module: Module, args: tuple, output: Any) -> None:
        if self._entered.pop():
            self.ctx.exchanger.end_recomputed()


def install_hooks(model: Module, ctx: LayerContext) -> list[LayerHook | RecomputeHook]:
    """Hook every outermost message-passing layer of ``model`` (after :func:`check_model`), and every block that
    recomputes such layers in backward (:class:`RecomputeHook`)."""
    specs = check_model(model)
    layers = find_message_passing(model)
    relations = relation_layers(model, layers)
    ctx.set_relations({name: (layers[name], specs[name], et) for name, et in relations.items()})
    hooks: list[LayerHook | RecomputeHook] = [LayerHook(layers[name], name, spec, ctx).install() for name, spec in specs.items()]
    return hooks + [RecomputeHook(m, name, ctx).install() for name, m in model.named_modules() if recomputed_in_backward(m)]


def install_batch_norms(model: Module, ctx: LayerContext) -> list[NormHook]:
    """Make every batch norm of ``model``, and every graph-wide PyG norm, normalise over the nodes of all
    partitions (:mod:`lightning_halo.layers.batchnorm`, :mod:`lightning_halo.layers.graphnorm`)."""
    hooks: list[NormHook] = [
        BatchNormHook(module, name, ctx.norm_rows).install() for name, module in find_batch_norms(model).items()
    ]
    return hooks + [GraphNormHook(module, name, ctx.norm_rows).install() for name, module in find_graph_norms(model).items()]
