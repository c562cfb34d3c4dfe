r"""Which PyG layers can run on a partition, how, and why the others cannot.

Every class of :mod:`torch_geometric.nn.conv` is listed here with its status (a test keeps the
list complete). How a supported layer is fed on a partition (its *kind*):

* ``"bipartite"``: called as ``layer((x_inner ++ x_halo, x_inner), edge_index)``; the output
  has the inner rows only (no work for halo rows);
* ``"full"``: called on ``x_inner ++ x_halo``; the output is cut back to the inner rows;
* ``"gcn"``: like ``"full"``, with a normalisation that reads the degrees of the *sources*,
  computed globally (the halo nodes' degrees come from their owners, once);
* ``"steps"``: the layer propagates several times in one call (APPNP, SGConv, ChebConv, ...):
  it is called on the inner rows, and before *every* propagation the halo rows of what it
  propagates are fetched from their owners, as if the steps were stacked layers;
* ``"types"``: a heterogeneous layer called on dicts of node and edge types (``HGTConv``,
  ``HANConv``), on heterogeneous partitions only: every source type's rows get their halo rows,
  every output is cut back to its type's inner rows (:mod:`lightning_halo.layers.hetero`);
  ``HANConv``'s semantic attention averages over every rank's nodes
  (:mod:`lightning_halo.layers.semantic`).

On a heterogeneous partition, the per-edge-type calls of ``to_hetero`` models and ``HeteroConv``
run ``"bipartite"`` layers as ``layer((x_src ++ halo_src, x_dst), edge_index)`` and ``"full"``
and ``"gcn"`` layers of a relation within one type as above (the halo nodes' degrees in that
relation from their owners); ``"steps"`` layers are refused there, with the reason
(:mod:`lightning_halo.layers.hetero`).

Each supported class also declares how many ``propagate`` calls one forward makes (more is
refused: a multi-hop layer registered as single-step would read halo rows that nobody
updated), its normalisation (computed exactly on the partition, see
:mod:`lightning_halo.layers.normalize`), and whether it can aggregate with the fused sparse
kernel (:mod:`lightning_halo.layers.fused`).

Some refusals depend on an instance's options rather than its class (:func:`refused_instance`):
an aggregation whose result for a node depends on the other nodes of the call (``aggr="lstm"``
pads every neighbourhood to the largest in-degree among the nodes it sees), or an option whose
PyG implementation reads the degrees or edges of the message *sources* under
``flow="target_to_source"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Optional, Union, get_args

from torch.nn import Module
from torch_geometric.nn import MessagePassing

from lightning_halo._compat.pyg import clear_layer_caches, propagate_has_fused_branch
from lightning_halo.partition.adjacency import Reduce

#: Why compiled message passing is refused, and what works instead.
COMPILE_REFUSAL = (
    "Dynamo traces the layer's forward hooks into its graph with the tensors of the first trace, and PyG skips "
    "its propagate hooks when compiling, so lightning-halo could not exchange halos per call nor prove the result "
    "exact. Compile only the parts of the model without message passing (e.g. self.mlp = torch.compile(self.mlp)) "
    "and leave the PyG layers and the model around them uncompiled."
)

#: How a class is registered (see the module docstring).
LayerKind = Literal["bipartite", "full", "gcn", "steps", "types"]
KINDS: tuple[LayerKind, ...] = get_args(LayerKind)
#: How one call's node features are given to the layer: the kind, with ``"gcn"`` fed ``"full"``.
Feed = Literal["bipartite", "full", "steps"]
REDUCES: tuple[Reduce, ...] = get_args(Reduce)


class UnsupportedLayerError(TypeError):
    """A message-passing layer cannot be run on partitions (or is unknown); the message says why."""


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown layer kind {kind!r}; choose one of {', '.join(map(repr, KINDS))}")


@dataclass(frozen=True)
class Normalization:
    """A layer's normalisation, to be computed on the partition exactly as on the whole graph.

    ``rule``: ``"gcn"`` (:func:`~lightning_halo.layers.normalize.gcn_weights`), ``"cheb"``
    (:func:`~lightning_halo.layers.normalize.laplacian_weights`) or ``"cluster"``
    (:func:`~lightning_halo.layers.normalize.cluster_gcn_weights`).
    """

    rule: Literal["gcn", "cheb", "cluster"]
    improved: bool = False
    add_self_loops: bool = False
    normalization: Optional[str] = None  # cheb: None, "sym", "rw"
    lambda_max: Optional[float] = None
    diag_lambda: float = 0.0


@dataclass(frozen=True)
class LayerSpec:
    """How one layer class runs on a partition (see the module docstring).

    Attributes:
        kind: how it is registered.
        propagations: ``propagate`` calls per forward (a number, or a function of the layer;
            ``None``: any number, all reading the layer's exchanged input).
        norm: the normalisation of an instance for a call (``(layer, call arguments) -> Normalization``).
        switch: name of the layer's flag that turns its own normalisation off while ours is used.
        renormalizes: it normalises in ``forward`` without such a flag: it is given a placeholder
            and the real edges (with our weights) are put into every ``propagate`` call.
        weight_arg: ``forward`` argument holding per-edge weights (consumed by the normalisation
            or folded into the fused kernel).
        weight_kwarg: ``propagate`` keyword carrying the per-edge weights.
        sparse_reduce: the aggregation of an instance on the fused path (``None``: it has none).
        feed_for: per-instance override of the kind's feed (``"full"`` where PyG rejects
            bipartite input for an option).
        caches: names of PyG cache attributes, cleared when hooks are installed or removed.
        partial_sums: whether an instance may receive halo partial sums on the fused path: it
            transforms its rows linearly without bias (or not at all) before the aggregation,
            so a sum of rows aggregates as the sum of their messages (``None``: never).
    """

    kind: LayerKind
    propagations: Union[int, None, Callable[[Module], Optional[int]]] = 1
    norm: Optional[Callable[[Module, dict], Optional[Normalization]]] = None
    switch: Optional[str] = None
    renormalizes: bool = False
    weight_arg: Optional[str] = None
    weight_kwarg: str = "edge_weight"
    sparse_reduce: Optional[Callable[[Module], Optional[Reduce]]] = None
    feed_for: Optional[Callable[[Module], Feed]] = None
    caches: tuple[str, ...] = ()
    partial_sums: Optional[Callable[[Module], bool]] = None

    def linear_before_aggregation(self, module: Module) -> bool:
        """Whether ``module`` may receive halo partial sums (see ``partial_sums``)."""
        return self.partial_sums is not None and bool(self.partial_sums(module))

    def max_propagations(self, module: Module) -> Optional[int]:
        p = self.propagations
        return p(module) if callable(p) else p

    def feed(self, module: Module) -> Feed:
        """``"bipartite"``, ``"full"`` or ``"steps"`` for this instance."""
        if self.feed_for is not None:
            return self.feed_for(module)
        return "full" if self.kind == "gcn" else self.kind

    def fused_reduce(self, module: Module) -> Optional[Reduce]:
        """The fused kernel's aggregation for this instance, or None (the ``edge_index`` path)."""
        if self.sparse_reduce is None or not getattr(module, "fuse", False):
            return None
        if getattr(module, "decomposed_layers", 1) != 1 or getattr(module, "explain", False):
            return None
        if not class_propagate_fuses(type(module)):
            return None
        return self.sparse_reduce(module)


def class_propagate_fuses(cls: type) -> bool:
    """Whether instances of ``cls`` can take the fused path at all in this process.

    PyG generates one ``propagate`` per class for its first instance; if that one could not
    fuse, no later instance can (:func:`~lightning_halo._compat.pyg.propagate_has_fused_branch`).
    """
    return propagate_has_fused_branch(cls)


@dataclass
class _Registry:
    specs: dict[type, LayerSpec] = field(default_factory=dict)
    refused: dict[type, str] = field(default_factory=dict)
    wrappers: dict[str, str] = field(default_factory=dict)  # non-MessagePassing modules of nn.conv
    refused_wrappers: dict[str, str] = field(default_factory=dict)
    aggregations: set[type] = field(default_factory=set)  # custom aggregations declared exact


_REG = _Registry()


def _str_aggr(module: Module) -> Optional[Reduce]:
    aggr = getattr(module, "aggr", None)
    aggr = "sum" if aggr == "add" else aggr
    return aggr if aggr in REDUCES else None


def _sum_aggr(module: Module) -> Optional[Reduce]:
    return "sum" if _str_aggr(module) == "sum" else None


def _gcn_norm(improved: Callable[[Module], bool], loops: Callable[[Module], bool], flag: Optional[str]):
    def norm(module: Module, args: dict) -> Optional[Normalization]:
        if flag is not None and not getattr(module, flag):
            return None
        return Normalization("gcn", improved=bool(improved(module)), add_self_loops=bool(loops(module)))

    return norm


def _never(_: Module) -> bool:
    return False


def _attr(name: str) -> Callable[[Module], bool]:
    return lambda m: bool(getattr(m, name, False))


def _cheb_norm(module: Module, args: dict) -> Normalization:
    lam = args.get("lambda_max")
    if args.get("batch") is not None:
        raise UnsupportedLayerError(
            "ChebConv was called with batch=...: per-graph lambda_max is for mini-batches of graphs, not a partition "
            "of one graph; call it without batch."
        )
    if lam is not None and hasattr(lam, "numel"):
        if lam.numel() != 1:
            raise UnsupportedLayerError("ChebConv's lambda_max must be one number on a partition (one graph)")
        lam = float(lam.reshape(-1)[0])
    return Normalization("cheb", normalization=module.normalization, lambda_max=None if lam is None else float(lam))


def _cluster_norm(module: Module, args: dict) -> Optional[Normalization]:
    if not module.add_self_loops:
        return None  # its own weights read only target degrees: exact locally, nothing to replace
    return Normalization("cluster", diag_lambda=float(module.diag_lambda))


def _always(_: Module) -> bool:
    return True


def _relations(module: Module) -> int:
    return max(1, int(getattr(module, "num_relations", 1)))


_BIPARTITE = LayerSpec("bipartite")
#: The built-in layers of torch_geometric.nn.conv by class name, and how each runs.
_BUILTIN_SPECS: dict[str, LayerSpec] = {
    "SAGEConv": LayerSpec("bipartite", sparse_reduce=_str_aggr, partial_sums=lambda m: not m.project),
    "GraphConv": LayerSpec("bipartite", sparse_reduce=_str_aggr, weight_arg="edge_weight", partial_sums=_always),
    "GINConv": LayerSpec("bipartite", sparse_reduce=_sum_aggr, partial_sums=_always),
    "SimpleConv": LayerSpec(
        "bipartite",
        sparse_reduce=lambda m: None if m.combine_root == "self_loop" else _str_aggr(m),
        weight_arg="edge_weight",
        feed_for=lambda m: "full" if m.combine_root == "self_loop" else "bipartite", partial_sums=_always,
    ),
    "FiLMConv": LayerSpec("bipartite", propagations=_relations),
    "HGTConv": LayerSpec("types"),
    # one propagation per metapath, each reading the exchanged input; its semantic attention is made global
    # (lightning_halo.layers.semantic)
    "HANConv": LayerSpec("types", propagations=None),
    "RGCNConv": LayerSpec("bipartite", propagations=_relations),
    "FastRGCNConv": LayerSpec("bipartite"),
    "RGATConv": LayerSpec("full"),
    "ClusterGCNConv": LayerSpec(
        "full", norm=_cluster_norm, renormalizes=True, sparse_reduce=lambda m: _sum_aggr(m) if m.add_self_loops else None,
        partial_sums=_always,
    ),
    "PNAConv": LayerSpec("full"),
    "AGNNConv": LayerSpec("full"),
    "FeaStConv": LayerSpec("full"),
    "GCNConv": LayerSpec(
        "gcn", norm=_gcn_norm(_attr("improved"), _attr("add_self_loops"), "normalize"), switch="normalize",
        weight_arg="edge_weight", sparse_reduce=_sum_aggr, caches=("_cached_edge_index", "_cached_adj_t"),
        partial_sums=lambda m: getattr(m.lin, "bias", None) is None,
    ),
    "LGConv": LayerSpec(
        "gcn", norm=_gcn_norm(_never, _never, "normalize"), switch="normalize", weight_arg="edge_weight",
        sparse_reduce=_sum_aggr, partial_sums=_always,
    ),
    "APPNP": LayerSpec(
        "steps", propagations=None, norm=_gcn_norm(_never, _attr("add_self_loops"), "normalize"),
        switch="normalize", weight_arg="edge_weight", sparse_reduce=_sum_aggr, caches=("_cached_edge_index", "_cached_adj_t"), partial_sums=_always,
    ),
    "SGConv": LayerSpec(
        "steps", propagations=None, norm=_gcn_norm(_never, _attr("add_self_loops"), None), renormalizes=True,
        weight_arg="edge_weight", sparse_reduce=_sum_aggr, caches=("_cached_x",), partial_sums=_always,
    ),
    "SSGConv": LayerSpec(
        "steps", propagations=None, norm=_gcn_norm(_never, _attr("add_self_loops"), None), renormalizes=True,
        weight_arg="edge_weight", sparse_reduce=_sum_aggr, caches=("_cached_h",), partial_sums=_always,
    ),
    "TAGConv": LayerSpec(
        "steps", propagations=None, norm=_gcn_norm(_never, _never, "normalize"), switch="normalize",
        weight_arg="edge_weight", sparse_reduce=_sum_aggr, partial_sums=_always,
    ),
    # its propagations carry [stacks, N, F] tensors, which torch.sparse.mm cannot multiply
    "ARMAConv": LayerSpec(
        "steps", propagations=None, norm=_gcn_norm(_never, _never, None), renormalizes=True, weight_arg="edge_weight"
    ),
    "GatedGraphConv": LayerSpec(
        "steps", propagations=None, weight_arg="edge_weight", sparse_reduce=_sum_aggr, partial_sums=_always
    ),
    "MixHopConv": LayerSpec(
        "steps", propagations=None, norm=_gcn_norm(_never, _attr("add_self_loops"), None), renormalizes=True,
        weight_arg="edge_weight", sparse_reduce=_sum_aggr, partial_sums=_always,
    ),
    "GCN2Conv": LayerSpec(
        "steps", propagations=None, norm=_gcn_norm(_never, _attr("add_self_loops"), "normalize"),
        switch="normalize", weight_arg="edge_weight", sparse_reduce=_sum_aggr, caches=("_cached_edge_index", "_cached_adj_t"), partial_sums=_always,
    ),
    "FAConv": LayerSpec(
        "steps", propagations=None, norm=_gcn_norm(_never, _attr("add_self_loops"), "normalize"),
        switch="normalize", weight_arg="edge_weight", caches=("_cached_edge_index", "_cached_adj_t"),
    ),
    "ChebConv": LayerSpec(
        "steps", propagations=None, norm=_cheb_norm, renormalizes=True, weight_arg="edge_weight", weight_kwarg="norm",
    ),
}
#: Layers that take bipartite input with nothing else to do on a partition.
_BIPARTITE_LAYERS = ("GATConv", "GATv2Conv", "TransformerConv", "GINEConv", "ResGatedGraphConv", "LEConv", "GENConv",
                     "GeneralConv", "NNConv", "CGConv", "EdgeConv", "MFConv", "GMMConv",
                     "WLConvContinuous")  # fmt: skip
#: Built-in layers that cannot run exactly on a partition, and why.
_BUILTIN_REFUSED: dict[str, str] = {
    "EGConv": "its symmetric-normalised aggregators read source degrees; GCNConv (symmetric normalisation with "
    "global degrees) or GATConv are exact",
    "DNAConv": "it takes a stack of all previous layers' features; supported layers with JumpingKnowledge over their "
    "outputs are exact",
    "PointNetConv": "it takes node positions as a second node-level input",
    "PPFConv": "it takes node positions and normals as extra node-level inputs",
    "PointTransformerConv": "it takes node positions as a second node-level input",
    "PointGNNConv": "it takes node positions as a second node-level input",
    "DynamicEdgeConv": "it builds a k-NN graph over all nodes' features; EdgeConv on a k-NN graph built before "
    "partitioning (torch_geometric.transforms.KNNGraph) is exact",
    "GravNetConv": "it builds a k-NN graph over all nodes' features; EdgeConv on a k-NN graph built before "
    "partitioning (torch_geometric.transforms.KNNGraph) is exact",
    "SuperGATConv": "its self-supervised attention loss samples negative edges over the whole graph; GATConv (the "
    "same attention without that loss) is exact",
    "HypergraphConv": "it takes hyperedges, not an edge_index of node pairs",
    "PDNConv": "it normalises with source degrees computed from learned edge weights",
    "SignedConv": "it takes separate positive and negative edge sets",
    "PANConv": "it builds path matrices over the whole graph with torch-sparse",
    "HEATConv": "it is a heterogeneous-graph layer (node and edge types with their own embeddings); RGCNConv or "
    "RGATConv with edge_type are exact",
    "MeshCNNConv": "it convolves mesh edges, not nodes",
    "SplineConv": "its exactness on partitions is not verified (it needs torch-spline-conv, not installable "
    "here); declare it with register_layer(SplineConv, 'bipartite') if you rely on it",
    "FusedGATConv": "it needs the dgNN CUDA kernels and their CSR/CSC inputs of the whole graph; GATConv (the same "
    "layer) is exact",
}
#: Conv modules of PyG that are not message passing themselves but run through a supported inner layer.
_BUILTIN_WRAPPERS: dict[str, str] = {
    "DirGNNConv": "through its inner layer, run on the in-edges and on the reversed out-edges",
    "AntiSymmetricConv": "through its inner layer `phi` (each iteration exchanges its input)",
    "HeteroConv": "through its inner layer of every edge type, on heterogeneous partitions (one halo fetch per source type)",
}  # fmt: skip
#: Non-message-passing modules of PyG that cannot run on a partition, and why.
_BUILTIN_REFUSED_WRAPPERS: dict[str, str] = {
    "GPSConv": "its global attention reads every node of the graph; its local part alone is exact: the "
    "message-passing layer it wraps (e.g. GINEConv) with a residual, an MLP and node-wise norms "
    "(LayerNorm(mode='node'), BatchNorm), or neighbourhood attention (TransformerConv, GATConv)",
    "WLConv": "it hashes colours over the whole graph",
    "XConv": "it builds a k-NN graph over all nodes' positions",
    "CuGraphGATConv": "it runs cugraph-ops kernels on the whole graph's CSC (CUDA only); GATConv is exact",
    "CuGraphSAGEConv": "it runs cugraph-ops kernels on the whole graph's CSC (CUDA only); SAGEConv is exact",
    "CuGraphRGCNConv": "it runs cugraph-ops kernels on the whole graph's CSC (CUDA only); RGCNConv is exact",
    "HeteroBasisConv": "to_hetero_with_bases flattens every edge type into one homogeneous edge list with per-type "
    "basis weights, which is no edge type of a heterogeneous partition; to_hetero(model, metadata) (a module per edge "
    "type) and RGCNConv with num_bases are exact",
}  # fmt: skip


def _register_builtin() -> None:
    from torch_geometric.nn import conv as c

    specs = {**_BUILTIN_SPECS, **{name: _BIPARTITE for name in _BIPARTITE_LAYERS}}
    for name, spec in specs.items():
        cls = getattr(c, name, None)
        if cls is not None:
            _REG.specs.setdefault(cls, spec)
    for name, why in _BUILTIN_REFUSED.items():
        cls = getattr(c, name, None)
        if cls is not None and cls not in _REG.specs:
            _REG.refused[cls] = why
    _REG.wrappers.update(_BUILTIN_WRAPPERS)
    _REG.refused_wrappers.update(_BUILTIN_REFUSED_WRAPPERS)


_register_builtin()


# Aggregations whose output for a node is a function of that node's messages alone (checked
# against single-process PyG on partitions). The others see the whole call: sequence models
# over neighbourhoods padded to the call's largest in-degree, or terms over all nodes.
_LOCAL_AGGREGATIONS = {
    "SumAggregation", "MeanAggregation", "MaxAggregation", "MinAggregation", "MulAggregation", "VarAggregation",
    "StdAggregation", "SoftmaxAggregation", "PowerMeanAggregation", "MedianAggregation", "QuantileAggregation",
    "AttentionalAggregation", "DeepSetsAggregation", "MLPAggregation", "SetTransformerAggregation",
    "GraphMultisetTransformer", "VariancePreservingAggregation", "DegreeScalerAggregation", "MultiAggregation",
    "SortAggregation", "Set2Set", "FusedAggregation", "GlobalAttention",
}  # fmt: skip
_CALL_WIDE_AGGREGATIONS = {
    "LSTMAggregation": "its LSTM runs over every neighbourhood padded to the largest in-degree among the nodes of "
    "the call, so a node's output depends on which nodes share its partition",
    "GRUAggregation": "its GRU runs over every neighbourhood padded to the largest in-degree among the nodes of the "
    "call, so a node's output depends on which nodes share its partition",
    "LCMAggregation": "its tree depth follows the largest in-degree among the nodes of the call",
    "EquilibriumAggregation": "its regulariser is a mean over all nodes of the call",
    "PatchTransformerAggregation": "it pads neighbourhoods to the largest in-degree of the call",
}


def register_aggregation(cls: type) -> None:
    """Declare a custom :class:`~torch_geometric.nn.aggr.Aggregation` exact on partitions.

    Declare it only if its output for a node depends on that node's messages alone (not on the
    number of nodes of the call, their largest in-degree or any term over all of them).

    Example:
        >>> from torch_geometric.nn.aggr import Aggregation
        >>> class MyAggr(Aggregation): ...
        >>> register_aggregation(MyAggr)
    """
    from torch_geometric.nn.aggr import Aggregation

    if not (isinstance(cls, type) and issubclass(cls, Aggregation)):
        raise TypeError(f"register_aggregation expects an Aggregation subclass, got {cls!r}")
    _REG.aggregations.add(cls)


def _refused_aggregation(module: Module) -> Optional[str]:
    from torch_geometric.nn.aggr import Aggregation

    for sub in module.modules():
        if not isinstance(sub, Aggregation) or type(sub) in _REG.aggregations:
            continue
        name = type(sub).__name__
        builtin = type(sub).__module__.startswith("torch_geometric.")
        if builtin and name in _CALL_WIDE_AGGREGATIONS:
            return f"its aggregation {name} is not exact on a partition: {_CALL_WIDE_AGGREGATIONS[name]}"
        if not (builtin and name in _LOCAL_AGGREGATIONS):
            return (
                f"lightning-halo cannot tell whether its aggregation {name} gives a node the same result on a "
                "partition (it is exact only if a node's output depends on that node's messages alone); if it does, "
                f"declare it: lightning_halo.register_aggregation({name})"
            )
    return None


def refused_instance(module: Module) -> Optional[str]:
    """Why this instance of a supported layer cannot run exactly on a partition (its options), or None."""
    why = _refused_aggregation(module)
    if why is not None:
        return why
    if getattr(module, "flow", "source_to_target") != "target_to_source":
        return None
    name = type(module).__name__
    if name == "ClusterGCNConv" and type(module).__module__.startswith("torch_geometric."):
        return (
            "with flow='target_to_source' PyG weights its messages by the degree of their sources, which a partition "
            "does not hold; use the default flow (e.g. on edge_index.flip(0))"
        )
    fill = getattr(module, "fill_value", None)
    if isinstance(fill, str) and getattr(module, "add_self_loops", False) and getattr(module, "edge_dim", None):
        return (
            f"with flow='target_to_source', its self-loops' edge attributes (fill_value={fill!r}) reduce the "
            "attributes of the edges of the message sources, which a partition does not hold; pass a number or a "
            "tensor as fill_value, or use the default flow"
        )
    return None


def register_layer(
    cls: type,
    kind: LayerKind,
    *,
    propagations: Optional[int] = 1,
    weight_arg: Optional[str] = None,
) -> None:
    r"""Declare how ``cls`` runs on a partition (for custom or unlisted PyG layers).

    Use ``"bipartite"`` if the layer accepts ``(x_src, x_dst)`` and the output of node
    :math:`i` depends only on :math:`x_i`, its in-edges (and their attributes) and the
    features of their sources; ``"full"`` for the same property without bipartite input;
    ``"gcn"`` for layers with GCN's ``normalize`` / ``improved`` / ``add_self_loops``
    attributes whose normalisation reads source degrees; ``"steps"`` for a layer that calls
    ``propagate`` several times in one forward, each step reading the previous step's
    output (APPNP-like): its input is exchanged before every propagation; ``"types"`` for a
    heterogeneous layer whose ``forward(x_dict, edge_index_dict)`` computes each node from its
    own row, its in-edges of every type and their sources' rows (HGTConv-like; heterogeneous
    partitions only).

    Args:
        cls (type): a :class:`~torch_geometric.nn.conv.MessagePassing` subclass.
        kind (str): ``"bipartite"``, ``"full"``, ``"gcn"``, ``"steps"`` or ``"types"``.
        propagations (int, optional): ``propagate`` calls one forward of a ``"bipartite"``,
            ``"full"`` or ``"gcn"`` layer makes, all on its (exchanged) input; a call that
            propagates more often is refused. ``None``: any number. (default: ``1``)
        weight_arg (str, optional): the ``forward`` argument holding per-edge weights, for
            ``"gcn"`` layers. (default: ``None``; ``"edge_weight"`` for ``"gcn"``)

    Example:
        >>> class MyConv(MessagePassing): ...
        >>> register_layer(MyConv, "full")
    """
    if not (isinstance(cls, type) and issubclass(cls, MessagePassing)):
        raise TypeError(f"register_layer expects a MessagePassing subclass, got {cls!r}")
    check_kind(kind)
    if propagations is not None and (not isinstance(propagations, int) or propagations < 1):
        raise ValueError(f"propagations must be a positive integer or None, got {propagations!r}")
    if kind == "gcn":
        spec = LayerSpec(
            "gcn", propagations=propagations, norm=_gcn_norm(_attr("improved"), _attr("add_self_loops"), "normalize"),
            switch="normalize", weight_arg=weight_arg or "edge_weight",
        )
    elif kind == "steps":
        spec = LayerSpec("steps", propagations=None, weight_arg=weight_arg)
    else:
        spec = LayerSpec(kind, propagations=propagations, weight_arg=weight_arg)
    _REG.refused.pop(cls, None)
    _REG.specs[cls] = spec


def layer_spec(module: Module) -> LayerSpec:
    """The spec of ``module`` (exact class match), or :class:`UnsupportedLayerError` saying why and what to do."""
    cls = type(module)
    if cls in _REG.specs:
        return _REG.specs[cls]
    if cls in _REG.refused:
        raise UnsupportedLayerError(
            f"{cls.__name__} cannot run on graph partitions: {_REG.refused[cls]}. Supported layers: "
            f"{', '.join(supported_layers())}."
        )
    raise UnsupportedLayerError(
        f"{cls.__name__} is a MessagePassing layer lightning-halo does not know, so it cannot tell whether running it "
        "on a partition gives the full-graph result. If the output of a node depends only on its own features, its "
        "in-edges and their sources' features, declare it: lightning_halo.register_layer("
        f"{cls.__name__}, 'bipartite' if it accepts (x_src, x_dst) else 'full'); if it propagates several times per "
        "call, use 'steps'."
    )


def layer_kind(module: Module) -> LayerKind:
    """The kind of ``module`` (see :func:`layer_spec`)."""
    return layer_spec(module).kind


_COARSENING = (
    "it coarsens the graph (keeps or merges nodes and edges chosen over the whole graph), which a partition "
    "cannot do alone; partitioned training supports node-level models"
)


def recomputed_in_backward(module: Module) -> bool:
    """Whether ``module`` runs its layers without autograd in forward and again in backward: a reversible block of PyG
    (``InvertibleModule``, e.g. ``GroupAddRev``), or a ``DeepGCNLayer(ckpt_grad=True)`` (its layer under torch's
    reentrant checkpoint, as DeeperGCN on ogbn-proteins runs it).

    Example:
        >>> from torch_geometric.nn import DeepGCNLayer, GroupAddRev, SAGEConv
        >>> recomputed_in_backward(GroupAddRev(SAGEConv(4, 4), num_groups=2)), recomputed_in_backward(SAGEConv(4, 4))
        (True, False)
        >>> recomputed_in_backward(DeepGCNLayer(SAGEConv(4, 4), ckpt_grad=True))
        True
    """
    from torch_geometric.nn import DeepGCNLayer
    from torch_geometric.nn.models.rev_gnn import InvertibleModule

    return isinstance(module, InvertibleModule) or (isinstance(module, DeepGCNLayer) and bool(module.ckpt_grad))


def refused_wrapper(module: Module) -> Optional[str]:
    """Why a non-message-passing module of PyG (e.g. ``GPSConv``, a pooling layer) is refused, or None."""
    cls = type(module)
    if not cls.__module__.startswith("torch_geometric"):
        return None
    if cls.__module__.startswith("torch_geometric.nn.pool") and cls.__name__.endswith("Pooling"):
        return _COARSENING
    if cls.__name__ == "GraphUNet":
        return _COARSENING
    return _REG.refused_wrappers.get(cls.__name__)


#: PyG normalisations whose statistics span every node they see: on a partition those would be the rank's own
#: nodes, not the whole graph's. Those in :data:`GLOBAL_GRAPH_NORMS` are made global
#: (:mod:`lightning_halo.layers.graphnorm`), the others are refused at fit on more than one process. Batch norms
#: (and ``DiffGroupNorm``, whose statistics are a ``BatchNorm1d``'s) are global too
#: (:mod:`lightning_halo.layers.batchnorm`); ``MessageNorm`` is per node.
_GRAPH_NORMS: dict[str, str] = {
    "GraphNorm": "it normalises with the mean and variance over all nodes of each graph",
    "GraphSizeNorm": "it divides by the square root of each graph's node count",
    "HeteroBatchNorm": "its per-type batch statistics are over all nodes it sees (not made global, unlike BatchNorm)",
    "InstanceNorm": "it normalises with the statistics over all nodes of each graph",
    "LayerNorm": "with mode='graph' (the default) it normalises over all nodes of each graph",
    "MeanSubtractionNorm": "it subtracts the mean over all nodes of each graph",
    "PairNorm": "it centres and rescales with the mean and norm over all nodes",
}
#: The graph-wide norms run with the statistics of every rank's rows (:mod:`lightning_halo.layers.graphnorm`).
GLOBAL_GRAPH_NORMS = ("GraphNorm", "GraphSizeNorm", "InstanceNorm", "LayerNorm", "MeanSubtractionNorm", "PairNorm")


def graph_norms() -> dict[str, str]:
    """Name -> why, for PyG's normalisations that compute statistics over the whole graph (a partition alone would
    give the rank's statistics; :data:`GLOBAL_GRAPH_NORMS` are made global, the others refused).

    Example:
        >>> "PairNorm" in graph_norms() and "MessageNorm" not in graph_norms()
        True
    """
    return dict(_GRAPH_NORMS)


def graph_norm_refusal(name: str, module: Module) -> Optional[str]:
    """Why ``module`` (at ``name`` in the model) cannot run on partitions, if it is a graph-wide PyG norm that is
    not made global, else ``None``. Only PyG's own classes are matched (a user's class of the same name is not
    theirs).

    Example:
        >>> from torch_geometric.nn import HeteroBatchNorm, PairNorm
        >>> graph_norm_refusal("n", PairNorm()) is None  # made global
        True
        >>> graph_norm_refusal("n", HeteroBatchNorm(4, num_types=2)).startswith("n (torch_geometric HeteroBatchNorm)")
        True
    """
    cls = type(module)
    why = _GRAPH_NORMS.get(cls.__name__)
    if why is None or cls.__name__ in GLOBAL_GRAPH_NORMS or not cls.__module__.startswith("torch_geometric"):
        return None
    return (
        f"{name} (torch_geometric {cls.__name__}): {why}; on a partition those are the rank's own nodes, not the "
        f"whole graph, and lightning-halo does not make it global. Use a norm that it does: BatchNorm, "
        f"{', '.join(GLOBAL_GRAPH_NORMS)} (LayerNorm in either mode)"
    )


def graph_norm_table() -> list[tuple[str, str, str]]:
    """``(name, why a partition alone differs, what lightning-halo does)`` for docs/layers.md."""
    made_global = "exact: statistics over every rank's rows (one all-reduce each, forward and backward)"
    return [(name, why, made_global if name in GLOBAL_GRAPH_NORMS else "refused at fit (more than one process)")
            for name, why in sorted(_GRAPH_NORMS.items())]  # fmt: skip


def supported_layers() -> dict[str, LayerKind]:
    """Name -> kind of every layer class lightning-halo knows how to run (built-in and registered).

    Example:
        >>> supported_layers()["SAGEConv"]
        'bipartite'
    """
    return {cls.__name__: spec.kind for cls, spec in sorted(_REG.specs.items(), key=lambda kv: kv[0].__name__)}


def unsupported_layers() -> dict[str, str]:
    """Name -> reason for PyG layers (and wrapper modules) that cannot run on partitions.

    Example:
        >>> "EGConv" in unsupported_layers()
        True
    """
    out = {cls.__name__: why for cls, why in _REG.refused.items()}
    out.update(_REG.refused_wrappers)
    return dict(sorted(out.items()))


def wrapper_layers() -> dict[str, str]:
    """Name -> how it runs, for PyG conv modules that wrap a supported layer (``DirGNNConv``, ...).

    Example:
        >>> "DirGNNConv" in wrapper_layers()
        True
    """
    return dict(sorted(_REG.wrappers.items()))


_HOW = {
    "bipartite": "exact: bipartite `(x_all, x_inner)`, no work for halo rows",
    "full": "exact: on `[x_inner; x_halo]`, output cut to the inner rows",
    "gcn": "exact: full, normalised with global degrees (the halo's from their owners, once)",
    "steps": "exact per propagation step: the halo of what it propagates is exchanged before every step",
    "types": "exact on heterogeneous partitions: every source type's rows with their halo, outputs cut to the inner rows",
}


def layer_table() -> list[tuple[str, str, str]]:
    """``(name, how it runs or why it is refused, fused kernel)`` for every known layer and wrapper, by name.

    Example:
        >>> dict((n, f) for n, _, f in layer_table())["GATConv"]
        'no'
    """
    rows = []
    for cls, spec in _REG.specs.items():
        how = _HOW[spec.kind]
        if spec.norm is not None and spec.kind != "gcn":
            how += "; its normalisation uses global degrees"
        fused = "yes" if spec.sparse_reduce is not None else "no"
        if spec.sparse_reduce is not None and spec.partial_sums is not None:
            fused += ", with halo partial sums" + (" (mean/sum, project=False)" if cls.__name__ == "SAGEConv" else "")
        rows.append((cls.__name__, how, fused))
    rows += [(name, f"exact: {how}", "as its inner layer") for name, how in _REG.wrappers.items()]
    rows += [(cls.__name__, f"refused: {why}", "-") for cls, why in _REG.refused.items()]
    rows += [(name, f"refused: {why}", "-") for name, why in _REG.refused_wrappers.items()]
    return sorted(rows)


def clear_caches(module: Module) -> None:
    """Drop PyG's per-layer caches (computed on another graph: the whole one, or another partition)."""
    clear_layer_caches(module, layer_spec(module).caches)


__all__ = [
    "KINDS",
    "REDUCES",
    "Feed",
    "LayerKind",
    "LayerSpec",
    "Normalization",
    "UnsupportedLayerError",
    "check_kind",
    "class_propagate_fuses",
    "clear_caches",
    "graph_norm_table",
    "GLOBAL_GRAPH_NORMS",
    "graph_norm_refusal",
    "graph_norms",
    "layer_table",
    "layer_kind",
    "layer_spec",
    "refused_instance",
    "refused_wrapper",
    "register_aggregation",
    "register_layer",
    "supported_layers",
    "unsupported_layers",
    "wrapper_layers",
]
