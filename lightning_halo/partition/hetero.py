r"""Heterogeneous graphs: one node assignment over every node type, and each part's nodes, halo and edges per type.

A :class:`~torch_geometric.data.HeteroData` is partitioned as DistDGL does it: its node types are
laid end to end in one homogeneous id space (type :math:`t`'s node :math:`i` is
:math:`o_t + i`, :math:`o_t` the summed counts of the types before it), every edge type's edges
are mapped into it, and the homogeneous graph goes through the same partitioners as a ``Data``
(:func:`~lightning_halo.partition.graph.assign_parts`). METIS balances the labelled type itself,
as a second balance constraint (:mod:`~lightning_halo.partition.metis_constraints`); KaMinPar as we
call it balances one weight per node. After either, :func:`balance_type` restores the labelled
type's balance where it is off by more than the tolerance, moving the fewest labelled nodes it
must, each to the part holding most of its neighbours (after METIS with two constraints: none).

:func:`plan_hetero_parts` then gives every part, per node type, its inner nodes (increasing id
within the type), its halo (grouped by owner, increasing id within each owner) and what it sends
to every other part, and per edge type the edges whose target it owns, in local ids: the source
in the source type's local space (inner, then halo), the target among the target type's inner
nodes. It is :class:`~lightning_halo.partition.halo.HaloPlan` of the homogeneous view, read per
type: a part's type-:math:`t` halo is its homogeneous halo restricted to type :math:`t`, in the
same order.

All functions here are pure: tensors in, tensors out.
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor
from torch_geometric.data import HeteroData

from lightning_halo.memo import TensorMemo
from lightning_halo.partition.graph import assign_parts, symmetric_csr
from lightning_halo.partition.halo import plan_halos
from lightning_halo.partition.halo_partition import stacked_view, tensor_digest

EdgeType = tuple[str, str, str]


class HeteroGraphError(ValueError):
    """A heterogeneous graph that cannot be partitioned as given; the message names the type and the fix."""


@dataclass(frozen=True)
class HeteroLayout:
    """The node and edge types of a heterogeneous graph and where each node type sits in the homogeneous ids.

    Args:
        node_types: in the graph's order.
        edge_types: ``(source, relation, target)``, in the graph's order.
        num_nodes: nodes of every type.
        offsets: the homogeneous id of every type's node 0.
        labelled: the node types that carry ``y``.
    """

    node_types: tuple[str, ...]
    edge_types: tuple[EdgeType, ...]
    num_nodes: dict[str, int]
    offsets: dict[str, int]
    labelled: tuple[str, ...]

    @property
    def total_nodes(self) -> int:
        """Nodes of all types together: the size of the homogeneous id space."""
        return sum(self.num_nodes.values())

    def node_type_of(self) -> Tensor:
        """``[N]`` the index (in :attr:`node_types`) of every homogeneous node's type."""
        counts = torch.tensor([self.num_nodes[t] for t in self.node_types], dtype=torch.long)
        return torch.repeat_interleave(torch.arange(len(self.node_types)), counts)


def hetero_layout(data: Any) -> HeteroLayout:
    """Check a :class:`~torch_geometric.data.HeteroData` and lay its node types out end to end.

    Raises:
        HeteroGraphError: a node type without ``x`` or ``num_nodes``; an edge type naming a node
            type the graph lacks, or without ``edge_index``, or with ids out of range for its types;
            labels on no node type. Each message names the type.

    Example:
        >>> from torch_geometric.data import HeteroData
        >>> g = HeteroData()
        >>> g["paper"].x, g["paper"].y = torch.randn(3, 4), torch.tensor([0, 1, 0])
        >>> g["author"].num_nodes = 2
        >>> g["author", "writes", "paper"].edge_index = torch.tensor([[0, 1], [2, 0]])
        >>> layout = hetero_layout(g)
        >>> layout.offsets, layout.labelled
        ({'paper': 0, 'author': 3}, ('paper',))
    """
    node_types = tuple(data.node_types)
    if not node_types:
        raise HeteroGraphError("the heterogeneous graph has no node types: give each node type x or num_nodes")
    num_nodes: dict[str, int] = {}
    for t in node_types:
        store = data[t]
        if "x" in store and store.x is not None:
            n = int(store.x.size(0))
            if "num_nodes" in store and store.num_nodes is not None and int(store["num_nodes"]) != n:
                raise HeteroGraphError(f"node type {t!r}: num_nodes is {int(store['num_nodes'])} but x has {n} rows; "
                                       f"drop num_nodes or make them agree")  # fmt: skip
        elif "num_nodes" in store and store["num_nodes"] is not None:
            n = int(store["num_nodes"])
        else:
            raise HeteroGraphError(
                f"node type {t!r} has neither x nor num_nodes: give it features (data[{t!r}].x) or, for a type "
                f"without features, its count (data[{t!r}].num_nodes = N; a model looks its nodes up by n_id)"
            )
        if n <= 0:
            raise HeteroGraphError(f"node type {t!r} has no nodes: remove the type or give it nodes")
        num_nodes[t] = n
    offsets, start = {}, 0
    for t in node_types:
        offsets[t] = start
        start += num_nodes[t]
    edge_types = tuple(tuple(e) for e in data.edge_types)
    for e in edge_types:
        src, _, dst = e
        for end, t in (("source", src), ("target", dst)):
            if t not in num_nodes:
                raise HeteroGraphError(f"edge type {e!r} names the {end} node type {t!r}, which the graph does not have "
                                       f"(its node types: {list(node_types)}): add data[{t!r}] or remove the edge type")  # fmt: skip
        store = data[e]
        if "edge_index" not in store or store.edge_index is None:
            raise HeteroGraphError(f"edge type {e!r} has no edge_index: give it one ([2, E], ids within each type) "
                                   f"or remove the edge type")  # fmt: skip
        ei = store.edge_index
        if ei.dim() != 2 or ei.size(0) != 2:
            raise HeteroGraphError(f"edge type {e!r}: edge_index must be [2, E], got {list(ei.shape)}")
        if ei.is_floating_point() or ei.dtype == torch.bool:
            raise HeteroGraphError(f"edge type {e!r}: edge_index must hold integer ids, got {ei.dtype}")
        if ei.numel():
            for row, end, t in ((0, "source", src), (1, "target", dst)):
                lo, hi = int(ei[row].min()), int(ei[row].max())
                if lo < 0 or hi >= num_nodes[t]:
                    raise HeteroGraphError(
                        f"edge type {e!r}: {end} ids run from {lo} to {hi}, but node type {t!r} has {num_nodes[t]} "
                        f"nodes (ids 0..{num_nodes[t] - 1}): ids are counted within each node type"
                    )
    labelled = tuple(t for t in node_types if "y" in data[t] and data[t].y is not None)
    if not labelled:
        raise HeteroGraphError(
            f"no node type has labels y (node types: {list(node_types)}): set data[<target type>].y and its masks"
        )
    for t in labelled:
        if int(data[t].y.size(0)) != num_nodes[t]:
            raise HeteroGraphError(f"node type {t!r}: y has {int(data[t].y.size(0))} rows but the type has "
                                   f"{num_nodes[t]} nodes: give one label per node (mask the unlabelled ones)")  # fmt: skip
    return HeteroLayout(node_types, edge_types, num_nodes, offsets, labelled)  # type: ignore[arg-type]


def homogeneous_edges(data: Any, layout: HeteroLayout) -> Tensor:
    """``[2, E]`` every edge type's edges in homogeneous ids, edge types in :attr:`HeteroLayout.edge_types` order."""
    pieces = []
    for src, rel, dst in layout.edge_types:
        ei = data[src, rel, dst].edge_index.to(torch.long)
        pieces.append(torch.stack([ei[0] + layout.offsets[src], ei[1] + layout.offsets[dst]]))
    return torch.cat(pieces, dim=1) if pieces else torch.empty(2, 0, dtype=torch.long)


def balance_type(parts: Tensor, members: Tensor, num_parts: int, edge_index: Tensor, tolerance: float = 0.05) -> Tensor:
    r"""Move nodes of one kind (``members``) between parts until every part holds at most
    :math:`\lceil (1 + \epsilon)\, n / P \rceil` of them; the others stay where they are.

    Members move from the fullest part to the emptiest one at a time, each time the member with the
    largest gain (its neighbours in the target part minus those in its own, updated after every
    move), so a group of neighbours moves together and the cut grows as little as a greedy move
    can make it (Fiduccia-Mattheyses' rule, one pass, no moves back). Deterministic (ties go to
    the lowest id).

    Args:
        parts (Tensor): ``[N]`` part of every node (not modified).
        members (Tensor): ``[N]`` bool, the nodes to balance (the labelled type's).
        num_parts (int): :math:`P`.
        edge_index (Tensor): ``[2, E]`` edges (either direction: the gains count both).
        tolerance (float, optional): :math:`\epsilon`. (default: ``0.05``)

    Returns:
        ``[N]`` the new parts.

    Example:
        >>> parts = torch.tensor([0, 0, 0, 0, 1, 1])
        >>> members = torch.tensor([True, True, True, True, False, False])
        >>> balance_type(parts, members, 2, torch.tensor([[0, 3], [1, 4]]), 0.0).tolist()
        [0, 0, 1, 1, 1, 1]
    """
    parts = parts.clone()
    n_members = int(members.sum())
    if num_parts < 2 or n_members == 0:
        return parts
    cap = -(-int(n_members * (1 + tolerance)) // num_parts)
    cap = max(cap, -(-n_members // num_parts))
    counts = torch.bincount(parts[members], minlength=num_parts)
    if int(counts.max()) <= cap:
        return parts
    n = parts.numel()
    xadj, adjncy = symmetric_csr(edge_index, n)
    xadj_t, adj_t = torch.from_numpy(xadj).long(), torch.from_numpy(adjncy).long()
    member_ids = torch.nonzero(members).flatten()
    is_member = members.numpy()
    where = parts.numpy()  # a view: moves write through to parts
    while int(counts.max()) > cap:
        source = int(torch.argmax(counts))
        target = int(torch.argmin(counts))
        movable = min(int(counts[source]) - cap, cap - int(counts[target]))
        if movable <= 0:  # every other part is full: only parts above the cap can give
            break
        cand = member_ids[parts[member_ids] == source]
        gain = dict(zip(cand.tolist(), _gain(cand, parts, xadj_t, adj_t, source, target).tolist()))
        heap = [(-g, v) for v, g in gain.items()]  # the largest gain first, ties to the lowest id
        heapq.heapify(heap)
        moved = 0
        while moved < movable and heap:
            g, v = heapq.heappop(heap)
            if where[v] != source or -g != gain[v]:
                continue  # moved already, or an outdated entry
            where[v] = target
            moved += 1
            for u in adjncy[xadj[v] : xadj[v + 1]].tolist():  # each neighbour left in source: one more in target, one fewer at home
                if is_member[u] and where[u] == source:
                    gain[u] += 2
                    heapq.heappush(heap, (-gain[u], u))
        counts[source] -= moved
        counts[target] += moved
    return parts


def _gain(nodes: Tensor, parts: Tensor, xadj: Tensor, adjncy: Tensor, source: int, target: int) -> Tensor:
    """Neighbours in ``target`` minus neighbours in ``source`` of each node (symmetric CSR)."""
    deg = xadj[nodes + 1] - xadj[nodes]
    owner = torch.repeat_interleave(torch.arange(nodes.numel()), deg)
    starts = torch.repeat_interleave(xadj[nodes], deg)
    pos = torch.arange(int(deg.sum())) - torch.repeat_interleave(torch.cumsum(deg, 0) - deg, deg)
    neigh_part = parts[adjncy[starts + pos]]
    score = (neigh_part == target).long() - (neigh_part == source).long()
    return torch.zeros(nodes.numel(), dtype=torch.long).index_add_(0, owner, score)


@dataclass(frozen=True)
class HeteroAssignment:
    """The part of every node, per node type, and how it was made.

    Args:
        parts: ``{node type: [N_t] part}``.
        homogeneous: ``[N]`` the same parts in homogeneous ids.
        layout: the graph's :class:`HeteroLayout`.
        num_parts: :math:`P`.
        partitioner: what ran (``"auto"`` resolved).
        balanced_type: the type :func:`balance_type` balanced (``None``: none).
        moved: nodes it moved.
        details: the partitioner's settings and figures.
    """

    parts: dict[str, Tensor]
    homogeneous: Tensor
    layout: HeteroLayout
    num_parts: int
    partitioner: str
    balanced_type: str | None
    moved: int
    details: dict[str, Any] = field(default_factory=dict)


def assign_hetero_parts(
    data: Any,
    num_parts: int,
    *,
    partitioner: str = "metis",
    seed: int = 0,
    balance_type_of: str | None = None,
    tolerance: float = 0.05,
    threads: int = 1,
) -> HeteroAssignment:
    r"""Assign every node of every type of a heterogeneous graph to one of ``num_parts`` parts.

    The homogeneous view (:func:`homogeneous_edges`) is partitioned by ``partitioner`` balancing
    all nodes, and with METIS the nodes of ``balance_type_of`` (default: the labelled type, where
    there is one) as a second constraint; then that type is balanced within ``tolerance`` by
    :func:`balance_type`: the training work of a rank is its labelled nodes' loss, so that type
    decides how even the ranks' steps are.

    Args:
        data (HeteroData): the graph (checked by :func:`hetero_layout`).
        num_parts (int): :math:`P`.
        partitioner (str, optional): as for :func:`~lightning_halo.partition.graph.partition_graph`.
            (default: ``"metis"``)
        seed (int, optional): the partitioner's seed. (default: ``0``)
        balance_type_of (str, optional): the node type to balance; ``None``: the only labelled type
            (none where several are labelled). (default: ``None``)
        tolerance (float, optional): how far above the mean a part's count of that type may be.
            (default: ``0.05``)
        threads (int, optional): KaMinPar's threads. (default: ``1``)
    """
    layout = hetero_layout(data)
    if balance_type_of is None and len(layout.labelled) == 1:
        balance_type_of = layout.labelled[0]
    if balance_type_of is not None and balance_type_of not in layout.num_nodes:
        raise HeteroGraphError(f"balance_type_of={balance_type_of!r} is not a node type of the graph "
                               f"(its node types: {list(layout.node_types)})")  # fmt: skip
    edges = homogeneous_edges(data, layout)
    members = None
    if balance_type_of is not None:
        start = layout.offsets[balance_type_of]
        members = torch.zeros(layout.total_nodes, dtype=torch.bool)
        members[start : start + layout.num_nodes[balance_type_of]] = True
    # METIS balances the type itself as a second constraint; the post-pass then moves few nodes or none
    assignment = assign_parts(edges, layout.total_nodes, num_parts, partitioner=partitioner, seed=seed, threads=threads,  # type: ignore[arg-type]
                              constraint=members)  # fmt: skip
    parts, moved = assignment.parts, 0
    if members is not None:
        balanced = balance_type(parts, members, num_parts, edges, tolerance)
        moved = int((balanced != parts).sum())
        parts = balanced
    by_type = {t: parts[layout.offsets[t] : layout.offsets[t] + layout.num_nodes[t]] for t in layout.node_types}
    return HeteroAssignment(by_type, parts, layout, num_parts, assignment.partitioner, balance_type_of, moved, dict(assignment.details))


@dataclass
class TypePlan:
    """One part's nodes of one node type.

    Args:
        n_id: ``[n_inner + n_halo]`` global ids within the type: inner nodes (increasing), then the
            halo (grouped by owner, increasing within each owner).
        n_inner: inner nodes.
        recv_counts: ``[P]`` halo rows received from each part (its own entry 0).
        send_index: local (inner) ids of the rows sent, concatenated by receiving part.
        send_counts: ``[P]`` rows sent to each part.
    """

    n_id: Tensor
    n_inner: int
    recv_counts: list[int]
    send_index: Tensor
    send_counts: list[int]

    @property
    def n_halo(self) -> int:
        return int(self.n_id.numel()) - self.n_inner


@dataclass
class HeteroPartPlan:
    """One part of a heterogeneous graph: per node type a :class:`TypePlan`; per edge type the kept
    edges' positions in the graph's edge list of that type and their local ``edge_index``."""

    part: int
    num_parts: int
    types: dict[str, TypePlan]
    edge_ids: dict[EdgeType, Tensor]
    edge_index: dict[EdgeType, Tensor]


def plan_hetero_parts(data: Any, assignment: HeteroAssignment) -> list[HeteroPartPlan]:
    """Every part's nodes, halo, exchange plan and local edges, per type (see the module's docstring).

    Example:
        >>> from torch_geometric.data import HeteroData
        >>> g = HeteroData()
        >>> g["paper"].x, g["paper"].y = torch.randn(4, 2), torch.zeros(4, dtype=torch.long)
        >>> g["author"].num_nodes = 2
        >>> g["author", "writes", "paper"].edge_index = torch.tensor([[0, 1, 1], [0, 2, 3]])
        >>> a = HeteroAssignment({"paper": torch.tensor([0, 0, 1, 1]), "author": torch.tensor([0, 0])},
        ...                      torch.tensor([0, 0, 1, 1, 0, 0]), hetero_layout(g), 2, "given", None, 0)
        >>> p1 = plan_hetero_parts(g, a)[1]
        >>> p1.types["author"].n_id.tolist(), p1.edge_index[("author", "writes", "paper")].tolist()
        ([1], [[0, 0], [0, 1]])
    """
    layout = assignment.layout
    parts = assignment.homogeneous
    num_parts = assignment.num_parts
    plan = plan_halos(homogeneous_edges(data, layout), parts, num_parts)
    type_of = layout.node_type_of()
    # local id of every homogeneous node in its own part's space of its type (inner nodes only here)
    inner_local = torch.empty(layout.total_nodes, dtype=torch.long)
    inner_by_part_type: dict[tuple[int, int], Tensor] = {}
    for p in range(num_parts):
        inner = plan.inner(p)  # increasing homogeneous ids: grouped by type, increasing within each
        for ti in range(len(layout.node_types)):
            ids = inner[type_of[inner] == ti]
            inner_by_part_type[(p, ti)] = ids
            inner_local[ids] = torch.arange(ids.numel())
    halo_by_part_type = {(p, ti): plan.halos[p][type_of[plan.halos[p]] == ti]
                         for p in range(num_parts) for ti in range(len(layout.node_types))}  # fmt: skip
    result: list[HeteroPartPlan] = []
    for p in range(num_parts):
        types: dict[str, TypePlan] = {}
        # every halo node's local id within its type (types' homogeneous ids never overlap: one tensor per part)
        halo_local = torch.full((layout.total_nodes,), -1, dtype=torch.long)
        for ti, t in enumerate(layout.node_types):
            inner, halo = inner_by_part_type[(p, ti)], halo_by_part_type[(p, ti)]
            recv = torch.bincount(parts[halo], minlength=num_parts).tolist()
            sends, send_counts = [], []
            for q in range(num_parts):
                theirs = halo_by_part_type[(q, ti)] if q != p else halo[:0]
                mine = theirs[parts[theirs] == p]  # q's halo rows I own, in q's halo order
                sends.append(inner_local[mine])
                send_counts.append(int(mine.numel()))
            offset = layout.offsets[t]
            types[t] = TypePlan(torch.cat([inner, halo]) - offset, int(inner.numel()), recv, torch.cat(sends), send_counts)
            halo_local[halo] = int(inner.numel()) + torch.arange(halo.numel())
        edge_ids: dict[EdgeType, Tensor] = {}
        edge_index: dict[EdgeType, Tensor] = {}
        for e in layout.edge_types:
            src_t, _, dst_t = e
            ei = data[e].edge_index.to(torch.long)
            src, dst = ei[0] + layout.offsets[src_t], ei[1] + layout.offsets[dst_t]
            keep = torch.nonzero(parts[dst] == p).flatten()
            s, d = src[keep], dst[keep]
            local_src = torch.where(parts[s] == p, inner_local[s], halo_local[s])
            edge_ids[e] = keep
            edge_index[e] = torch.stack([local_src, inner_local[d]])
        result.append(HeteroPartPlan(p, num_parts, types, edge_ids, edge_index))
    return result


def type_counts(plans: Sequence[HeteroPartPlan]) -> list[dict[str, dict[str, int]]]:
    """Per part, per node type: inner nodes and halo rows; per edge type: kept edges (the partition table's figures)."""
    out = []
    for plan in plans:
        row = {t: {"inner": tp.n_inner, "halo": tp.n_halo} for t, tp in plan.types.items()}
        row.update({"__".join(e): {"edges": int(ids.numel())} for e, ids in plan.edge_ids.items()})
        out.append(row)
    return out


#: Per node type, what the exchange plans from: two views of a partition share these (and every ``edge_index``).
NODE_STRUCTURE_KEYS = ("n_id", "n_inner", "num_nodes", "send_index", "send_counts", "recv_counts")


class HeteroHaloPartition(HeteroData):
    r"""One rank's share of a heterogeneous graph: a :class:`~torch_geometric.data.HeteroData` in local ids.

    Per node type ``t``, ``part[t]`` holds ``x`` (the inner rows; ``halo_x`` the halo rows,
    written at partition time so the first layer needs no exchange, with ``x_digest`` to notice
    a changed ``x``), ``n_id`` (global ids within the type: inner nodes, then halo),
    ``n_inner``, ``num_nodes`` (inner and halo: the local id space of the edges), the type's
    exchange plan (``send_index``, ``send_counts``, ``recv_counts``) and every other node
    attribute restricted to the inner nodes. Per edge type, ``edge_index`` holds every in-edge
    of the target type's inner nodes: sources among the source type's inner and halo nodes,
    targets among the target type's inner nodes; ``e_id`` their positions in the graph's edge
    list of that type. So ``part.x_dict``, ``part.edge_index_dict`` and ``part[t].n_id`` read as
    in a :class:`~torch_geometric.data.HeteroData`, and a layer fed each type's inner rows with
    their halo rows appended computes every inner node exactly as on the whole graph.

    Graph-level: ``part_id``, ``num_parts``, ``labelled_type`` (the type training reads ``y`` and
    the masks of) and ``num_train_global`` (its train nodes over all parts).
    """

    def apply(self, func: Any, *args: str) -> HeteroHaloPartition:
        """As :meth:`HeteroData.apply`, but each type's ``x`` and ``halo_x`` stay views of one tensor (e.g. through
        ``.to("cuda")``): :func:`local_features` then reads them without a copy, and knows them as partitioned."""
        stacked: dict[str, tuple[Tensor, Tensor, Tensor]] = {}
        if not args or ("x" in args and "halo_x" in args):
            for t in self.node_types:
                store = self[t]
                x, halo = store.get("x"), store.get("halo_x")
                whole = stacked_view(x, halo) if isinstance(x, Tensor) and isinstance(halo, Tensor) else None
                if whole is not None:
                    stacked[t] = (whole, x, halo)
                    del store["x"], store["halo_x"]
        super().apply(func, *args)
        for t, (whole, x, halo) in stacked.items():
            moved = func(whole)
            if moved is whole:  # unchanged (e.g. .to() on the same device): the very objects, caches key on them
                self[t].x, self[t].halo_x = x, halo
            else:
                self[t].x, self[t].halo_x = moved[: x.size(0)], moved[x.size(0) :]
        return self

    @property
    def labelled_store(self) -> Any:
        """The node store of :attr:`labelled_type` (``y`` and the masks)."""
        return self[self.labelled_type]

    def train_count(self) -> int:
        """Train nodes of the labelled type this part owns."""
        store = self.labelled_store
        return int(store.train_mask.sum()) if "train_mask" in store else 0

    def edge_type_of(self, edge_index: Any) -> EdgeType | None:
        """The edge type whose ``edge_index`` is this very object (``None``: none is)."""
        for e in self.edge_types:
            if self[e].get("edge_index") is edge_index:
                return e  # type: ignore[return-value]
        return None

    def node_type_of(self, x: Any) -> str | None:
        """The node type whose ``x`` is this very object (``None``: none is)."""
        for t in self.node_types:
            if self[t].get("x") is x:
                return t
        return None

    def with_attrs(self, store: str | EdgeType | None = None, **attrs: Any) -> HeteroHaloPartition:
        """A new batch object of this partition with ``attrs`` set on one store: every tensor shared, none copied.

        As :meth:`HaloPartition.with_attrs <lightning_halo.HaloPartition.with_attrs>`: what a data
        module hands each stage (its pairs, ``batch[edge_type].edge_label_index`` as PyG's
        ``RandomLinkSplit`` places them), viewed by the exchange as the same partition while the
        structure (:data:`NODE_STRUCTURE_KEYS`, every ``edge_index``) is untouched.

        Args:
            store (str or tuple, optional): the node type or edge type to set ``attrs`` on;
                ``None``: the graph-level store. (default: ``None``)
            **attrs: the attributes.

        Example:
            >>> view = part.with_attrs(("author", "writes", "paper"), edge_label=labels)  # doctest: +SKIP
            >>> view.shares_structure(part)  # doctest: +SKIP
            True
        """
        out = copy.copy(self)  # PyG's shallow copy: new stores holding the same tensors
        target = out if store is None else out[store]
        for key, value in attrs.items():
            target[key] = value
        return out

    def shares_structure(self, other: Any) -> bool:
        """Whether ``other`` is a view of this very partition (:meth:`with_attrs`): the same node and edge types, each
        node type's plan (:data:`NODE_STRUCTURE_KEYS`) and each edge type's ``edge_index`` the same objects."""
        if not isinstance(other, HeteroHaloPartition) or other.node_types != self.node_types:
            return False
        if other.edge_types != self.edge_types:
            return False
        pairs = [(self[t].get(k), other[t].get(k)) for t in self.node_types for k in NODE_STRUCTURE_KEYS]
        pairs += [(self[e].get("edge_index"), other[e].get("edge_index")) for e in self.edge_types]
        for mine, theirs in pairs:
            numbers = not isinstance(mine, Tensor) and not isinstance(theirs, Tensor)
            if not (mine is theirs or (numbers and mine == theirs)):
                return False
        return True

    def to_state(self) -> dict[str, Any]:
        """Plain dicts of tensors and scalars (what a part file holds; ``torch.load(weights_only=True)`` reads it).

        ``x`` and ``halo_x`` stay one tensor (``[x; halo_x]``) so the file holds the rows once.
        """
        nodes: dict[str, dict[str, Any]] = {}
        for t in self.node_types:
            store = dict(self[t].items())
            x, halo = store.pop("x", None), store.pop("halo_x", None)
            if isinstance(x, Tensor) and isinstance(halo, Tensor):
                whole = stacked_view(x, halo)  # one tensor already (as partitioned): no copy
                store["x_rows"] = whole if whole is not None else torch.cat([x, halo])
            nodes[t] = store
        edges = {tuple(e): dict(self[e].items()) for e in self.edge_types}
        return {"graph": dict(self.stores[0].items()), "nodes": nodes, "edges": edges}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> HeteroHaloPartition:
        """The part :meth:`to_state` wrote."""
        part = cls()
        for t, store in state["nodes"].items():
            out = part[t]
            for key, value in store.items():
                if key == "x_rows":
                    n = int(store["n_inner"])
                    out.x, out.halo_x = value[:n], value[n:]
                else:
                    out[key] = value
        for e, store in state["edges"].items():
            out = part[tuple(e)]
            for key, value in store.items():
                out[key] = value
        for key, value in state["graph"].items():
            part[key] = value
        return part


def local_features(store: Any) -> Tensor:
    """A node type's features for every row the batch holds: ``x``, with ``halo_x`` after it on a partition.

    On a :class:`HeteroHaloPartition` that is the inner rows and the halo rows (one tensor as
    partitioned, so no copy): a per-node transform of them (a type's input projection) then
    needs no exchange, and the layer that reads it gets every local row. On a whole
    ``HeteroData`` it is ``x``.

    Only while ``x`` is the type's features as partitioned: after ``batch[t].x`` was replaced or changed in place,
    ``halo_x`` holds the old halo rows, and this returns ``x`` alone (the layers then fetch the halo of the new rows).

    Example:
        >>> from torch_geometric.data import HeteroData
        >>> g = HeteroData()
        >>> g["paper"].x = torch.ones(3, 2)
        >>> local_features(g["paper"]).shape
        torch.Size([3, 2])
    """
    x, halo = store.x, store.get("halo_x")
    if not isinstance(halo, Tensor):
        return x
    whole = stacked_view(x, halo)
    if whole is None or not _as_partitioned(x, store.get("x_digest")):
        # x was replaced (batch[t].x = ...) or changed in place since partitioning: halo_x holds the old rows. The
        # inner rows alone are exact: the layer that reads them fetches their halo
        return x
    return whole


#: Whether a type's ``x`` (this object, unchanged since) hashes to its ``x_digest``: hashed once per tensor and change.
_PARTITIONED_X = TensorMemo(limit=64)


def _as_partitioned(x: Tensor, digest: Optional[str]) -> bool:
    if digest is None:  # written before partitions recorded it: trust the stacked views
        return True
    known = _PARTITIONED_X.get("x", (x,))
    return bool(known) if known is not None else _PARTITIONED_X.put("x", (x,), tensor_digest(x) == digest)


def build_hetero_partitions(data: Any, assignment: HeteroAssignment) -> list[HeteroHaloPartition]:
    r"""One :class:`HeteroHaloPartition` per part: what a rank's batch holds.

    For every node type: ``x`` (the inner rows) and ``halo_x`` (the halo rows; both views of one
    tensor, so ``[x; halo_x]`` costs no copy), ``n_id`` (global ids within the type: inner, then
    halo, so ``emb[t](batch[t].n_id)`` looks up exactly the rows of the local nodes), ``n_inner``,
    ``num_nodes`` (inner and halo: the local id space of the edges), ``num_nodes_global`` (the
    type's nodes in the whole graph), ``send_index``, ``send_counts``
    and ``recv_counts`` (the type's exchange plan), and every other node attribute (``y``, masks)
    restricted to the inner nodes. For every edge type: ``edge_index`` in local ids and every
    edge attribute restricted to the kept edges, in their original order, with ``e_id`` their
    positions in the graph's edge list of that type. Graph-level attributes are copied.

    Example:
        >>> from torch_geometric.data import HeteroData
        >>> g = HeteroData()
        >>> g["paper"].x, g["paper"].y = torch.arange(8.0).view(4, 2), torch.tensor([0, 1, 0, 1])
        >>> g["paper", "cites", "paper"].edge_index = torch.tensor([[0, 2, 3], [2, 3, 1]])
        >>> a = assign_hetero_parts(g, 2, partitioner="random")
        >>> parts = build_hetero_partitions(g, a)
        >>> sorted(torch.cat([p["paper"].n_id[: p["paper"].n_inner] for p in parts]).tolist())
        [0, 1, 2, 3]
    """
    layout = assignment.layout
    labelled = assignment.balanced_type if assignment.balanced_type in layout.labelled else layout.labelled[0]
    train = data[labelled].get("train_mask")
    num_train_global = int(train.sum()) if isinstance(train, Tensor) else 0
    result = []
    for plan in plan_hetero_parts(data, assignment):
        part = HeteroHaloPartition()
        for t in layout.node_types:
            tp, store = plan.types[t], data[t]
            inner = tp.n_id[: tp.n_inner]
            out = part[t]
            for key, value in store.items():
                if key == "num_nodes":
                    continue
                if key == "x" and isinstance(value, Tensor):
                    rows = value[tp.n_id]  # inner rows, then halo rows: one tensor
                    out.x, out.halo_x = rows[: tp.n_inner], rows[tp.n_inner :]
                    out.x_digest = tensor_digest(out.x)
                elif isinstance(value, Tensor) and value.dim() > 0 and value.size(0) == layout.num_nodes[t]:
                    out[key] = value[inner]
                else:
                    out[key] = value
            out.n_id = tp.n_id
            out.n_inner = tp.n_inner
            out.num_nodes = tp.n_inner + tp.n_halo
            out.num_nodes_global = layout.num_nodes[t]
            out.send_index = tp.send_index
            out.send_counts = torch.tensor(tp.send_counts, dtype=torch.long)
            out.recv_counts = torch.tensor(tp.recv_counts, dtype=torch.long)
        for e in layout.edge_types:
            store, keep = data[e], plan.edge_ids[e]
            num_edges = int(store.edge_index.size(1))
            out = part[e]
            for key, value in store.items():
                if key == "edge_index":
                    out.edge_index = plan.edge_index[e]
                elif isinstance(value, Tensor) and value.dim() > 0 and value.size(0) == num_edges:
                    out[key] = value[keep]
                else:
                    out[key] = value
            out.e_id = keep
        for key, value in data.stores[0].items():  # the graph-level store comes first (PyG's HeteroData.stores)
            part[key] = value
        part.part_id = plan.part
        part.num_parts = plan.num_parts
        part.labelled_type = labelled
        part.num_train_global = num_train_global
        result.append(part)
    return result
