"""Halo planning: cut a graph along a node assignment into :class:`HaloPartition` objects.

:class:`HaloPlan` is the structure-only part (who owns which node, every part's halo, who sends
which rows, local edge ids); it reads the edges a window at a time, so the same plan serves the
in-memory :func:`build_halo_partitions` and the streaming writer of partition directories
(:mod:`lightning_halo.data.partition_dir`), which therefore produce identical partitions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

import torch
from torch import Tensor
from torch_geometric.data import Data

from lightning_halo.partition.chunks import iter_edges
from lightning_halo.partition.cover import halo_cover
from lightning_halo.partition.csr import partition_csr
from lightning_halo.partition.halo_partition import HaloPartition, tensor_digest
from lightning_halo.partition.options import MASK_KEYS


class HaloPlan:
    r"""Who owns which node, each part's halo and the exchange plan of a node assignment.

    Built by :func:`plan_halos`. Local ids of part :math:`p` list its inner nodes
    :math:`V_p` in increasing global id, then its halo :math:`H_p` grouped by owner and
    sorted by global id within each owner; the rows that :math:`p` sends to :math:`q` are
    :math:`H_q \cap V_p` in :math:`q`'s halo order. Memory: :math:`O(N + \sum_p |H_p|)`
    ``int64`` values, no edge list.

    Args:
        parts (Tensor): ``[N]`` part of every node.
        num_parts (int): :math:`P`.
        halos (list[Tensor]): :math:`H_p` of every part, in halo order.
        edge_counts (list[int]): in-edges of every part's inner nodes.

    Example:
        >>> plan = plan_halos(torch.tensor([[0, 1, 2], [1, 2, 3]]), torch.tensor([0, 0, 1, 1]), 2)
        >>> plan.halos[1].tolist(), plan.send_index(0).tolist()
        ([1], [1])
    """

    def __init__(self, parts: Tensor, num_parts: int, halos: list[Tensor], edge_counts: list[int]) -> None:
        self.parts = parts
        self.num_parts = num_parts
        self.num_nodes = int(parts.numel())
        self.halos = halos
        self.edge_counts = edge_counts
        n = self.num_nodes
        self.order = torch.argsort(parts, stable=True)  # inner nodes of part p: a slice, sorted by id
        self.part_sizes = torch.bincount(parts, minlength=num_parts)
        self.part_start = torch.cumsum(self.part_sizes, 0) - self.part_sizes
        self.local_inner = torch.empty(n, dtype=torch.long)
        self.local_inner[self.order] = torch.arange(n) - self.part_start[parts[self.order]]
        self.recv = torch.stack([torch.bincount(parts[h], minlength=num_parts) for h in halos])  # [receiver, owner]
        self._halo_keys: dict[int, Tensor] = {}

    def n_inner(self, p: int) -> int:
        return int(self.part_sizes[p])

    def n_halo(self, p: int) -> int:
        return int(self.halos[p].numel())

    def inner(self, p: int) -> Tensor:
        """Global ids of part ``p``'s inner nodes, increasing."""
        start = int(self.part_start[p])
        return self.order[start : start + self.n_inner(p)]

    def halo_groups(self, p: int) -> list[Tensor]:
        """Part ``p``'s halo split by owner (group ``q`` holds the rows ``q`` sends to ``p``)."""
        return list(torch.split(self.halos[p], self.recv[p].tolist()))

    def send_index(self, p: int) -> Tensor:
        """Local inner ids of the rows ``p`` sends, peer after peer in rank order."""
        if self.num_parts == 1:
            return torch.empty(0, dtype=torch.long)
        return torch.cat([self.local_inner[self.halo_groups(q)[p]] for q in range(self.num_parts)])

    def split_edges(self, src: Tensor, dst: Tensor) -> Iterator[tuple[int, Tensor, Tensor, Tensor]]:
        """For a window of edges: ``(p, positions, local_src, local_dst)`` of every part's in-edges.

        ``positions`` index the window in increasing order, so concatenating the windows keeps
        the original edge order. Owned sources get their inner id, remote ones
        ``n_inner + `` their halo position.
        """
        target_part = self.parts[dst]
        order = torch.argsort(target_part, stable=True)
        counts = torch.bincount(target_part, minlength=self.num_parts).tolist()
        for p, idx in enumerate(torch.split(order, counts)):
            if not idx.numel():
                continue
            s, t = src[idx], dst[idx]
            local_src = torch.empty_like(s)
            own = self.parts[s] == p
            local_src[own] = self.local_inner[s[own]]
            remote = s[~own]
            if remote.numel():
                key = self.parts[remote] * self.num_nodes + remote
                local_src[~own] = self.n_inner(p) + torch.searchsorted(self._halo_key(p), key)
            yield p, idx, local_src, self.local_inner[t]

    def _halo_key(self, p: int) -> Tensor:
        if p not in self._halo_keys:  # (owner, global id): sorted because the halo is
            h = self.halos[p]
            self._halo_keys[p] = self.parts[h] * self.num_nodes + h
        return self._halo_keys[p]

    def partition(self, p: int, attrs: dict[str, Any], num_train_global: int) -> HaloPartition:
        """Part ``p`` as a :class:`HaloPartition`: the graph's attributes ``attrs`` plus the plan."""
        return HaloPartition(
            **attrs,
            num_nodes=self.n_inner(p),
            global_id=torch.cat([self.inner(p), self.halos[p]]),
            send_index=self.send_index(p),
            send_counts=self.recv[:, p].clone(),  # what each receiver q gets from owner p
            recv_counts=self.recv[p].clone(),
            part_id=p,
            num_parts=self.num_parts,
            n_inner=self.n_inner(p),
            n_halo=self.n_halo(p),
            num_nodes_global=self.num_nodes,
            num_train_global=num_train_global,
        )


def plan_halos(edge_index: Tensor, parts: Tensor, num_parts: Optional[int] = None, chunk_edges: Optional[int] = None) -> HaloPlan:
    r"""The :class:`HaloPlan` of a node assignment, reading the edges in windows.

    :math:`H_p = \{u \notin V_p : (u, v) \in E, v \in V_p\}`: the sources of in-edges of owned
    nodes (edges are ``source -> target``, PyG's default flow), so directed graphs are followed
    correctly and only rows a layer reads are sent. Needs :math:`P^2 N < 2^{63}`.

    Args:
        edge_index (Tensor): ``[2, E]`` edges (may be memory-mapped).
        parts (Tensor): ``[N]`` part of every node, values in ``[0, P)``.
        num_parts (int, optional): :math:`P`; inferred as ``parts.max() + 1`` if omitted.
        chunk_edges (int, optional): edges per window. (default: 1M)

    Example:
        >>> plan_halos(torch.tensor([[0, 2], [2, 0]]), torch.tensor([0, 0, 1])).halos[1].tolist()
        [0]
    """
    parts = parts.to(torch.long).cpu()
    n = int(parts.numel())
    num_parts = int(parts.max()) + 1 if num_parts is None else int(num_parts)
    edge_counts = torch.zeros(num_parts, dtype=torch.long)
    found: list[Tensor] = []  # unique (part, owner, source) keys of cut in-edges, per window
    pending = 0
    for _, src, dst in iter_edges(edge_index, chunk_edges):
        tp, sp = parts[dst], parts[src]
        edge_counts += torch.bincount(tp, minlength=num_parts)
        cut = tp != sp
        if bool(cut.any()):
            found.append(torch.unique((tp[cut] * num_parts + sp[cut]) * n + src[cut]))
            pending += found[-1].numel()
            if len(found) > 1 and pending > 2 * found[0].numel() + (1 << 22):  # keep the union compact
                found = [torch.unique(torch.cat(found))]
                pending = found[0].numel()
    keys = torch.unique(torch.cat(found)) if found else torch.empty(0, dtype=torch.long)
    halo_part = torch.div(keys, num_parts * n, rounding_mode="floor")
    halos = list(torch.split(keys % n, torch.bincount(halo_part, minlength=num_parts).tolist()))
    return HaloPlan(parts, num_parts, halos, edge_counts.tolist())


def attribute_layout(data: Data) -> list[tuple[str, str]]:
    """``(key, kind)`` of every attribute a partition of ``data`` carries, in storage order.

    Kinds: ``"node"`` (rows of the inner nodes), ``"halo_x"`` (``x`` rows of the halo, for a
    floating ``x``), ``"x_digest"``, ``"edge_index"`` (local ids), ``"edge"`` (rows of the
    kept edges, original order) and ``"other"`` (copied as is). Shared by the in-memory and
    the streaming builders so both store the same attributes in the same order.
    """
    node, edge, other = _classify_keys(data)
    layout = [(key, "node") for key in node]
    x = data.get("x")
    if isinstance(x, Tensor) and x.is_floating_point():
        # DistDGL-style: the halo's input features travel with the partition, so the first
        # layer needs no exchange; `x_digest` lets the exchange notice a changed batch.x.
        layout += [("halo_x", "halo_x"), ("x_digest", "x_digest")]
    layout += [(key, "edge_index" if key == "edge_index" else "edge") for key in edge]
    return layout + [(key, "other") for key in other]


def build_halo_partitions(data: Data, parts: Tensor, num_parts: int | None = None) -> list[HaloPartition]:
    r"""Split ``data`` into one :class:`HaloPartition` per part, with halos and exchange plans.

    Part :math:`p` owns the nodes :math:`V_p = \{v : \text{parts}[v] = p\}`; its halo
    :math:`H_p` and exchange plan come from :func:`plan_halos`. Node-level attributes of
    ``data`` are restricted to the owned nodes, edge-level attributes to the kept edges (in
    their original order), other attributes are copied. ``x`` and ``halo_x`` are views of one
    tensor (inner rows, then halo rows), and each part carries its CSR adjacency and its
    transpose (:mod:`lightning_halo.partition.csr`).

    Args:
        data (Data): the whole graph.
        parts (Tensor): ``[N]`` part of every node, values in ``[0, P)``.
        num_parts (int, optional): :math:`P`; inferred as ``parts.max() + 1`` if omitted.

    Returns:
        A list of :math:`P` partitions, index :math:`p` for rank :math:`p`.

    Example:
        >>> data = Data(x=torch.randn(4, 2), edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]))
        >>> p0, p1 = build_halo_partitions(data, torch.tensor([0, 0, 1, 1]))
        >>> p1.n_halo, p0.send_index.tolist()
        (1, [1])
    """
    num_nodes = int(data.num_nodes)
    parts = parts.to(torch.long).cpu()
    if parts.numel() != num_nodes:
        raise ValueError(f"parts has {parts.numel()} entries but the graph has {num_nodes} nodes")
    plan = plan_halos(data.edge_index, parts, num_parts)
    pieces: list[list[tuple[Tensor, Tensor, Tensor]]] = [[] for _ in range(plan.num_parts)]
    for start, src, dst in iter_edges(data.edge_index):
        for p, idx, local_src, local_dst in plan.split_edges(src, dst):
            pieces[p].append((idx + start, local_src, local_dst))
    layout = attribute_layout(data)
    num_train_global = int(data.train_mask.sum()) if "train_mask" in data else 0
    with_halo = any(kind == "halo_x" for _, kind in layout)
    result: list[HaloPartition] = []
    for p in range(plan.num_parts):
        if pieces[p]:
            e, local_src, local_dst = (torch.cat(c) for c in zip(*pieces[p]))
        else:
            e = local_src = local_dst = torch.empty(0, dtype=torch.long)
        inner = plan.inner(p)
        attrs: dict[str, Any] = {}
        # x and halo_x are two views of one [n_in + n_halo, F] tensor: the first layer reads both without a copy
        rows = data.x[torch.cat([inner, plan.halos[p]])] if with_halo else None
        for key, kind in layout:
            if kind == "node" and key == "x" and rows is not None:
                attrs[key] = rows[: inner.numel()]
            elif kind == "node":
                attrs[key] = data[key][inner]
            elif kind == "halo_x":
                attrs[key] = rows[inner.numel() :]  # type: ignore[index]
            elif kind == "x_digest":
                attrs[key] = tensor_digest(attrs["x"])
            elif kind == "edge_index":
                attrs[key] = torch.stack([local_src, local_dst])
            elif kind == "edge":
                attrs[key] = data[key][e]
            else:
                attrs[key] = data[key]
        part = plan.partition(p, attrs, num_train_global)
        for key, value in partition_csr(part.edge_index, plan.n_inner(p), plan.n_inner(p) + plan.n_halo(p)).items():
            part[key] = value  # after the plan: where a partition directory's adjacency file puts them too
        result.append(part)
    return result


def _classify_keys(data: Data) -> tuple[list[str], list[str], list[str]]:
    """Split attribute names into node-level, edge-level and other (graph-level) keys."""
    node, edge, other = [], [], []
    for key, value in data.items():
        if key == "num_nodes":
            continue
        if key == "edge_index":
            edge.append(key)
        elif isinstance(value, Tensor) and (key in ("x", "y", *MASK_KEYS) or data.is_node_attr(key)):
            node.append(key)
        elif isinstance(value, Tensor) and data.is_edge_attr(key):
            edge.append(key)
        else:
            other.append(key)
    return node, edge, other


def summarize(
    nodes: list[int], edges: list[int], halo_nodes: list[int], send_rows: list[int], edge_cut: int,
    cover_rows: Optional[list[int]] = None,
) -> dict[str, Any]:  # fmt: skip
    r"""The statistics dict of :func:`partition_stats` from per-part counts (see there)."""
    total = sum(nodes)
    cover = {} if cover_rows is None else {"cover_rows": cover_rows, "halo_rows_cover": sum(cover_rows)}
    return {
        "num_parts": len(nodes),
        "nodes": nodes,
        "edges": edges,
        "halo_nodes": halo_nodes,
        "send_rows": send_rows,
        "edge_cut": edge_cut,
        "halo_rows": sum(halo_nodes),
        "balance": max(nodes) / (total / len(nodes)) if total else 1.0,
        "replication": 1.0 + sum(halo_nodes) / total if total else 1.0,
        **cover,
    }


def partition_stats(partitions: list[HaloPartition]) -> dict[str, Any]:
    r"""Size and communication figures of a partitioning.

    Returns a dict with per-part lists ``nodes`` (inner), ``edges`` (local in-edges),
    ``halo_nodes``, ``send_rows`` and ``cover_rows`` (rows a part receives per exchange with
    halo partial sums, :func:`~lightning_halo.partition.cover.halo_cover`), and the totals
    ``edge_cut`` (edges whose endpoints lie in different parts), ``halo_rows`` (rows one
    exchange moves: :math:`\sum_p |H_p|`), ``halo_rows_cover`` (the same with partial sums),
    ``balance`` (largest part / mean part, 1.0 is perfect) and ``replication``
    (:math:`1 + \sum_p |H_p| / N`).

    Args:
        partitions (list[HaloPartition]): all parts, index ``p`` for part ``p``.

    Example:
        >>> partition_stats(parts)["edge_cut"]  # doctest: +SKIP
        1094
    """
    return summarize(
        nodes=[int(p.n_inner) for p in partitions],
        edges=[int(p.edge_index.size(1)) for p in partitions],
        halo_nodes=[int(p.n_halo) for p in partitions],
        send_rows=[int(p.send_counts.sum()) for p in partitions],
        edge_cut=sum(int((p.edge_index[0] >= int(p.n_inner)).sum()) for p in partitions),
        cover_rows=[part_cover_rows(p) for p in partitions],
    )


def part_cover_rows(part: HaloPartition) -> int:
    """Rows ``part`` receives per exchange with halo partial sums (its :func:`~lightning_halo.partition.cover.halo_cover`)."""
    return halo_cover(part.edge_index, int(part.n_inner), int(part.n_halo), part.recv_counts.tolist()).rows


def partitioner_label(manifest: dict[str, Any]) -> str:
    """What partitioned a directory, for its table: ``"kaminpar"``, or ``"kaminpar (auto)"`` when chosen by ``"auto"``.

    Example:
        >>> partitioner_label({"partitioner": "auto", "partitioned_with": {"partitioner": "metis"}})
        'metis (auto)'
    """
    asked = manifest["partitioner"]
    ran = manifest.get("partitioned_with", {}).get("partitioner", asked)
    return f"{ran} ({asked})" if ran != asked else ran


def format_stats(stats: dict[str, Any], title: str) -> list[str]:
    """The statistics of :func:`partition_stats` as text lines: a title, the totals, one line per part.

    Shared by the DataModule's log and ``lightning-halo partition``.

    Example:
        >>> print("\\n".join(format_stats(summarize([2, 2], [3, 1], [1, 0], [0, 1], 1, [1, 0]), "metis, 2 parts")))
        metis, 2 parts: edge cut 1, halo rows 1 (1 with partial sums), balance 1.000, replication 1.250
          part        nodes     in-edges       halo      sends      cover
             0            2            3          1          0          1
             1            2            1          0          1          0
    """
    cover = stats.get("cover_rows")  # absent in directories written before partial sums
    with_cover = f" ({stats['halo_rows_cover']} with partial sums)" if cover is not None else ""
    lines = [
        f"{title}: edge cut {stats['edge_cut']}, halo rows {stats['halo_rows']}{with_cover}, balance {stats['balance']:.3f}, "
        f"replication {stats['replication']:.3f}",
        f"  {'part':>4} {'nodes':>12} {'in-edges':>12} {'halo':>10} {'sends':>10}" + (f" {'cover':>10}" if cover else ""),
    ]
    for p in range(stats["num_parts"]):
        lines.append(
            f"  {p:>4} {stats['nodes'][p]:>12} {stats['edges'][p]:>12} {stats['halo_nodes'][p]:>10} {stats['send_rows'][p]:>10}"
            + (f" {cover[p]:>10}" if cover else "")
        )
    return lines
