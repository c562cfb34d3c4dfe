r"""Hooks that run one PyG layer on a partition exactly, or refuse with the reason.

For every call of a hooked layer, the forward pre-hook

1. checks the edges it was given (:class:`~lightning_halo.layers.edges.PartitionEdges`): the
   partition's ``edge_index``, its reverse, or its sparse adjacency, else it refuses;
2. feeds the node features as the layer's kind needs (halo rows appended, fetched from their
   owners; see :mod:`lightning_halo.layers.registry`);
3. replaces the edges by what computes the whole-graph result on the partition: globally
   normalised weights where the layer normalises, and a :class:`~lightning_halo.layers.fused.FusedAdjacency`
   where the layer can aggregate with the fused sparse kernel.

A propagate pre-hook counts the layer's propagations (more than declared is refused) and,
for layers that propagate several times (kind ``"steps"``), fetches the halo rows of what each
step propagates. The forward hook cuts the output back to the inner rows.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch
from torch import Tensor
from torch.nn import Module
from torch_geometric.nn import MessagePassing

from lightning_halo.exchange import HaloExchanger
from lightning_halo.layers import normalize
from lightning_halo.layers.edges import EdgeSet, PartitionEdges, UnsupportedEdgesError
from lightning_halo.layers.fused import FusedAdjacency
from lightning_halo.layers.registry import (
    LayerSpec,
    Norm,
    UnsupportedLayerError,
    class_propagate_fuses,
    clear_caches,
    layer_spec,
    refused_instance,
    refused_wrapper,
)
from lightning_halo.partition.halo_partition import HaloPartition

log = logging.getLogger(__name__)

Aggregation = Literal["auto", "edge_index", "sparse"]
AGGREGATIONS: tuple[str, ...] = ("auto", "edge_index", "sparse")


class LayerContext:
    """What the hooks of one model share: the exchange, the bound partition's edges, the options.

    Owned by :class:`~lightning_halo.HaloQuantStrategy`, which binds it to each new partition.

    Args:
        exchanger (HaloExchanger): the rank's exchange.
        aggregation (str): ``"auto"``, ``"edge_index"`` or ``"sparse"`` (see the strategy).
    """

    def __init__(self, exchanger: HaloExchanger, aggregation: Aggregation = "auto") -> None:
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
        self.exchanger, self.aggregation = exchanger, aggregation
        self.edges: Optional[PartitionEdges] = None
        self.choices: dict[str, str] = {}  # layer -> how it ran (logged once)
        self._said: set[Any] = set()

    def bind(self, part: HaloPartition) -> None:
        self.edges = PartitionEdges(part, self.exchanger)

    @property
    def bound(self) -> bool:
        return self.edges is not None and self.exchanger.bound

    def choose(self, layer: str, text: str) -> None:
        if self.choices.get(layer) != text:
            self.choices[layer] = text
            log.info("lightning-halo: layer '%s' runs %s", layer, text)

    def warn_once(self, key: Any, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            warnings.warn(message, stacklevel=4)

    # ------------------------------------------------------------------ exact edge weights
    def normalized(
        self, edges: EdgeSet, norm: Norm, weight: Optional[Tensor], sparse_rule: bool, dtype: torch.dtype, layer: str
    ) -> tuple[Tensor, Tensor]:
        """The layer's normalised edges on this partition (memoised per edge set)."""
        key = ("norm", norm, None if weight is None else (id(weight), weight._version), sparse_rule, dtype)
        hit = edges.memo.get(key)
        if hit is not None and (weight is None or hit[0] is weight):
            return hit[1]
        ex, plan = self.exchanger, edges.key
        ei = self.edges.sparse_edges() if sparse_rule else edges.edge_index  # type: ignore[union-attr]

        def to_halo(v: Tensor) -> Tensor:
            return ex.exchange_constant(v, layer, plan=plan)

        def to_owners(v: Tensor) -> Tensor:
            return ex.reduce_to_owners(v, layer, plan=plan)

        with torch.no_grad():
            if norm.kind == "gcn":
                out = normalize.gcn_weights(
                    ei, weight, edges.n_inner, edges.n_src, improved=norm.improved, add_self_loops=norm.add_self_loops,
                    to_halo=to_halo, loops="all" if sparse_rule else "remaining", dtype=dtype,
                )  # fmt: skip
            elif norm.kind == "cheb":
                out = normalize.laplacian_weights(
                    ei, weight, edges.n_inner, edges.n_src, normalization=norm.normalization,  # type: ignore[arg-type]
                    lambda_max=norm.lambda_max, to_halo=to_halo, to_owners=to_owners,
                    global_max=lambda t: ex.global_max(t, layer), dtype=dtype,
                )  # fmt: skip
            else:
                out = normalize.cluster_gcn_weights(ei, edges.n_inner, diag_lambda=norm.diag_lambda, dtype=dtype)
        edges.remember(key, (weight, out))
        return out

    def wrapped(self, edges: EdgeSet, user: Tensor) -> FusedAdjacency:
        """A user's sparse adjacency as a :class:`FusedAdjacency` (memoised: its transposes are built once)."""
        key = ("wrapped", id(user), user._version)
        hit = edges.memo.get(key)
        if hit is not None and hit[0] is user:
            return hit[1]
        adj = FusedAdjacency.wrap(user if user.layout == torch.sparse_csr else user.to_sparse_csr())
        edges.remember(key, (user, adj))
        return adj

    def fused(
        self, edges: EdgeSet, ei: Tensor, weight: Optional[Tensor], n_dst: int, reduce: str, dtype: torch.dtype, tag: Any
    ) -> FusedAdjacency:
        """The fused adjacency of ``(ei, weight)`` (memoised per edge set and ``tag``)."""
        key = ("fused", tag, n_dst, reduce, dtype, None if weight is None else (id(weight), weight._version))
        hit = edges.memo.get(key)
        if hit is not None and (weight is None or hit[0] is weight):
            return hit[1]
        with torch.no_grad():
            adj = FusedAdjacency.build(ei, weight, n_dst, edges.n_src, reduce, dtype)
        edges.remember(key, (weight, adj))
        return adj


_SIGNATURES: dict[type, inspect.Signature] = {}


def _signature(module: Module) -> inspect.Signature:
    cls = type(module)
    if cls not in _SIGNATURES:
        _SIGNATURES[cls] = inspect.signature(module.forward)
    return _SIGNATURES[cls]


@dataclass
class _Active:
    """One running call of a hooked layer."""

    feed: str
    n_inner: int
    plan: str
    cut: int  # rows to keep of the output (-1: keep all)
    max_props: Optional[int]
    restore: Optional[tuple[str, Any]] = None
    props: int = 0
    prop_edges: Any = None  # renormalising layers: the edges every propagate gets instead of theirs
    prop_weight: Any = None
    fused: bool = False
    exact: bool = False
    t2s: bool = False
    passthrough: bool = False


def _fetch_along(ex: HaloExchanger, t: Tensor, node_dim: int, layer: str, plan: str, exact: bool) -> Tensor:
    """``t`` (inner rows along ``node_dim``) with its halo rows appended along that dimension."""
    dim = node_dim % t.dim()
    moved = t.movedim(dim, 0)
    halo = ex.fetch(moved, layer, plan=plan, exact=exact)
    return torch.cat([moved, halo], dim=0).movedim(0, dim)


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
        self._stack: list[Optional[_Active]] = []
        self._handles: list[Any] = []
        self._cached_first: Optional[tuple[str, Optional[Tensor]]] = None  # cached=True: its first call's edges
        sig = _signature(module)
        if "x" not in sig.parameters or "edge_index" not in sig.parameters:
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
        return self

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._cached_first = None
        clear_caches(self.module)  # a partition's partial results must not outlive the run

    @property
    def _cls(self) -> str:
        return type(self.module).__name__

    # ------------------------------------------------------------------ forward pre-hook
    def _pre(self, module: Module, args: tuple, kwargs: dict) -> Optional[tuple[tuple, dict]]:
        ctx = self.ctx
        if not ctx.bound:
            self._stack.append(None)
            return None
        if torch.compiler.is_compiling():
            raise UnsupportedLayerError(
                f"layer '{self.name}' is being compiled (torch.compile): PyG skips its propagate hooks when compiling, so "
                "lightning-halo could not exchange halos per step nor check the layer. Train without torch.compile."
            )
        ex = ctx.exchanger
        bound = _signature(module).bind(*args, **kwargs)
        arguments = bound.arguments
        if arguments.get("size") is not None:
            raise ValueError(f"layer '{self.name}' was called with size=...; lightning-halo sets sizes itself, drop it.")
        assert ctx.edges is not None
        res = ctx.edges.resolve(arguments["edge_index"], self.name)
        if not res.known:  # world size 1: the partition is the whole graph, so any edge set is exact
            ctx.warn_once(
                ("unknown-edges", self.name),
                f"lightning-halo: layer '{self.name}' runs on an edge set that is not the partition's batch.edge_index; "
                "that is exact on one process, but would be refused on several (a partition holds only the in-edges "
                "of its own nodes).",
            )
            self._stack.append(_Active("passthrough", 0, "in", -1, None, passthrough=True))
            return None
        assert res.edges is not None
        t2s = getattr(module, "flow", "source_to_target") == "target_to_source"
        target = res.edges
        if t2s:  # it aggregates at edge_index[0]: the other direction's edges, handed over flipped
            if res.sparse:
                raise UnsupportedLayerError(
                    f"layer '{self.name}' has flow='target_to_source', which PyG does not run on a sparse adjacency."
                )
            target = ctx.edges.sets["in"] if target.key == "out" else ctx.edges.out_edges(self.name)
        self._align_edge_args(arguments, res.edges, target)
        feed = self.spec.feeding(module)
        if t2s and feed == "bipartite":
            feed = "full"  # PyG reverses pair semantics under target_to_source; full input needs none
        spec, plan = self.spec, target.key
        n_inner, n_src = target.n_inner, target.n_src
        exact = bool(spec.caches) and bool(getattr(module, "cached", False))
        act = _Active(feed, n_inner, plan, n_inner if feed == "full" else -1, spec.max_propagations(module), t2s=t2s)
        act.exact = exact

        # -- node features
        x = arguments["x"]
        if feed == "steps":
            if not isinstance(x, Tensor):
                raise TypeError(f"layer '{self.name}': node features must be one tensor, got {type(x).__name__}")
            self._check_rows(x.movedim(getattr(module, "node_dim", -2) % x.dim(), 0), n_inner, "x")
            dtype = x.dtype
        elif isinstance(x, Tensor):
            self._check_rows(x, n_inner, "x")
            x_full = torch.cat([x, ex.fetch(x, self.name, plan=plan, exact=exact)], dim=0)
            arguments["x"] = (x_full, x) if feed == "bipartite" else x_full
            dtype = x.dtype
        elif isinstance(x, (tuple, list)) and len(x) == 2:
            if feed != "bipartite":
                raise UnsupportedLayerError(
                    f"layer '{self.name}' ({self._cls}) was called with a tuple (x_src, x_dst), but it does not take "
                    "bipartite input here; call it with a single node-feature tensor."
                )
            x_src, x_dst = x
            if not isinstance(x_src, Tensor):
                raise TypeError(f"layer '{self.name}': x_src must be a tensor, got {type(x_src).__name__}")
            self._check_rows(x_src, n_inner, "x_src")
            if x_dst is not None:
                self._check_rows(x_dst, n_inner, "x_dst")
            arguments["x"] = (torch.cat([x_src, ex.fetch(x_src, self.name, plan=plan, exact=exact)], dim=0), x_dst)
            dtype = x_src.dtype
        else:
            raise TypeError(
                f"layer '{self.name}': node features must be a tensor [n_inner, d] or a pair (x_src, x_dst), "
                f"got {type(x).__name__}"
            )
        if not dtype.is_floating_point:
            dtype = torch.get_default_dtype()

        # -- edges: exact weights, fused kernel
        weight = arguments.get(spec.weight_arg) if spec.weight_arg else None
        if res.sparse:
            weight = res.sparse_values
        norm = spec.norm(module, arguments) if spec.norm is not None else None
        if norm is not None and norm.kind == "cheb" and t2s:
            raise UnsupportedLayerError(f"layer '{self.name}': ChebConv with flow='target_to_source' is not supported.")
        if norm is not None and weight is not None and weight.requires_grad:
            raise UnsupportedLayerError(
                f"layer '{self.name}': learned edge weights with a normalisation would need gradients of remote "
                "degrees; normalise yourself and switch the layer's normalisation off (e.g. normalize=False)."
            )
        if norm is not None and getattr(module, "cached", False):
            self._check_cached(target.key, weight)
        n_dst = n_src if feed == "full" else n_inner
        reduce, why = self._fused_reduce(module, weight, t2s, x)
        canonical = ctx.edges.sparse_edges() if res.sparse else target.edge_index
        if norm is not None:
            ei, w = ctx.normalized(target, norm, weight, res.sparse, dtype, self.name)
            if reduce is not None:
                edges_for_layer, w_for_layer = ctx.fused(target, ei, w, n_dst, "sum", dtype, ("norm", norm)), None
            else:
                edges_for_layer, w_for_layer = (ei.flip(0) if t2s else ei), w
        elif res.sparse:
            user = arguments["edge_index"]
            if reduce is not None:
                edges_for_layer = (
                    ctx.wrapped(target, user)
                    if n_dst == n_inner
                    else ctx.fused(target, canonical, weight, n_dst, "sum", dtype, ("user", id(user)))
                )
            else:
                edges_for_layer = user
            w_for_layer = None
        elif reduce is not None:
            edges_for_layer = ctx.fused(target, canonical, weight, n_dst, reduce, dtype, "raw")
            w_for_layer = None
        else:
            edges_for_layer = canonical.flip(0) if t2s else canonical
            w_for_layer = weight
        act.fused = reduce is not None
        if spec.renormalizes and norm is not None:
            act.prop_edges, act.prop_weight = edges_for_layer, w_for_layer
            arguments["edge_index"] = torch.empty(2, 0, dtype=torch.long, device=canonical.device)
            if spec.weight_arg in arguments:
                arguments[spec.weight_arg] = None
        else:
            arguments["edge_index"] = edges_for_layer
            if spec.weight_arg and (spec.weight_arg in arguments or w_for_layer is not None):
                if spec.weight_arg in _signature(module).parameters:
                    arguments[spec.weight_arg] = w_for_layer
        if spec.switch is not None and norm is not None:
            act.restore = (spec.switch, getattr(module, spec.switch))
            setattr(module, spec.switch, False)  # our weights are final already
        ctx.choose(self.name, self._describe(act, reduce, why, norm))
        self._stack.append(act)
        return bound.args, bound.kwargs

    def _check_cached(self, edges: str, weight: Optional[Tensor]) -> None:
        """A ``cached=True`` layer must see the edges and weights of its first call every time.

        PyG normalises on the first call and reuses that result, edges included, on every later
        one; lightning-halo normalises each call, so a change would be honoured here and ignored
        on one process. Refused instead of differing.
        """
        seen = self._cached_first
        if seen is None:
            self._cached_first = (edges, None if weight is None else weight.detach().clone())
            return
        w0 = seen[1]
        same_weight = (weight is None and w0 is None) or (
            weight is not None and w0 is not None and weight.shape == w0.shape and torch.equal(weight.detach(), w0)
        )
        if seen[0] != edges or not same_weight:
            what = "edges" if seen[0] != edges else "edge weights"
            raise UnsupportedLayerError(
                f"layer '{self.name}' ({self._cls}) has cached=True and was called with other {what} than on its "
                "first call: PyG reuses the first call's normalised edges and weights on every later call, so on one "
                "process these would be ignored. Set cached=False when edges or weights change between calls."
            )

    def _fused_reduce(self, module: Module, weight: Optional[Tensor], t2s: bool, x: Any) -> tuple[Optional[str], str]:
        """The fused kernel's aggregation for this call, or ``(None, why not)``."""
        ctx = self.ctx
        if ctx.aggregation == "edge_index":
            return None, "aggregation='edge_index'"
        reduce = self.spec.reduce(module)
        why = ""
        if reduce is None and self.spec.fused is not None and not class_propagate_fuses(type(module)):
            why = (
                "PyG generated its class's propagate without the fused branch (the first instance built in this "
                "process could not fuse)"
            )
        elif reduce is None:
            why = "it has no fused sparse aggregation in PyG (per-edge computation)"
        elif t2s:
            why = "flow='target_to_source' (PyG has no sparse path for it)"
        elif weight is not None and weight.requires_grad:
            why = "its edge weights need gradients"
        elif weight is not None and reduce in ("max", "min"):
            why = f"{reduce} aggregation with edge weights"
        elif reduce in ("max", "min") and (x[0] if isinstance(x, (tuple, list)) else x).is_cuda:
            why = f"torch has no CUDA kernel for sparse {reduce}"
        if why:
            if ctx.aggregation == "sparse":
                raise UnsupportedLayerError(
                    f"layer '{self.name}' ({self._cls}) cannot use the fused sparse aggregation: {why}. "
                    "Use HaloQuantStrategy(aggregation='auto') to run such layers on edge_index."
                )
            return None, why
        return reduce, ""

    def _describe(self, act: _Active, reduce: Optional[str], why: str, norm: Optional[Norm]) -> str:
        how = f"fused sparse aggregation ({reduce}, cached CSR and transpose)" if reduce else f"on edge_index ({why})"
        if act.feed == "steps":
            how += ", halo exchanged before every propagation"
        if norm is not None:
            how += f", {norm.kind} normalisation with global degrees"
        return how + (" [reversed edges]" if act.plan == "out" else "")

    def _align_edge_args(self, arguments: dict, given: EdgeSet, target: EdgeSet) -> None:
        """Edge-level arguments (``edge_attr``, ``edge_weight``, ``edge_type``) must follow the edges the layer gets.

        They are recognised by PyG's naming (``edge_*``), not by their length, so that every
        rank decides alike whatever its edge count.
        """
        if target.key == "in":  # given as the in-edges or flipped in-edges: same order
            return
        ein = self.ctx.edges.sets["in"]  # type: ignore[union-attr]
        for name, value in list(arguments.items()):
            if name == "edge_index" or not name.startswith("edge_") or not isinstance(value, Tensor):
                continue
            key = next((k for k, v in ein.attrs.items() if v is value), None)
            if key is None:
                raise UnsupportedEdgesError(
                    f"layer '{self.name}' runs on reversed edges, but its argument `{name}` ({tuple(value.shape)}) is "
                    "not one of the partition's edge attributes, so lightning-halo cannot reorder it along the "
                    "reversed edges. Pass the partition's own tensor (e.g. batch.edge_attr)."
                )
            arguments[name] = target.attrs[key]

    # ------------------------------------------------------------------ propagate pre-hook
    def _propagate(self, module: Module, inputs: tuple) -> Optional[tuple]:
        act = self._stack[-1] if self._stack else None
        if act is None or act.passthrough:
            return None
        edge_index, size, kwargs = inputs
        act.props += 1
        if act.max_props is not None and act.props > act.max_props:
            raise UnsupportedLayerError(
                f"layer '{self.name}' ({self._cls}) called propagate {act.props} times in one forward, but it is "
                f"registered as '{self.kind}' with {act.max_props} propagation(s): a later propagation would read halo "
                "rows computed by an earlier one, which no peer updated. If the layer propagates several times, each "
                f"step reading the previous one's output, register it as such: lightning_halo.register_layer("
                f"{self._cls}, 'steps')."
            )
        if act.prop_edges is not None:
            edge_index = act.prop_edges
            kwargs = dict(kwargs)
            kwargs[self.spec.weight_kwarg] = act.prop_weight
        if act.feed != "steps":
            if act.prop_edges is None:
                return None
            return edge_index, size, kwargs
        return self._step_inputs(module, act, edge_index, kwargs)

    def _step_inputs(self, module: MessagePassing, act: _Active, edge_index: Any, kwargs: dict) -> tuple:
        """Append to everything a propagation reads at its sources the halo rows, fetched now."""
        ex, layer = self.ctx.exchanger, f"{self.name}#{act.props}"
        node_dim = getattr(module, "node_dim", -2)
        kwargs = dict(kwargs)
        fused = act.fused and isinstance(edge_index, Tensor) and edge_index.layout != torch.strided
        names = ["x"] if fused else sorted({a[:-2] for a in module._user_args if a.endswith("_j")})
        for name in names:
            value = kwargs.get(name)
            if isinstance(value, Tensor):
                src, dst = value, value
            elif isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], Tensor):
                src, dst = value
            else:
                continue
            if src.size(node_dim) != act.n_inner:
                raise ValueError(
                    f"layer '{self.name}' propagated `{name}` with {src.size(node_dim)} rows, but this rank owns "
                    f"{act.n_inner} nodes; a 'steps' layer must propagate tensors of its inner nodes."
                )
            if act.t2s and value is not src:
                # PyG's generated propagate reads a pair as (sources, targets) and sizes its output by
                # the pair's first entry whatever the flow: a partition's pair cannot satisfy both.
                raise UnsupportedLayerError(
                    f"layer '{self.name}' ({self._cls}) propagates the pair `{name}` with flow='target_to_source', "
                    "which PyG cannot size on a partition; use the default flow (e.g. on edge_index.flip(0))."
                )
            full = _fetch_along(ex, src, node_dim, layer, act.plan, act.exact)
            if fused or act.t2s:
                kwargs[name] = full  # under target_to_source the explicit size below sets the output rows
            else:
                kwargs[name] = (full, dst)
        n_src = act.n_inner + ex.plan(act.plan).n_halo
        size = (act.n_inner, n_src) if act.t2s else (n_src, act.n_inner)
        return edge_index, None if fused else size, kwargs

    # ------------------------------------------------------------------ forward hook
    def _post(self, module: Module, args: tuple, kwargs: dict, output: Any) -> Any:
        act = self._stack.pop() if self._stack else None
        if act is None:
            return None
        if act.restore is not None:
            setattr(module, act.restore[0], act.restore[1])
        if act.cut < 0 or output is None:
            return None
        if isinstance(output, Tensor):
            return output[: act.cut]
        if isinstance(output, tuple) and output and isinstance(output[0], Tensor):
            return (output[0][: act.cut], *output[1:])
        return None

    def _check_rows(self, x: Tensor, n_inner: int, what: str) -> None:
        if x.size(0) != n_inner:
            raise ValueError(
                f"layer '{self.name}' got {what} with {x.size(0)} rows, but this rank owns {n_inner} nodes. "
                "Pass node features of the partition's inner nodes (e.g. batch.x or an earlier layer's output); "
                "lightning-halo appends the halo rows itself."
            )


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


def install_hooks(model: Module, ctx: LayerContext) -> list[LayerHook]:
    """Hook every outermost message-passing layer of ``model`` (after :func:`check_model`)."""
    specs = check_model(model)
    layers = find_message_passing(model)
    return [LayerHook(layers[name], name, spec, ctx).install() for name, spec in specs.items()]
