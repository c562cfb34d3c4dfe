"""Which PyG layers can run on a partition, and the hooks that feed them their halo rows."""

from __future__ import annotations

import inspect
from collections import OrderedDict
from typing import Any, Literal, Optional, Protocol

import torch
from torch import Tensor
from torch.nn import Module
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import add_remaining_self_loops, scatter, to_edge_index, to_torch_csr_tensor

#: How a layer is fed on a partition:
#:
#: * ``"bipartite"``: called as ``layer((x_inner ++ x_halo, x_inner), edge_index)`` and
#:   returns inner rows only (no work for halo rows);
#: * ``"full"``: called on ``x_inner ++ x_halo``; the output is cut back to the inner rows;
#: * ``"gcn"``: like ``"full"``, but the symmetric normalisation
#:   :math:`\hat{D}^{-1/2}\hat{A}\hat{D}^{-1/2}` uses global degrees: the halo nodes' degrees
#:   come from their owners (one exact exchange, cached) instead of the partial local count.
LayerKind = Literal["bipartite", "full", "gcn"]

_KINDS: dict[type, LayerKind] = {}
_UNSUPPORTED: dict[type, str] = {}


class UnsupportedLayerError(TypeError):
    """A message-passing layer cannot be run on partitions (or is unknown); the message says why."""


def register_layer(cls: type, kind: LayerKind) -> None:
    r"""Declare how ``cls`` runs on a partition (for custom or unlisted PyG layers).

    Use ``"bipartite"`` if the layer accepts ``(x_src, x_dst)`` and the output of node
    :math:`i` depends only on :math:`x_i`, its in-edges (and their attributes) and the
    features of their sources; ``"full"`` for the same property without bipartite input;
    ``"gcn"`` for layers with GCN's ``normalize`` / ``improved`` / ``add_self_loops``
    attributes whose normalisation reads source degrees.

    Args:
        cls (type): a :class:`~torch_geometric.nn.conv.MessagePassing` subclass.
        kind (str): ``"bipartite"``, ``"full"`` or ``"gcn"``.

    Example:
        >>> class MyConv(MessagePassing): ...
        >>> register_layer(MyConv, "full")
    """
    if not (isinstance(cls, type) and issubclass(cls, MessagePassing)):
        raise TypeError(f"register_layer expects a MessagePassing subclass, got {cls!r}")
    if kind not in ("bipartite", "full", "gcn"):
        raise ValueError(f"unknown layer kind {kind!r}; choose 'bipartite', 'full' or 'gcn'")
    _UNSUPPORTED.pop(cls, None)
    _KINDS[cls] = kind


def _register_builtin() -> None:
    from torch_geometric.nn import conv as c

    bipartite = [
        "SAGEConv", "GraphConv", "GATConv", "GATv2Conv", "TransformerConv", "GINConv", "GINEConv",
        "ResGatedGraphConv", "LEConv", "GENConv", "FiLMConv", "GeneralConv", "SimpleConv", "NNConv",
        "CGConv", "EdgeConv", "MFConv", "GMMConv",
    ]  # fmt: skip
    full = ["ClusterGCNConv", "PNAConv", "AGNNConv", "FeaStConv"]
    gcn = ["GCNConv", "LGConv"]
    unsupported = {
        "ChebConv": "its Chebyshev filter propagates K hops inside one layer and normalises with source degrees",
        "SGConv": "it propagates K hops inside one layer (use K stacked GCNConv(normalize=True) layers instead)",
        "SSGConv": "it propagates K hops inside one layer",
        "TAGConv": "it propagates K hops inside one layer",
        "ARMAConv": "it iterates several propagation steps inside one layer",
        "APPNP": "it propagates K hops inside one layer",
        "GatedGraphConv": "it runs num_layers propagation steps inside one layer",
        "GCN2Conv": "it reads the initial features x_0 of halo nodes, which are not exchanged",
        "FAConv": "it reads the initial features x_0 of halo nodes, which are not exchanged",
        "EGConv": "its symmetric-normalised aggregators read source degrees",
        "DNAConv": "it takes a stack of all previous layers' features",
        "PointNetConv": "it takes node positions as a second node-level input",
        "PPFConv": "it takes node positions and normals as extra node-level inputs",
        "PointTransformerConv": "it takes node positions as a second node-level input",
        "DynamicEdgeConv": "it builds a k-NN graph over all nodes' features",
        "GravNetConv": "it builds a k-NN graph over all nodes' features",
        "XConv": "it builds a k-NN graph over all nodes' positions",
        "SuperGATConv": "its self-supervised attention loss samples negative edges over the whole graph",
        "HypergraphConv": "it takes hyperedges, not an edge_index of node pairs",
        "PDNConv": "it normalises with source degrees computed from learned edge weights",
        "SignedConv": "it takes separate positive and negative edge sets",
        "WLConv": "it hashes colours over the whole graph",
        "WLConvContinuous": "it is parameter-free colour refinement over the whole graph",
    }
    for names, kind in ((bipartite, "bipartite"), (full, "full"), (gcn, "gcn")):
        for name in names:
            cls = getattr(c, name, None)
            if cls is not None:
                _KINDS.setdefault(cls, kind)  # type: ignore[arg-type]
    for name, why in unsupported.items():
        cls = getattr(c, name, None)
        if cls is not None and cls not in _KINDS:
            _UNSUPPORTED[cls] = why


_register_builtin()


def supported_layers() -> dict[str, LayerKind]:
    """Name -> kind of every layer class lightning-halo knows how to run (built-in and registered).

    Example:
        >>> supported_layers()["SAGEConv"]
        'bipartite'
    """
    return {cls.__name__: kind for cls, kind in sorted(_KINDS.items(), key=lambda kv: kv[0].__name__)}


def unsupported_layers() -> dict[str, str]:
    """Name -> reason for PyG layers that cannot run on partitions.

    Example:
        >>> "ChebConv" in unsupported_layers()
        True
    """
    return {cls.__name__: why for cls, why in sorted(_UNSUPPORTED.items(), key=lambda kv: kv[0].__name__)}


def layer_kind(module: Module) -> LayerKind:
    """The kind of ``module`` (exact class match), or :class:`UnsupportedLayerError` saying why and what to do."""
    cls = type(module)
    if cls in _KINDS:
        kind = _KINDS[cls]
        flow = getattr(module, "flow", "source_to_target")
        if flow != "source_to_target":
            raise UnsupportedLayerError(
                f"{cls.__name__} has flow={flow!r}; partitions hold the in-edges of owned nodes, so only "
                "flow='source_to_target' (PyG's default) is supported."
            )
        return kind
    if cls in _UNSUPPORTED:
        raise UnsupportedLayerError(
            f"{cls.__name__} cannot run on graph partitions: {_UNSUPPORTED[cls]}. Supported layers: "
            f"{', '.join(supported_layers())}."
        )
    raise UnsupportedLayerError(
        f"{cls.__name__} is a MessagePassing layer lightning-halo does not know, so it cannot tell whether running it "
        "on a partition gives the full-graph result. If the output of a node depends only on its own features, its "
        "in-edges and their sources' features, declare it: lightning_halo.register_layer("
        f"{cls.__name__}, 'bipartite' if it accepts (x_src, x_dst) else 'full')."
    )


class Exchanger(Protocol):
    """What a layer hook needs from the exchange (the real one or a test double)."""

    aux_cache: dict[Any, Any]

    @property
    def active(self) -> bool: ...

    def fetch(self, x_inner: Tensor, layer: str) -> Tensor: ...

    def exchange_constant(self, rows_inner: Tensor, layer: str) -> Tensor: ...

    def inner_rows(self) -> int: ...


_SIGNATURES: dict[type, inspect.Signature] = {}


def _signature(module: Module) -> inspect.Signature:
    cls = type(module)
    if cls not in _SIGNATURES:
        _SIGNATURES[cls] = inspect.signature(module.forward)
    return _SIGNATURES[cls]


class LayerHook:
    """Forward pre-hook + forward hook that run one layer on ``[x_inner; x_halo]``.

    Args:
        module: the message-passing layer.
        name: its qualified name in the model (for traffic accounting and errors).
        kind: how to feed it (see :data:`LayerKind`).
        exchanger: the halo exchange.
    """

    def __init__(self, module: Module, name: str, kind: LayerKind, exchanger: Exchanger) -> None:
        self.module, self.name, self.kind, self.exchanger = module, name, kind, exchanger
        self._stack: list[tuple[int, Optional[bool]]] = []
        self._handles: list[Any] = []
        sig = _signature(module)
        if "x" not in sig.parameters or "edge_index" not in sig.parameters:
            raise UnsupportedLayerError(
                f"{type(module).__name__}.forward must take arguments named `x` and `edge_index` to be partitioned."
            )

    def install(self) -> LayerHook:
        self._handles = [
            self.module.register_forward_pre_hook(self._pre, with_kwargs=True),
            self.module.register_forward_hook(self._post, with_kwargs=True, always_call=True),
        ]
        return self

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    # -- hooks ----------------------------------------------------------------------------
    def _pre(self, module: Module, args: tuple, kwargs: dict) -> Optional[tuple[tuple, dict]]:
        ex = self.exchanger
        if not ex.active:
            self._stack.append((-1, None))
            return None
        n_inner = ex.inner_rows()
        bound = _signature(module).bind(*args, **kwargs)
        arguments = bound.arguments
        if arguments.get("size") is not None:
            raise ValueError(f"layer '{self.name}' was called with size=...; lightning-halo sets sizes itself, drop it.")
        x = arguments["x"]
        if isinstance(x, Tensor):
            self._check_rows(x, n_inner, "x")
            x_full = torch.cat([x, ex.fetch(x, self.name)], dim=0)
            new_x: Any = (x_full, x) if self.kind == "bipartite" else x_full
        elif isinstance(x, (tuple, list)) and len(x) == 2:
            if self.kind != "bipartite":
                raise UnsupportedLayerError(
                    f"layer '{self.name}' ({type(module).__name__}) was called with a tuple (x_src, x_dst), but it "
                    "does not take bipartite input; call it with a single node-feature tensor."
                )
            x_src, x_dst = x
            if not isinstance(x_src, Tensor):
                raise TypeError(f"layer '{self.name}': x_src must be a tensor, got {type(x_src).__name__}")
            self._check_rows(x_src, n_inner, "x_src")
            if x_dst is not None:
                self._check_rows(x_dst, n_inner, "x_dst")
            new_x = (torch.cat([x_src, ex.fetch(x_src, self.name)], dim=0), x_dst)
        else:
            raise TypeError(
                f"layer '{self.name}': node features must be a tensor [n_inner, d] or a pair (x_src, x_dst), "
                f"got {type(x).__name__}"
            )
        arguments["x"] = new_x
        n_src = (new_x[0] if isinstance(new_x, tuple) else new_x).size(0)
        self._check_adjacency(arguments["edge_index"], n_inner, n_src)
        restore_normalize: Optional[bool] = None
        if self.kind == "gcn" and getattr(module, "normalize", False):
            ei, ew = self._global_gcn_norm(module, arguments["edge_index"], arguments.get("edge_weight"), n_inner, x_full)
            arguments["edge_index"], arguments["edge_weight"] = ei, ew
            restore_normalize, module.normalize = module.normalize, False  # weights are final already
        self._stack.append((n_inner if self.kind != "bipartite" else -1, restore_normalize))
        return bound.args, bound.kwargs

    def _post(self, module: Module, args: tuple, kwargs: dict, output: Any) -> Any:
        n_cut, restore = self._stack.pop() if self._stack else (-1, None)
        if restore is not None:
            module.normalize = restore
        if n_cut < 0 or output is None:
            return None
        if isinstance(output, Tensor):
            return output[:n_cut]
        if isinstance(output, tuple) and output and isinstance(output[0], Tensor):
            return (output[0][:n_cut], *output[1:])
        return None

    # -- helpers --------------------------------------------------------------------------
    def _check_adjacency(self, edge_index: Any, n_inner: int, n_src: int) -> None:
        """A sparse adjacency must map the partition's sources (inner + halo) to its inner nodes."""
        sparse = isinstance(edge_index, Tensor) and edge_index.layout != torch.strided
        if sparse and tuple(edge_index.shape) != (n_inner, n_src):
            raise ValueError(
                f"layer '{self.name}' got a sparse adjacency of shape {tuple(edge_index.shape)}, but on this "
                f"partition it must be [n_inner, n_inner + n_halo] = [{n_inner}, {n_src}] (targets x sources). "
                "Build it with lightning_halo.sparse_adjacency(batch)."
            )

    def _check_rows(self, x: Tensor, n_inner: int, what: str) -> None:
        if x.size(0) != n_inner:
            raise ValueError(
                f"layer '{self.name}' got {what} with {x.size(0)} rows, but this rank owns {n_inner} nodes. "
                "Pass node features of the partition's inner nodes (e.g. batch.x or an earlier layer's output); "
                "lightning-halo appends the halo rows itself."
            )

    def _global_gcn_norm(
        self, module: Module, edge_index: Tensor, edge_weight: Optional[Tensor], n_inner: int, x_full: Tensor
    ) -> tuple[Tensor, Optional[Tensor]]:
        """GCN's normalisation with every degree counted over the whole graph.

        Returns ``(edge_index, edge_weight)``, or ``(normalised adjacency, None)`` for a sparse one.

        An inner node's in-degree is complete locally (its partition holds all its in-edges);
        a halo node's is not, so its owner sends it (one exact exchange, then cached).
        """
        if not isinstance(edge_index, Tensor) or edge_index.dim() != 2:
            raise UnsupportedLayerError(
                f"layer '{self.name}': edge_index must be a [2, E] tensor or a torch.sparse adjacency "
                f"(lightning_halo.sparse_adjacency), got {type(edge_index).__name__}."
            )
        sparse = edge_index.layout != torch.strided
        if sparse and edge_weight is not None:
            raise ValueError(
                f"layer '{self.name}': with a sparse adjacency the edge weights are its values; "
                "drop the edge_weight argument (PyG ignores it in this case too)."
            )
        if edge_weight is not None and edge_weight.requires_grad:
            raise UnsupportedLayerError(
                f"layer '{self.name}': learned edge weights with normalize=True would need gradients of remote "
                "degrees; normalise yourself and call the layer with normalize=False."
            )
        improved = bool(getattr(module, "improved", False))
        self_loops = bool(getattr(module, "add_self_loops", False))  # LGConv has none: no self-loops
        dtype = x_full.dtype
        ex = self.exchanger
        key = ("gcn", id(edge_index), id(edge_weight), improved, self_loops, dtype)
        hit = ex.aux_cache.get(key)
        ew_version = edge_weight._version if edge_weight is not None else None
        if hit is not None and hit[0] is edge_index and hit[1] == edge_index._version and hit[2] is edge_weight:
            if hit[3] == ew_version:
                return hit[4], hit[5]
        n_local = x_full.size(0)
        fill = 2.0 if improved else 1.0
        if sparse:
            # PyG's gcn_norm on a torch.sparse adjacency adds a self-loop to every node even where one
            # exists (add_self_loops, not add_remaining_self_loops): follow it, so that the result
            # equals the user's single-process run with the same adjacency.
            adj_ei, ew = to_edge_index(edge_index)  # [target, source]
            ei = adj_ei.flip(0)
            if self_loops:
                loop = torch.arange(n_inner, device=ei.device)
                ei = torch.cat([ei, torch.stack([loop, loop])], dim=1)
                ew = torch.cat([ew, ew.new_full((n_inner,), fill)])
        else:
            ei, ew = edge_index, edge_weight
            if self_loops:
                ei, ew = add_remaining_self_loops(ei, ew, fill, n_local)
        if ew is None:
            ew = torch.ones(ei.size(1), dtype=dtype, device=ei.device)
        ew = ew.to(dtype)
        keep = ei[1] < n_inner  # edges into halo nodes (their self-loops) produce rows we discard
        ei, ew = ei[:, keep], ew[keep]
        deg_inner = scatter(ew, ei[1], dim=0, dim_size=n_inner, reduce="sum")
        deg = torch.cat([deg_inner, ex.exchange_constant(deg_inner, self.name)])
        dis = deg.pow(-0.5)
        dis.masked_fill_(torch.isinf(dis), 0.0)
        norm = dis[ei[0]] * ew * dis[ei[1]]
        if sparse:  # back to the layout the layer was given; coalescing sums a loop into an existing one
            ei, norm = to_torch_csr_tensor(ei.flip(0), norm, size=(n_inner, n_local)), None
        if len(ex.aux_cache) > 16:  # bounded: a new edge set every step must not grow memory
            ex.aux_cache.pop(next(iter(ex.aux_cache)))
        ex.aux_cache[key] = (edge_index, edge_index._version, edge_weight, ew_version, ei, norm)
        return ei, norm


def find_message_passing(model: Module) -> OrderedDict[str, Module]:
    """Outermost :class:`MessagePassing` modules of ``model`` by qualified name.

    A message-passing module nested inside another one is the outer layer's business.
    """
    found: OrderedDict[str, Module] = OrderedDict()
    for name, module in model.named_modules():
        if isinstance(module, MessagePassing) and not any(name.startswith(p + ".") for p in found):
            found[name or type(module).__name__] = module
    return found
