r"""Partial sums on the wire: the exchange layout of a :class:`~lightning_halo.partition.cover.HaloCover`.

With a cover, what a rank receives from owner :math:`a` per exchange is a *block*: the halo
rows of :math:`a` it still fetches (in halo order), then the partial sums :math:`a` computes
for it, :math:`p_v = \sum_{u \in V_a} m_{vu}\, x_u` (sorted by target :math:`v`). The sender's
buffer for receiver :math:`b` has the same layout, so the wire, the quantization and the
training slots see rows as before, only fewer.

:class:`CoverPlan` is the static part of one bound partition: the receiver's layout from its
own cover, the sender's from one exchange of structure with every peer (which of my rows each
peer still fetches, and which of my rows feed which of its partial sums).
:class:`CoverRoute` adds one call's coefficients :math:`m_{vu}` (the layer's own edge values,
sent once by the receiver to the owners): its send operator :math:`S` (``send = S x``, backward
``S^T g``) and the local operator :math:`R` that forms a block from halo rows a rank already
holds (the stored input features).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch
from torch import Tensor

from lightning_halo.exchange.plan import ExchangePlan
from lightning_halo.partition.cover import HaloCover, cut_edges, halo_owners

#: ``exchange(chunks)``: send ``chunks[q]`` to peer ``q``, return what each peer sent
#: (:meth:`~lightning_halo.exchange.Collectives.all_to_all_rows`).
RowsExchange = Callable[[list[Tensor]], list[Tensor]]


def _rank_within(group: Tensor, n_groups: int) -> tuple[Tensor, Tensor]:
    """For entries sorted by ``group``: their index within their group, and each group's size."""
    counts = torch.bincount(group, minlength=n_groups)
    start = torch.cumsum(counts, 0) - counts
    return torch.arange(group.numel()) - start[group], counts


@dataclass(frozen=True)
class CoverPlan:
    r"""The static layout of a rank's cover exchange (receiver and sender side).

    Receiver: ``kept_cols`` (halo rows still fetched) land at ``kept_pos`` of the block,
    partial sum ``i`` (for inner node ``partial_target[i]``) at ``partial_pos[i]``; the folded
    edges ``(folded_col, folded_partial)`` (halo row, partial sum) are listed owner after owner
    (``folded_counts``), in the order their coefficients travel. Sender: rows
    ``send_rows`` go to buffer positions ``send_rows_pos``; partial row ``j`` to
    ``send_partial_pos[j]``, summing inner rows ``send_folded_col`` weighted by the
    coefficients received for ``send_folded_partial``.
    """

    n_inner: int
    n_halo: int
    recv_counts: tuple[int, ...]
    send_counts: tuple[int, ...]
    kept_cols: Tensor
    kept_pos: Tensor
    partial_pos: Tensor
    partial_target: Tensor
    folded_col: Tensor
    folded_partial: Tensor
    folded_counts: tuple[int, ...]
    send_rows: Tensor
    send_rows_pos: Tensor
    send_partial_pos: Tensor
    send_folded_partial: Tensor
    send_folded_col: Tensor

    @property
    def block(self) -> int:
        """Rows received per exchange (fetched rows plus partial sums)."""
        return sum(self.recv_counts)

    @property
    def num_send(self) -> int:
        return sum(self.send_counts)

    def counts(self, forward: bool = True) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(out_counts, in_counts)`` per peer, as :meth:`ExchangePlan.counts`."""
        return (self.send_counts, self.recv_counts) if forward else (self.recv_counts, self.send_counts)

    def relation_view(self, first: int, stop: int) -> tuple[CoverPlan, Tensor]:
        """The layout as one relation of a joint cover sees it (its targets numbered ``[first, stop)``, see
        :func:`~lightning_halo.partition.cover.relation_cover`): its partial sums, targets from 0, and its folded
        edges; with the mask of those edges among all folded ones (where its coefficients go)."""
        mine = (self.partial_target >= first) & (self.partial_target < stop)
        renumber = torch.cumsum(mine.long(), 0) - 1
        folded = mine[self.folded_partial]
        view = replace(
            self, partial_pos=self.partial_pos[mine], partial_target=self.partial_target[mine] - first,
            folded_col=self.folded_col[folded], folded_partial=renumber[self.folded_partial[folded]],
        )  # fmt: skip
        return view, folded

    def partial_of_col(self) -> Tensor:
        """``[n_halo]``: the block position of each fetched halo row, ``-1`` for folded ones."""
        pos = torch.full((self.n_halo,), -1, dtype=torch.long)
        pos[self.kept_cols] = self.kept_pos
        return pos


def _receiver_layout(cover: HaloCover, cut: tuple[Tensor, Tensor], plan: ExchangePlan, n_targets: int) -> dict[str, Tensor]:
    """The receiver's half of the plan, from its cover and cut edges ``(halo row, target)``."""
    world = plan.world_size
    owner = halo_owners(plan.recv_counts)
    kept_cols = torch.nonzero(cover.keep).view(-1)
    kept_rank, kept_n = _rank_within(owner[kept_cols], world)
    part_rank, part_n = _rank_within(cover.partial_owner, world)
    start = torch.cumsum(kept_n + part_n, 0) - (kept_n + part_n)
    h, v = cut
    fold = ~cover.keep[h]
    h, v = h[fold], v[fold]
    keys = cover.partial_owner * n_targets + cover.partial_target  # sorted (the cover's order)
    partial = torch.searchsorted(keys, owner[h] * n_targets + v)
    pair = torch.unique(partial * max(plan.n_halo, 1) + h)  # sorted by partial, hence owner; then by row
    folded_partial, folded_col = pair // max(plan.n_halo, 1), pair % max(plan.n_halo, 1)
    return {
        "recv": kept_n + part_n,
        "kept_cols": kept_cols,
        "kept_pos": start[owner[kept_cols]] + kept_rank,
        "partial_pos": start[cover.partial_owner] + kept_n[cover.partial_owner] + part_rank,
        "folded_col": folded_col,
        "folded_partial": folded_partial,
        "folded_counts": torch.bincount(cover.partial_owner[folded_partial], minlength=world),
        "partial_start": torch.cumsum(part_n, 0) - part_n,
    }


def _swap_structure(
    plan: ExchangePlan, cover: HaloCover, mine: dict[str, Tensor], gid: Tensor, exchange: RowsExchange
) -> tuple[list[Tensor], list[Tensor]]:
    """Tell each owner which of its rows I still fetch and which of its rows feed which of my partial
    sums; returns what each peer told me (on the CPU: NCCL moves CUDA tensors only, so they travel
    on the wire's device)."""
    owner = halo_owners(plan.recv_counts)
    keep_chunks = list(torch.split(cover.keep.long().view(-1, 1), list(plan.recv_counts)))
    fc = mine["folded_col"]
    local_partial = mine["folded_partial"] - mine["partial_start"][owner[fc]]
    pairs = torch.stack([local_partial, gid[plan.n_inner + fc]], dim=1)
    fold_chunks = list(torch.split(pairs, mine["folded_counts"].tolist()))
    device = plan.send_index.device
    keeps, folds = ([t.cpu() for t in exchange([c.to(device) for c in chunks])] for chunks in (keep_chunks, fold_chunks))
    return keeps, folds


def build_cover_plan(
    plan: ExchangePlan, edge_index: Tensor | tuple[Tensor, Tensor], cover: HaloCover, global_id: Tensor,
    exchange: RowsExchange, n_targets: Optional[int] = None,
) -> CoverPlan:  # fmt: skip
    """The :class:`CoverPlan` of a rank (one structure exchange with every peer; all ranks call it together).

    Args:
        plan (ExchangePlan): the partition's row plan (its ``"in"`` halo, or a node type's).
        edge_index (Tensor or tuple): the partition's in-edges (local ids), or the cut edges
            ``(halo row, target)`` of several relations (:func:`~lightning_halo.partition.cover.relation_cover`).
        cover (HaloCover): this rank's cover as a receiver.
        global_id (Tensor): the partition's local -> global ids (of the plan's node type).
        exchange: :meth:`~lightning_halo.exchange.Collectives.all_to_all_rows` of the rank.
        n_targets (int, optional): the targets' numbering (default: the inner nodes).
    """
    world = plan.world_size
    cut = edge_index if isinstance(edge_index, tuple) else cut_edges(edge_index.cpu(), plan.n_inner)
    mine = _receiver_layout(cover, cut, plan, max(n_targets if n_targets is not None else plan.n_inner, 1))
    gid = global_id.long().cpu()
    fc = mine["folded_col"]
    keeps, folds = _swap_structure(plan, cover, mine, gid, exchange)
    send_blocks = torch.split(plan.send_index.cpu(), list(plan.send_counts))
    inner_gid = gid[: plan.n_inner]
    rows, rows_pos, part_pos, f_part, f_col, send_counts = [], [], [], [], [], []
    offset = n_partials = 0
    for q in range(world):
        kept = send_blocks[q][keeps[q].view(-1).bool()]
        f = folds[q].view(-1, 2)
        n_part = int(f[:, 0].max()) + 1 if f.numel() else 0
        u = torch.searchsorted(inner_gid, f[:, 1].contiguous())
        if f.numel() and not bool(torch.equal(inner_gid[u.clamp(max=max(plan.n_inner - 1, 0))], f[:, 1])):
            raise RuntimeError(f"rank {plan.rank}: peer {q} asked for partial sums over nodes this rank does not own")
        rows.append(kept)
        rows_pos.append(offset + torch.arange(kept.numel()))
        part_pos.append(offset + kept.numel() + torch.arange(n_part))
        f_part.append(n_partials + f[:, 0])
        f_col.append(u)
        send_counts.append(kept.numel() + n_part)
        offset += send_counts[-1]
        n_partials += n_part
    return CoverPlan(
        n_inner=plan.n_inner,
        n_halo=plan.n_halo,
        recv_counts=tuple(int(c) for c in mine["recv"].tolist()),
        send_counts=tuple(int(c) for c in send_counts),
        kept_cols=mine["kept_cols"],
        kept_pos=mine["kept_pos"],
        partial_pos=mine["partial_pos"],
        partial_target=cover.partial_target.clone(),
        folded_col=fc,
        folded_partial=mine["folded_partial"],
        folded_counts=tuple(int(c) for c in mine["folded_counts"].tolist()),
        send_rows=torch.cat(rows),
        send_rows_pos=torch.cat(rows_pos),
        send_partial_pos=torch.cat(part_pos),
        send_folded_partial=torch.cat(f_part),
        send_folded_col=torch.cat(f_col),
    )


def _operator(
    rows: list[Tensor], cols: list[Tensor], values: list[Tensor], shape: tuple[int, int], dtype: torch.dtype,
    device: torch.device,
) -> Tensor:  # fmt: skip
    """``[shape]`` CSR operator with entries ``(row, col) -> value`` (no repeats by construction)."""
    index = torch.stack([torch.cat(rows), torch.cat(cols)])
    with warnings.catch_warnings():  # torch notes once per process that sparse tensors are "beta"
        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
        coo = torch.sparse_coo_tensor(index, torch.cat(values).to(dtype), shape, check_invariants=False).coalesce()
        return coo.to_sparse_csr().to(device)


#: The dtypes a device's sparse product may lack a kernel for (then run in float32).
_MAYBE_NO_KERNEL = (torch.float16, torch.bfloat16)


def _apply(op: Tensor, x: Tensor) -> Tensor:
    """``op @ x`` in ``x``'s dtype: torch's CPU ``spmm_reduce`` kernel (it has bfloat16/float16
    versions, MKL's has not), cuSPARSE on CUDA, in float32 where a dtype has no kernel there."""
    flat = x.reshape(x.size(0), math.prod(x.shape[1:]))  # not -1: a rank may own no row of a type
    if not op.values().numel():
        return x.new_zeros((op.size(0), *x.shape[1:]))
    a = op if op.dtype == x.dtype else op.to(x.dtype)
    if x.device.type == "cpu":
        out = torch.sparse.mm(a, flat, "sum")
    else:
        try:
            out = torch.sparse.mm(a, flat)
        except RuntimeError as err:  # out of memory is one too: float32 would need more still
            if isinstance(err, torch.OutOfMemoryError) or x.dtype not in _MAYBE_NO_KERNEL:
                raise
            out = torch.sparse.mm(op.to(torch.float32), flat.float()).to(x.dtype)
    return out.reshape(op.size(0), *x.shape[1:])


@dataclass(frozen=True)
class CoverRoute:
    r"""One call's cover exchange: :class:`CoverPlan` with its coefficients.

    Attributes:
        plan: the static layout.
        send: :math:`S`, ``[num_send, n_inner]``: my buffer for the peers is ``S x``.
        send_t: :math:`S^\top` (the backward: gradients of my rows from the peers' block gradients).
        local: :math:`R`, ``[block, n_halo]``: the block from halo rows this rank holds.
    """

    plan: CoverPlan
    send: Tensor
    send_t: Tensor
    local: Tensor

    @property
    def block(self) -> int:
        return self.plan.block

    def counts(self, forward: bool = True) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return self.plan.counts(forward)

    def send_buffer(self, x_inner: Tensor) -> Tensor:
        """My rows and partial sums for the peers, ``[num_send, d]``."""
        return _apply(self.send, x_inner)

    def scatter(self, grad_send: Tensor) -> Tensor:
        """``[n_inner, d]``: the gradient of my rows from the gradients of what I sent."""
        return _apply(self.send_t, grad_send)

    def from_halo(self, halo: Tensor) -> Tensor:
        """The block from full halo rows ``[n_halo, d]`` held locally (no traffic)."""
        return _apply(self.local, halo)


def build_route(
    plan: CoverPlan, coefficients: Tensor, exchange: Optional[RowsExchange], device: torch.device
) -> CoverRoute:
    r"""The :class:`CoverRoute` for coefficients ``[n_folded]`` of the receiver's folded edges (plan order).

    ``exchange`` sends each owner its coefficients (all ranks call it together); ``None`` on one process.
    """
    c = coefficients.detach().cpu()
    dtype = c.dtype
    if exchange is not None:
        got = exchange([t.view(-1, 1).to(device) for t in torch.split(c, list(plan.folded_counts))])
        c_send = torch.cat([g.view(-1).cpu() for g in got]).to(dtype)
    else:
        c_send = c
    one_send = torch.ones(plan.send_rows.numel(), dtype=dtype)
    rows = [plan.send_rows_pos, plan.send_partial_pos[plan.send_folded_partial]]
    cols = [plan.send_rows, plan.send_folded_col]
    shape = (plan.num_send, plan.n_inner)
    send = _operator(rows, cols, [one_send, c_send], shape, dtype, device)
    send_t = _operator(cols, rows, [one_send, c_send], (shape[1], shape[0]), dtype, device)
    one_kept = torch.ones(plan.kept_cols.numel(), dtype=dtype)
    local = _operator(
        [plan.kept_pos, plan.partial_pos[plan.folded_partial]], [plan.kept_cols, plan.folded_col],
        [one_kept, c], (plan.block, plan.n_halo), dtype, device,
    )  # fmt: skip
    return CoverRoute(plan, send, send_t, local)
