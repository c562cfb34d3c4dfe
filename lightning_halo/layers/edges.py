r"""The edge sets a partition can answer exactly, and the guard that refuses every other one.

A partition holds every in-edge of its inner nodes (direction ``"in"``). It can also hold
every *out*-edge of its inner nodes, reversed (direction ``"out"``: what a layer sees when
called on ``edge_index.flip(0)``, e.g. inside ``DirGNNConv``, or with
``flow="target_to_source"``); that set, its halo (the out-neighbours owned elsewhere) and its
exchange plan are built on first use, with one exchange of edge lists between the ranks.
Both are stored *canonically*: ``edge_index[0]`` sources in :math:`[0, n_{src})`,
``edge_index[1]`` targets in :math:`[0, n_{in})`.

:meth:`PartitionEdges.resolve` decides what a layer was given. The partition's own
``edge_index`` is recognised by identity; any other tensor by content, and then every rank
takes part in one tiny all-reduce so that all ranks decide alike (a rank that refused while
its peers computed would leave them waiting).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_halo._compat.torch import tensor_version
from lightning_halo.exchange import Collectives, Direction, ExchangePlan, HaloExchanger
from lightning_halo.layers.dropedge import kept_subset, register_partition_edges
from lightning_halo.layers.registry import COMPILE_REFUSAL, UnsupportedLayerError
from lightning_halo.layers.stored import StoredCSR
from lightning_halo.memo import TensorMemo
from lightning_halo.partition.halo_partition import PLAN_KEYS, HaloPartition


class UnsupportedEdgesError(ValueError):
    """A layer was called with an edge set the partition cannot answer exactly; the message says why."""


@dataclass
class EdgeSet:
    r"""One direction of a partition's edges, canonical (targets are inner nodes).

    Args:
        direction: ``"in"`` or ``"out"`` (also the direction of its exchange plan).
        edge_index: ``[2, E]`` local ids: sources in :math:`[0, n_{src})`, targets in :math:`[0, n_{in})`.
        n_inner: inner nodes.
        n_src: inner + halo nodes of this direction.
        attrs: the partition's edge-level tensors, aligned with ``edge_index``.
        memo: what the layer calls computed from these edges (normalised weights, fused adjacencies).
        stored: the CSR and transpose the partition carries for these edges, if any (the in-edges
            of a partition built by lightning-halo).
        subset: the in-edges restricted to a mask (what :func:`~lightning_halo.dropout_edge` kept).
    """

    direction: Direction
    edge_index: Tensor
    n_inner: int
    n_src: int
    attrs: dict[str, Tensor] = field(default_factory=dict)
    memo: TensorMemo = field(default_factory=TensorMemo)
    stored: Optional[StoredCSR] = None
    subset: bool = False

    def restricted(self, mask: Tensor) -> EdgeSet:
        """These edges where ``mask`` is True, with their attributes (no stored CSR: it describes all edges)."""
        attrs = {k: v[mask] for k, v in self.attrs.items()}
        return EdgeSet(self.direction, self.edge_index[:, mask], self.n_inner, self.n_src, attrs, subset=True)


@dataclass(frozen=True)
class Resolution:
    """What a layer was given: a direction of the partition's edges, as a list or as a sparse matrix.

    ``sparse_values`` holds the values of a user's ``torch.sparse`` adjacency in the order of
    ``edges.edge_index`` (the partition's CSR order), ``None`` for an ``edge_index``.
    ``known`` is False when the edges are not the partition's (world size 1 only: then the
    partition is the whole graph and any edge set is exact).
    """

    edges: Optional[EdgeSet]
    sparse_values: Optional[Tensor] = None
    known: bool = True

    @property
    def sparse(self) -> bool:
        return self.sparse_values is not None


def _describe(arg: Any) -> str:
    if isinstance(arg, Tensor):
        kind = "sparse " if arg.layout != torch.strided else ""
        return f"a {kind}tensor of shape {tuple(arg.shape)} ({arg.dtype})"
    return f"a {type(arg).__name__}"


class PartitionEdges:
    r"""The edge sets of one bound partition, and the guard for every layer call.

    Args:
        part (HaloPartition): the partition.
        exchanger (HaloExchanger): its exchange (its plans; the out-edges' plan is added to it).
        collectives (Collectives): for the agreement and the out-edges' edge lists.
    """

    def __init__(self, part: HaloPartition, exchanger: HaloExchanger, collectives: Collectives) -> None:
        self.part, self.exchanger, self.collectives = part, exchanger, collectives
        n_inner = int(part.n_inner)
        attrs = {
            k: v
            for k, v in part.items()
            if isinstance(v, Tensor) and k != "edge_index" and k not in PLAN_KEYS and part.is_edge_attr(k)
            and v.size(0) == part.edge_index.size(1)
        }
        self.sets: dict[Direction, EdgeSet] = {
            "in": EdgeSet("in", part.edge_index, n_inner, n_inner + int(part.n_halo), attrs, stored=StoredCSR.of(part))
        }
        self._version = tensor_version(part.edge_index)
        register_partition_edges(part.edge_index, part.global_id)  # lightning_halo.dropout_edge hashes global ids
        self._flipped: Optional[Tensor] = None
        self._pattern: Optional[tuple[Tensor, Tensor]] = None
        self._seen = TensorMemo(limit=64)

    # ------------------------------------------------------------------ resolution
    def resolve(self, arg: Any, layer: str) -> Resolution:
        """The edge set ``arg`` denotes, or :class:`UnsupportedEdgesError` (raised on every rank alike)."""
        own = self.part.edge_index
        if arg is own:
            if tensor_version(own) != self._version:
                if torch.compiler.is_compiling():  # traced tensors have versions of their own: not the reason
                    raise UnsupportedLayerError(f"layer '{layer}' is being compiled (torch.compile): {COMPILE_REFUSAL}")
                raise UnsupportedEdgesError(
                    f"layer '{layer}': batch.edge_index was changed in place after partitioning, so the partition's "
                    "edges (and its exchange plan) no longer describe it. Change the graph before partitioning."
                )
            return Resolution(self.sets["in"])
        if isinstance(arg, Tensor):
            hit = self._seen.get("resolved", (arg,))
            if hit is not None:
                return hit
        is_in, is_out, values = self._match(arg)
        kept = kept_subset(arg) if isinstance(arg, Tensor) else None
        is_kept = kept is not None and kept[0] is own and tensor_version(own) == self._version
        if self.collectives.world_size > 1:
            is_in, is_out, is_kept = self.collectives.all_agree([is_in, is_out, is_kept], layer, own.device)
        if is_kept:
            assert kept is not None
            res = Resolution(self.sets["in"].restricted(kept[1]))
        elif is_in or is_out:
            edges = self.sets["in"] if is_in else self.out_edges(layer)
            res = Resolution(edges, values)
        elif self.collectives.world_size == 1:
            res = Resolution(None, known=False)
        else:
            raise UnsupportedEdgesError(
                f"layer '{layer}' was called with an edge set that is not this partition's ({_describe(arg)}). "
                "A layer may only run on batch.edge_index, its reverse batch.edge_index.flip(0), "
                "lightning_halo.sparse_adjacency(batch), or the edges lightning_halo.dropout_edge(batch.edge_index, "
                "...) kept: a partition holds only the in-edges of its own nodes, so edges dropped (for DropEdge use "
                "lightning_halo.dropout_edge instead of torch_geometric.utils.dropout_edge), added (e.g. self-loops) "
                "or selected (a subgraph) on it would give a different result than on the whole graph. Transform the "
                "graph before partitioning (HaloDataModule(data=...)), or use the layer's own options (e.g. "
                "add_self_loops=True)."
            )
        if isinstance(arg, Tensor):
            self._seen.put("resolved", (arg,), res)
        return res

    def _match(self, arg: Any) -> tuple[bool, bool, Optional[Tensor]]:
        """``(is the in-set, is the reversed set, sparse values)`` by content, on this rank."""
        if not isinstance(arg, Tensor):
            return False, False, None
        ein = self.sets["in"]
        if arg.layout == torch.strided:
            arg = arg.as_subclass(Tensor)
            if arg.dim() != 2 or arg.size(0) != 2 or arg.dtype.is_floating_point or arg.size(1) != ein.edge_index.size(1):
                return False, False, None
            arg = arg.to(ein.edge_index.device)
            is_in = bool(torch.equal(arg, ein.edge_index))
            if self._flipped is None:
                self._flipped = ein.edge_index.flip(0)
            return is_in, bool(torch.equal(arg, self._flipped)), None
        if tuple(arg.shape) != (ein.n_inner, ein.n_src):
            return False, False, None
        a = arg.to_sparse_csr() if arg.layout != torch.sparse_csr else arg
        crow, col = self.pattern()
        same = a.crow_indices().numel() == crow.numel() and a.col_indices().numel() == col.numel()
        same = same and bool(torch.equal(a.crow_indices().long(), crow)) and bool(torch.equal(a.col_indices().long(), col))
        return same, False, a.values() if same else None

    def pattern(self) -> tuple[Tensor, Tensor]:
        """CSR pattern ``(crow, col)`` of the in-edges (targets x sources), each pair once."""
        if self._pattern is None:
            ein = self.sets["in"]
            dst, src = ein.edge_index[1], ein.edge_index[0]
            key = torch.unique(dst * ein.n_src + src)
            row = torch.div(key, ein.n_src, rounding_mode="floor")
            crow = torch.zeros(ein.n_inner + 1, dtype=torch.long, device=key.device)
            crow[1:] = torch.cumsum(torch.bincount(row, minlength=ein.n_inner), 0)
            self._pattern = (crow, key - row * ein.n_src)
        return self._pattern

    def sparse_edges(self) -> Tensor:
        """The in-set's CSR entries as a canonical ``[2, nnz]`` edge list (a user's sparse adjacency)."""
        crow, col = self.pattern()
        row = torch.repeat_interleave(torch.arange(crow.numel() - 1, device=crow.device), crow[1:] - crow[:-1])
        return torch.stack([col, row])

    # ------------------------------------------------------------------ out-edges
    def out_edges(self, layer: str) -> EdgeSet:
        """The reversed out-edges of the inner nodes (built once, collectively) and their plan ``"out"``."""
        if "out" not in self.sets:
            plan_in = self.exchanger.plan("in")
            edges, plan = build_out_edges(self.part, self.sets["in"].attrs, plan_in, self.collectives, layer)
            self.exchanger.add_plan("out", plan, edges.edge_index)
            self.sets["out"] = edges
        return self.sets["out"]


def build_out_edges(
    part: HaloPartition, attrs: dict[str, Tensor], plan_in: ExchangePlan, collectives: Collectives, layer: str
) -> tuple[EdgeSet, ExchangePlan]:
    r"""Every out-edge :math:`u \to v` of an inner node :math:`u`, reversed to :math:`v \to u`.

    The edge lives on the partition of :math:`v` (as its in-edge); if :math:`v` is inner here
    the reversed edge is local, otherwise the partition of :math:`v` sends it here (global ids
    and edge attributes). The new halo are the :math:`v` owned elsewhere, grouped by owner and
    sorted by global id; the plan follows, with no extra handshake (both sides sort alike).
    """
    world, rank, n_inner = plan_in.world_size, plan_in.rank, plan_in.n_inner
    src, dst = part.edge_index[0], part.edge_index[1]
    gid = part.global_id
    device = src.device
    owner = torch.full((gid.numel(),), rank, dtype=torch.long, device=device)
    owner[n_inner:] = part.halo_owner.to(device)
    local = src < n_inner
    # reversed local edges: target = old source (inner), source = old target (inner)
    loc_src, loc_dst = dst[local], src[local]
    remote = ~local
    r_owner = owner[src[remote]]
    order = torch.argsort(r_owner, stable=True)
    r_edges = torch.nonzero(remote).view(-1)[order]
    send_counts = torch.bincount(r_owner, minlength=world).tolist()
    pairs = torch.stack([gid[src[r_edges]], gid[dst[r_edges]]], dim=1)  # (their target, my source) in global ids
    got = collectives.all_to_all_rows(list(torch.split(pairs, send_counts)), layer)
    got_attrs = {k: collectives.all_to_all_rows(list(torch.split(v[r_edges], send_counts)), layer) for k, v in sorted(attrs.items())}
    inner_gid = gid[:n_inner]  # sorted by construction
    e_src, e_dst = [loc_src], [loc_dst]
    offset = n_inner
    recv_counts = []
    for q in range(world):
        g = got[q]
        tgt = torch.searchsorted(inner_gid, g[:, 0].contiguous())
        uniq, inv = torch.unique(g[:, 1], return_inverse=True)  # sorted global ids of q's nodes
        recv_counts.append(int(uniq.numel()))
        e_src.append(offset + inv)
        e_dst.append(tgt)
        offset += int(uniq.numel())
    # what I send to q: my inner nodes that are sources of the edges I sent q, sorted by global id
    send_parts = []
    for q, chunk in enumerate(torch.split(pairs, send_counts)):
        mine = torch.unique(chunk[:, 1]) if chunk.numel() else chunk[:, 1]
        send_parts.append(torch.searchsorted(inner_gid, mine.contiguous()))
    send_index = torch.cat(send_parts) if send_parts else torch.empty(0, dtype=torch.long, device=device)
    edge_index = torch.stack([torch.cat(e_src), torch.cat(e_dst)])
    out_attrs = {k: torch.cat([v[local], *got_attrs[k]]) for k, v in attrs.items()}
    n_halo = offset - n_inner
    plan = ExchangePlan(
        rank=rank,
        world_size=world,
        n_inner=n_inner,
        n_halo=n_halo,
        send_index=send_index,
        send_counts=tuple(int(s.numel()) for s in send_parts),
        recv_counts=tuple(recv_counts),
    )
    return EdgeSet("out", edge_index, n_inner, offset, out_attrs), plan
