r"""Rows of arbitrary nodes, inner or remote, differentiable: what a decoder needs to score pairs.

A link predictor scores pairs ``(u, v)`` whose endpoints may live on any rank, neighbours or
not, so the halo (the in-neighbours of inner nodes) does not cover them. :func:`gather_rows`
asks each row's owner for it once per call (the requested ids deduplicated), over the same
wire as the halo exchange (timeouts, byte counts, quantization), and sends the gradients of
those rows back to their owners in backward.

Three ``all_to_all`` per call forward (row counts, row positions, rows) and one backward (the
gradients), counted under the layer name :data:`LAYER` (``aux`` for the requests, ``fwd`` /
``bwd`` / ``eval`` for rows and gradients), so the traffic summary reports the pair exchange.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_halo.exchange.current import current_exchanger
from lightning_halo.exchange.exchanger import HaloExchanger
from lightning_halo.exchange.wire import Wire
from lightning_halo.partition.halo_partition import HaloPartition
from lightning_halo.partition.hetero import HeteroHaloPartition

#: The name under which the traffic of :func:`gather_rows` is counted.
LAYER = "gather_rows"


class RowDirectory:
    r"""Where every node's row lives: its owner rank and its position among the owner's inner rows.

    Built once per partition (:meth:`build`, one collective: the ranks swap their inner
    global ids), ``12 N`` bytes per rank (``int32`` owner, ``int64`` position).

    Args:
        owner (Tensor): owner rank of every node ``[N]``.
        position (Tensor): row of every node in its owner's inner rows ``[N]``.
        rank (int): this rank.
    """

    def __init__(self, owner: Tensor, position: Tensor, rank: int) -> None:
        self.owner, self.position, self.rank = owner, position, rank

    @property
    def num_nodes(self) -> int:
        return int(self.owner.numel())

    @classmethod
    def build(cls, inner: Tensor, num_nodes: int, wire: Wire) -> RowDirectory:
        """The directory of one partitioning of ``num_nodes`` nodes, ``inner`` this rank's global ids in row order
        (a collective: every rank calls it)."""
        n, world = int(num_nodes), wire.world_size
        mine = inner.reshape(-1, 1)
        ones = (1,) * world
        sizes = torch.full((world, 1), mine.size(0), dtype=torch.long, device=mine.device)
        got = wire.exchange(sizes, 32, ones, ones, LAYER, "aux").view(-1).tolist() if world > 1 else [mine.size(0)]
        ids = wire.exchange(mine.repeat(world, 1), 32, (mine.size(0),) * world, got, LAYER, "aux") if world > 1 else mine
        owner = torch.full((n,), -1, dtype=torch.int32, device=mine.device)
        position = torch.empty(n, dtype=torch.long, device=mine.device)
        for q, block in enumerate(torch.split(ids.view(-1), [int(c) for c in got])):
            owner[block] = q
            position[block] = torch.arange(block.numel(), device=mine.device)
        if bool((owner < 0).any()):
            raise RuntimeError(
                f"the partitions do not cover all {n} nodes (node {int((owner < 0).nonzero()[0])} has no owner); "
                "every rank must hold its own part of one partitioning."
            )
        return cls(owner, position, wire.rank)


@dataclass
class Request:
    """One call's plan: which unique rows are local, which come from which peer, which I serve."""

    local_idx: Tensor  # positions among the unique ids of the rows this rank holds
    local_pos: Tensor  # their rows in z
    remote_idx: Tensor  # positions among the unique ids of remote rows, grouped by owner
    want: tuple[int, ...]  # rows asked of each peer
    serve: tuple[int, ...]  # rows each peer asks of me
    served_pos: Tensor  # my rows the peers asked for, peer after peer
    num_rows: int  # unique ids


def plan_request(uniq: Tensor, directory: RowDirectory, wire: Wire) -> Request:
    """Tell each owner which of its rows this rank needs (two collectives; every rank calls it)."""
    owner, pos = directory.owner[uniq].long(), directory.position[uniq]
    local = owner == directory.rank
    local_idx = local.nonzero().view(-1)
    order = torch.argsort(owner, stable=True)
    remote_idx = order[~local[order]]
    world = wire.world_size
    want = torch.bincount(owner[remote_idx], minlength=world)
    if world == 1:
        return Request(local_idx, pos[local_idx], remote_idx, (0,), (0,), pos[:0], uniq.numel())
    ones = (1,) * world
    serve = wire.exchange(want.view(-1, 1), 32, ones, ones, LAYER, "aux").view(-1)
    want_t, serve_t = tuple(int(c) for c in want.tolist()), tuple(int(c) for c in serve.tolist())
    served = wire.exchange(pos[remote_idx].view(-1, 1), 32, want_t, serve_t, LAYER, "aux").view(-1)
    return Request(local_idx, pos[local_idx], remote_idx, want_t, serve_t, served, uniq.numel())


@dataclass(frozen=True)
class _How:
    bits: int
    grad_bits: int
    traffic: str
    generator: Optional[torch.Generator]


class _GatherRows(torch.autograd.Function):
    """Forward: the unique requested rows (local and remote). Backward: their gradients to the owners."""

    @staticmethod
    def forward(ctx: Any, z: Tensor, wire: Wire, req: Request, how: _How) -> Tensor:  # type: ignore[override]
        ctx.wire, ctx.req, ctx.how, ctx.n = wire, req, how, z.size(0)
        out = z.new_empty((req.num_rows, z.size(1)))
        out[req.local_idx] = z[req.local_pos]
        if wire.world_size > 1:
            got = wire.exchange(z[req.served_pos], how.bits, req.serve, req.want, LAYER, how.traffic, how.generator)  # type: ignore[arg-type]
            out[req.remote_idx] = got.to(z.dtype)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Optional[Tensor], None, None, None]:  # type: ignore[override]
        return _ScatterRows.apply(grad_out.contiguous(), ctx.wire, ctx.req, ctx.how, ctx.n), None, None, None


class _ScatterRows(torch.autograd.Function):
    """The gather's backward as a function of the rows' gradients (linear: the gather's transpose), so that it
    differentiates again (``create_graph=True``); its derivative is the gather itself, exact (32 bits)."""

    @staticmethod
    def forward(ctx: Any, grad_out: Tensor, wire: Wire, req: Request, how: _How, n: int) -> Tensor:  # type: ignore[override]
        ctx.wire, ctx.req, ctx.how = wire, req, how
        grad = grad_out.new_zeros((n, grad_out.size(1)))
        grad.index_add_(0, req.local_pos, grad_out[req.local_idx])
        if wire.world_size > 1:
            rows = grad_out[req.remote_idx].contiguous()
            back = wire.exchange(rows, how.grad_bits, req.want, req.serve, LAYER, "bwd", how.generator)
            grad.index_add_(0, req.served_pos, back.to(grad.dtype))
        return grad

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], None, None, None, None]:  # type: ignore[override]
        exact = _How(32, 32, ctx.how.traffic, None)
        return _GatherRows.apply(grad.contiguous(), ctx.wire, ctx.req, exact), None, None, None, None


def _directory_of(exchanger: HaloExchanger, rows: _Rows) -> RowDirectory:
    """The directory of the bound partition's rows (of one node type): the exchanger's, built at the first call
    after a bind (a collective, reached by every rank together) and dropped with the binding (each rank's own,
    never kept past it)."""
    key = LAYER if rows.node_type is None else f"{LAYER}[{rows.node_type}]"
    return exchanger.partition_value(key, lambda: RowDirectory.build(rows.inner, rows.num_nodes, exchanger.collectives.wire))


@dataclass(frozen=True)
class _Rows:
    """The rows ``z`` stands for: a node type's (``None``: the graph's) inner nodes on this rank."""

    node_type: Optional[str]
    inner: Tensor  # their global ids (within the type), in row order
    num_nodes: int  # nodes (of the type) in the whole graph


def _rows_of(part: HaloPartition | HeteroHaloPartition, node_type: Optional[str]) -> _Rows:
    if isinstance(part, HeteroHaloPartition):
        if node_type not in part.node_types:
            said = "no node_type" if node_type is None else f"node_type={node_type!r}"
            raise ValueError(
                f"gather_rows on a heterogeneous partition needs the node type of z's rows, got {said}; pass "
                f"node_type= one of {list(part.node_types)}, e.g. gather_rows(z_dict['author'], ids, node_type='author')."
            )
        store = part[node_type]
        return _Rows(node_type, store.n_id[: int(store.n_inner)], int(store.num_nodes_global))
    if node_type is not None:
        raise ValueError(f"gather_rows(node_type={node_type!r}) is for heterogeneous partitions; this graph has one node set")
    return _Rows(None, part.n_id, int(part.num_nodes_global))


def _check_ids(global_ids: Tensor, num_nodes: int) -> None:
    if not isinstance(global_ids, Tensor) or global_ids.dtype.is_floating_point or global_ids.dtype == torch.bool:
        what = global_ids.dtype if isinstance(global_ids, Tensor) else type(global_ids).__name__
        raise TypeError(f"gather_rows needs integer global node ids, got {what}; pass e.g. batch.edge_label_index")
    if global_ids.numel() and (int(global_ids.min()) < 0 or int(global_ids.max()) >= num_nodes):
        raise IndexError(
            f"gather_rows: node ids must be global ids in [0, {num_nodes}), got [{int(global_ids.min())}, "
            f"{int(global_ids.max())}]; pairs in local ids (positions in the partition) must be mapped with batch.n_id."
        )


def _how(exchanger: HaloExchanger) -> _How:
    if exchanger.training and torch.is_grad_enabled():
        # bits="adaptive" chooses widths for the layers' halos; the pairs travel at the widest choice
        return _How(exchanger.fixed_width("fwd"), exchanger.fixed_width("bwd"), "fwd", exchanger.state.train_generator)
    return _How(exchanger.eval_bits, exchanger.eval_bits, "eval", exchanger.state.eval_generator)


def gather_rows(
    z: Tensor, global_ids: Tensor, *, node_type: Optional[str] = None, exchanger: Optional[HaloExchanger] = None
) -> Tensor:
    r"""The rows of ``z`` of any nodes of the whole graph, by global id, differentiable.

    Under :class:`~lightning_halo.HaloQuantStrategy`, ``z`` holds this rank's inner rows (what
    the hooked layers return); rows of nodes owned by other ranks are fetched from their owners,
    each distinct node once per call, and their gradients go back to the owners in backward.
    Exact at ``bits=32``; in training the rows travel at the strategy's ``bits`` (gradients at
    ``grad_bits``), in evaluation at ``eval_bits``, quantized like halo rows. Outside the
    strategy (plain PyG on one process) it is ``z[global_ids]``.

    A collective: every rank calls it at the same point of its step, the same number of times
    (a rank with no pairs passes an empty tensor).

    Args:
        z (Tensor): node representations of this rank's inner nodes ``[n_inner, *]`` (on one
            process: ``[N, *]``).
        global_ids (Tensor): global node ids of any shape, e.g. ``batch.edge_label_index``; on a
            heterogeneous graph, ids within ``node_type`` (e.g. ``batch[edge_type].edge_label_index[0]``
            with the edge type's source type).
        node_type (str, optional): on a heterogeneous partition, the node type whose rows ``z``
            holds (required there: each type has its own ids and owners). (default: ``None``)
        exchanger (HaloExchanger, optional): the exchange to use (in-process test ranks);
            defaults to the running strategy's.

    Shapes:
        - **input:** ``z`` :math:`(n_{inner}, *)`, ``global_ids`` :math:`(*_{ids})`
        - **output:** :math:`(*_{ids}, *)`

    Example:
        >>> z = torch.randn(5, 3)
        >>> torch.equal(gather_rows(z, torch.tensor([[0, 4], [2, 2]])), z[torch.tensor([[0, 4], [2, 2]])])
        True
        >>> h = gather_rows(z, batch.edge_label_index)  # doctest: +SKIP
        >>> score = (h[0] * h[1]).sum(-1)  # doctest: +SKIP
    """
    ex = exchanger if exchanger is not None else current_exchanger()
    part = ex.part if ex is not None and ex.bound else None
    if part is None:
        _check_ids(global_ids, z.size(0))
        return z[global_ids]
    rows = _rows_of(part, node_type)
    _check_ids(global_ids, rows.num_nodes)
    if z.size(0) != rows.inner.numel():
        whose = "" if node_type is None else f" of node type {node_type!r}"
        raise ValueError(
            f"gather_rows expects this rank's inner rows{whose} ({rows.inner.numel()}, as the hooked layers return), "
            f"got {z.size(0)} rows; pass the encoder's output for the whole partition, not a slice or [x; halo_x]."
        )
    directory = _directory_of(ex, rows)
    uniq, inverse = torch.unique(global_ids.reshape(-1), return_inverse=True)
    req = plan_request(uniq.to(directory.owner.device), directory, ex.collectives.wire)
    got = _GatherRows.apply(z.reshape(z.size(0), -1), ex.collectives.wire, req, _how(ex))
    return got[inverse.to(got.device)].reshape(*global_ids.shape, *z.shape[1:])
