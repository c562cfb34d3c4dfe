r"""Halo partial sums on heterogeneous partitions: one exchange per layer and source type.

The edge-type modules of one layer (``to_hetero``'s ``conv1.author__writes__paper``,
``HeteroConv``'s ``convs``) that start at the same source type read the same rows
``x_dict[src]``. On a homogeneous partition a linear aggregation receives some halo rows as
partial sums (:mod:`lightning_halo.layers.reduction`); here each relation :math:`r` has its own
coefficients :math:`m^r_{vu}` and its own targets, so a partial sum is for one relation and one
target, :math:`p^r_v = \sum_{u \in V_a} m^r_{vu}\, x_u`, while a fetched halo row serves every
relation that reads it. :func:`~lightning_halo.partition.cover.relation_cover` picks the fewest
rows for all of them at once (a minimum vertex cover over ``(relation, owner, target)``), so the
layer still makes one exchange per source type, never larger than fetching the rows.

Which relations a layer has is read from the model before the first call (the ``ModuleDict`` the
edge-type modules live in: :func:`relation_layers`), and how each aggregates is decided as its
call will decide it (:func:`predict_member`): so every rank builds the same exchange when the
first relation asks for the source type's halo. A relation whose call then differs from the
prediction (other edges or weights, another aggregation) fetches its own rows: exact, and said
in the layer report. Relations that cannot take partial sums (attention, ``max``, a normalised
``GCNConv``, edge weights) get every halo row they read in the same exchange.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

import torch
from torch import Tensor
from torch.nn import Module, ModuleDict

from lightning_halo.exchange.cover import CoverPlan, CoverRoute, RowsExchange, build_cover_plan, build_route
from lightning_halo.exchange.plan import ExchangePlan
from lightning_halo.layers.call import Aggregation, choose_aggregation
from lightning_halo.layers.reduction import HaloReduction, choose_reduction, covered_adjacency
from lightning_halo.layers.registry import LayerSpec
from lightning_halo.partition.cover import RelationCut, cut_edges, relation_cover
from lightning_halo.partition.hetero import EdgeType, HeteroHaloPartition

#: ``adjacency(edge_type, n_dst, n_src, reduce, dtype)``: a relation's fused adjacency over the partition's edges.
RelationAdjacencyOf = Callable[[EdgeType, int, int, str, torch.dtype], Tensor]


def _edge_type_of_key(key: object) -> Optional[EdgeType]:
    """A ``ModuleDict`` key as an edge type: ``HeteroConv``'s tuples, ``to_hetero``'s ``"src__rel__dst"``."""
    if isinstance(key, tuple) and len(key) == 3 and all(isinstance(k, str) for k in key):
        return key  # type: ignore[return-value]
    if isinstance(key, str):
        parts = key.split("__")
        if len(parts) == 3 and all(parts):
            return (parts[0], parts[1], parts[2])
    return None


def relation_layers(model: Module, layers: Mapping[str, Module]) -> dict[str, EdgeType]:
    """The edge type of every hooked layer that is an edge-type module of a ``ModuleDict`` (``to_hetero``,
    ``HeteroConv``), by layer name; layers elsewhere are not members of any layer's exchange.

    Example:
        >>> from torch_geometric.nn import HeteroConv, SAGEConv
        >>> conv = HeteroConv({("a", "to", "b"): SAGEConv((-1, -1), 4)})
        >>> relation_layers(conv, {"convs.<a___to___b>": conv.convs[("a", "to", "b")]})
        {'convs.<a___to___b>': ('a', 'to', 'b')}
    """
    by_id = {id(m): name for name, m in layers.items()}
    found: dict[str, EdgeType] = {}
    for module in model.modules():
        if not isinstance(module, ModuleDict):
            continue
        for key, child in module.items():
            name = by_id.get(id(child))
            edge_type = _edge_type_of_key(key)
            if name is not None and edge_type is not None:
                found[name] = edge_type
    return found


def group_of(layer: str) -> str:
    """The layer an edge-type module belongs to (``conv1.author__writes__paper`` -> ``conv1``): its fetches' name."""
    return layer.rsplit(".", 1)[0] if "." in layer else layer


@dataclass(frozen=True)
class Member:
    """One edge-type module of a layer that reads a source type: partial sums under ``reduce``, or rows (why)."""

    layer: str
    edge_type: EdgeType
    reduce: Optional[str]
    why: str = ""


def predict_member(
    layer: str, module: Module, spec: LayerSpec, edge_type: EdgeType, aggregation: Aggregation,
    reduction: HaloReduction, world_size: int, on_cuda: bool,
) -> Member:  # fmt: skip
    """How the module's call will aggregate, decided as :func:`~lightning_halo.layers.hetero.relation_call`
    decides it for a call with the partition's edges and no edge weights."""
    if spec.kind == "gcn":
        return Member(layer, edge_type, None, "it normalises with both ends' degrees (rows on heterogeneous partitions)")
    choice = choose_aggregation(aggregation, layer, spec, module, None, False, on_cuda)
    linear = spec.linear_before_aggregation(module)
    reduce = choose_reduction(reduction, world_size, "in", False, False, choice.reduce, linear)
    if not reduce.cover:
        return Member(layer, edge_type, None, reduce.why if choice.reduce is not None else choice.why)
    return Member(layer, edge_type, choice.reduce)


@dataclass
class TypeCover:
    r"""One layer's exchange for one source type with partial sums (see the module docstring).

    Attributes:
        node_type: the source type.
        members: the layer's relations that read it, by layer name.
        plan: the joint layout (fetched rows and every relation's partial sums, owner after owner).
        route: its send operator and coefficients.
        ranges: each folding relation's targets in the joint numbering.
        coefficients: the coefficients the route was built with, per folding relation (its folded edges).
    """

    node_type: str
    members: dict[str, Member]
    plan: CoverPlan
    route: CoverRoute
    ranges: dict[str, tuple[int, int]]
    coefficients: dict[str, Tensor]
    _views: dict[str, CoverPlan] = field(default_factory=dict, repr=False)
    _covered: dict[tuple[str, int], Tensor] = field(default_factory=dict, repr=False)

    @property
    def block(self) -> int:
        return self.plan.block

    def halo(self, block: Tensor) -> Tensor:
        """``[n_halo, ...]`` rows of a relation that reads rows: the fetched ones from the block, zero where a row
        was not fetched (no relation that reads rows has an edge from it, :func:`relation_cover`)."""
        rows = block.index_select(0, self.plan.kept_pos.to(block.device))
        shape = (self.plan.n_halo, *block.shape[1:])
        return block.new_zeros(shape).index_copy(0, self.plan.kept_cols.to(block.device), rows)

    def adjacency(self, layer: str, n_dst: int, n_rows: int, build: Callable[[], Tensor], dtype: torch.dtype) -> Tensor:
        """Relation ``layer``'s adjacency over ``[inner | block]`` with ``n_dst`` rows (its target type's inner
        rows ``n_rows``, more for a call that computes every row); ``build()`` gives its adjacency over
        ``[inner | halo]``. Its folded edges' values must be those the route sends partial sums with."""
        key = (layer, n_dst)
        if key not in self._covered:
            with torch.no_grad():
                covered, c = covered_adjacency(build(), self.members[layer].reduce or "sum", self._views[layer], n_dst,
                                               dtype, n_rows=n_rows)  # fmt: skip
            want = self.coefficients[layer]
            if c.shape != want.shape or not torch.equal(c.cpu().to(want.dtype), want):
                raise RuntimeError(
                    f"internal error in lightning-halo: relation '{layer}' computes with other coefficients than its "
                    "partial sums were sent with; please report it (halo_reduction='none' avoids it)"
                )
            self._covered[key] = covered
        return self._covered[key]


def build_type_cover(
    part: HeteroHaloPartition, node_type: str, members: list[Member], plan: ExchangePlan, adjacency: RelationAdjacencyOf,
    dtype: torch.dtype, device: torch.device, exchange: RowsExchange,
) -> TypeCover:  # fmt: skip
    """The :class:`TypeCover` of one layer and source type (two small exchanges with every peer: the
    structure, then the coefficients; all ranks call it together)."""
    n_inner, n_local = plan.n_inner, int(part[node_type].num_nodes)
    cuts, targets = [], []
    for m in members:
        h, v = cut_edges(part[m.edge_type].edge_index, n_inner)
        n_targets = int(part[m.edge_type[-1]].n_inner)
        cuts.append(RelationCut(h, v, n_targets, m.reduce is not None))
        targets.append(n_targets)
    cover, offsets = relation_cover(cuts, plan.n_halo, plan.recv_counts)
    folding = [(m, c, off, n) for m, c, off, n in zip(members, cuts, offsets, targets) if c.folds]
    empty = torch.empty(0, dtype=torch.long)
    h_all = torch.cat([c.halo.long() for _, c, _, _ in folding]) if folding else empty
    v_all = torch.cat([c.target.long() + off for _, c, off, _ in folding]) if folding else empty
    total = max(sum(targets), 1)
    cplan = build_cover_plan(plan, (h_all, v_all), cover, part[node_type].n_id, exchange, n_targets=total)
    ranges = {m.layer: (off, off + n) for m, _, off, n in folding}
    views = {m.layer: cplan.relation_view(*ranges[m.layer]) for m, _, _, _ in folding}
    joint = torch.zeros(cplan.folded_col.numel(), dtype=dtype)
    coefficients: dict[str, Tensor] = {}
    covered: dict[tuple[str, int], Tensor] = {}
    for m, _, _, n in folding:
        view, mine = views[m.layer]
        with torch.no_grad():
            adj = adjacency(m.edge_type, n, n_local, m.reduce or "sum", dtype)
            covered[(m.layer, n)], c = covered_adjacency(adj, m.reduce or "sum", view, n, dtype, n_rows=n)
        coefficients[m.layer] = c.cpu()
        joint[mine] = c.cpu()
    route = build_route(cplan, joint, exchange, device)
    return TypeCover(node_type, {m.layer: m for m in members}, cplan, route, ranges, coefficients,
                     {k: v for k, (v, _) in views.items()}, covered)  # fmt: skip
