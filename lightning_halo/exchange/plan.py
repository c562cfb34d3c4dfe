"""The exchange plan of one rank, as plain Python lists for the collectives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional, Sequence, get_args

import torch
from torch import Tensor

from lightning_halo.partition.halo_partition import HaloPartition

#: Which edges of a partition a halo belongs to: ``"in"``, the in-edges of the inner nodes (the
#: partition's own halo and plan), or ``"out"``, their out-edges reversed (built on first use, for
#: ``edge_index.flip(0)`` and ``flow="target_to_source"``).
Direction = Literal["in", "out"]
DIRECTIONS: tuple[Direction, ...] = get_args(Direction)


def type_plan_key(node_type: str) -> str:
    """The key of a heterogeneous partition's plan for the halo of ``node_type`` (beside ``"in"``).

    Example:
        >>> type_plan_key("author")
        'in:author'
    """
    return f"in:{node_type}"


@dataclass(frozen=True)
class ExchangePlan:
    r"""Who sends which rows to whom, taken once from a :class:`HaloPartition`.

    Forward, rank :math:`r` sends ``send_index`` rows (``send_counts[q]`` to peer ``q``) and
    receives its ``n_halo`` halo rows (``recv_counts[q]`` from peer ``q``); backward the
    same buffers travel in the opposite direction. Sizes are known up front, so no
    collective ever needs a size handshake.

    Example:
        >>> plan = ExchangePlan(0, 2, n_inner=3, n_halo=1, send_index=torch.tensor([2]),
        ...                     send_counts=(0, 1), recv_counts=(0, 1))
        >>> plan.num_send, plan.counts(forward=False)
        (1, ((0, 1), (0, 1)))
    """

    rank: int
    world_size: int
    n_inner: int
    n_halo: int
    send_index: Tensor
    send_counts: tuple[int, ...]
    recv_counts: tuple[int, ...]

    @classmethod
    def from_partition(cls, part: HaloPartition) -> ExchangePlan:
        return cls(
            rank=int(part.part_id),
            world_size=int(part.num_parts),
            n_inner=int(part.n_inner),
            n_halo=int(part.n_halo),
            send_index=part.send_index,
            send_counts=tuple(int(c) for c in part.send_counts.tolist()),
            recv_counts=tuple(int(c) for c in part.recv_counts.tolist()),
        )

    @classmethod
    def from_node_store(cls, part: Any, node_type: str) -> ExchangePlan:
        """The plan of one node type of a :class:`~lightning_halo.partition.hetero.HeteroHaloPartition`."""
        store = part[node_type]
        return cls(
            rank=int(part.part_id),
            world_size=int(part.num_parts),
            n_inner=int(store.n_inner),
            n_halo=int(store.num_nodes) - int(store.n_inner),
            send_index=store.send_index,
            send_counts=tuple(int(c) for c in store.send_counts.tolist()),
            recv_counts=tuple(int(c) for c in store.recv_counts.tolist()),
        )

    @classmethod
    def summed(cls, plans: Sequence[ExchangePlan]) -> ExchangePlan:
        """All node types' plans as one: the rank's totals (its signature, checkpoint shapes, traffic figures).

        Its ``send_index`` lists every type's sent rows, each in its own type's ids: it sizes the
        sends, it addresses no tensor (a heterogeneous partition has no single feature matrix).
        """
        first = plans[0]
        world = first.world_size
        return cls(
            rank=first.rank,
            world_size=world,
            n_inner=sum(p.n_inner for p in plans),
            n_halo=sum(p.n_halo for p in plans),
            send_index=torch.cat([p.send_index for p in plans]),
            send_counts=tuple(sum(p.send_counts[q] for p in plans) for q in range(world)),
            recv_counts=tuple(sum(p.recv_counts[q] for p in plans) for q in range(world)),
        )

    @property
    def num_send(self) -> int:
        """Rows this rank sends per exchange (forward) and receives back (backward)."""
        return sum(self.send_counts)

    @property
    def n_src(self) -> int:
        """Rows a layer reads: inner + halo."""
        return self.n_inner + self.n_halo

    def counts(self, forward: bool = True) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(out_counts, in_counts)`` per peer: forward my sent rows out, halo rows in; backward the reverse."""
        return (self.send_counts, self.recv_counts) if forward else (self.recv_counts, self.send_counts)

    def signature(self) -> tuple[int, ...]:
        """Compact fingerprint compared across ranks at setup to catch mismatched plans."""
        return (self.rank, self.world_size, self.n_inner, self.n_halo, *self.send_counts, *self.recv_counts)


def check_signatures(signatures: Sequence[Any], rank: int) -> None:
    """Raise if the ranks' plans (their :meth:`ExchangePlan.signature`, index = rank) disagree.

    Rank ``q`` must expect from me exactly the rows I send it, and send me what I expect.

    Example:
        >>> check_signatures([(0, 2, 3, 1, 0, 1, 0, 1), (1, 2, 3, 1, 1, 0, 1, 0)], rank=0)
    """
    mine = tuple(signatures[rank])
    world = mine[1]
    send_r, recv_r = mine[4 : 4 + world], mine[4 + world : 4 + 2 * world]
    for q, sig in enumerate(signatures):
        sig = tuple(sig)
        send_q, recv_q = sig[4 : 4 + world], sig[4 + world : 4 + 2 * world]
        if sig[0] != q or sig[1] != world or len(send_q) != world or recv_q[rank] != send_r[q] or send_q[rank] != recv_r[q]:
            raise ValueError(
                f"rank {rank}: the exchange plan disagrees with rank {q}'s (different partition caches "
                "or graphs on different nodes?). Clear the partition cache and make sure every node reads the same graph."
            )


def predict_traffic(
    halo_rows: int,
    num_features: int,
    hidden: int,
    layers: int,
    bits: int,
    grad_bits: Optional[int] = None,
    feature_bytes: int = 4,
    gcn: bool = False,
    input_stored: bool = True,
    cover_rows: Optional[int] = None,
) -> dict[str, int]:
    r"""Bytes a model of ``layers`` message-passing layers moves, summed over all ranks.

    Layer 1 reads the input features. Partitions carry their halo's input features
    (``halo_x``), so nothing travels for them; with ``input_stored=False`` (``batch.x``
    changed after partitioning) their halo (``halo_rows`` rows of ``num_features`` values of
    ``feature_bytes`` bytes) travels once, raw. Every later layer reads ``hidden`` columns:
    each training epoch sends ``halo_rows`` rows forward and the same number of gradient rows
    backward, each :func:`~lightning_halo.quant.row_nbytes` long. GCN-style
    layers also exchange one degree per halo row once (``aux``).

    With ``cover_rows`` (the partition's ``halo_rows_cover``: rows per exchange with halo
    partial sums, :mod:`lightning_halo.partition.cover`), the per-epoch figures are for layers
    that all take partial sums (GCN, SAGE with mean/sum, GIN, ...): ``cover_rows`` rows cross each
    way instead of ``halo_rows``. The one-time figures are unchanged (input features and
    degrees travel as rows).

    Example:
        >>> predict_traffic(halo_rows=273, num_features=1433, hidden=64, layers=2, bits=1)["fwd_per_epoch"]
        3549
    """
    from lightning_halo.quant import row_nbytes

    grad_bits = bits if grad_bits is None else grad_bits
    rest = max(layers - 1, 0)
    rows = halo_rows if cover_rows is None else cover_rows
    return {
        "fwd_per_epoch": rest * rows * row_nbytes(hidden, bits),
        "bwd_per_epoch": rest * rows * row_nbytes(hidden, grad_bits),
        "fp32_per_epoch": 2 * rest * rows * hidden * 4,
        "input_once": 0 if input_stored else halo_rows * num_features * feature_bytes,
        "aux_once": halo_rows * feature_bytes if gcn else 0,
    }
