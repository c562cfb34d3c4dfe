r"""Exact, non-differentiable collectives the layer calls are given (degrees, edge lists, agreement).

The differentiable fetch of halo rows is :class:`~lightning_halo.exchange.HaloExchanger`'s
job. What else a layer call needs from its peers is here: the owners' values of the halo
nodes (:meth:`Collectives.to_halo`, e.g. degrees), the reverse sum
(:meth:`Collectives.to_owners`, e.g. out-degrees), rows of any length to each peer
(:meth:`Collectives.all_to_all_rows`, e.g. edge lists), and the tiny agreements that make
every rank take the same branch (:meth:`Collectives.all_agree`, :meth:`Collectives.global_max`).
All travel raw (``bits=32``), counted as ``aux`` traffic, on the same wire as the halo rows.

Example:
    >>> from lightning_halo.exchange.meter import TrafficMeter
    >>> from lightning_halo.exchange.wire import SoloTransport, Wire
    >>> coll = Collectives(Wire(SoloTransport(), TrafficMeter()))  # one process: nobody to agree with
    >>> coll.all_agree([True, False], "conv1", torch.device("cpu"))
    [True, False]
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_halo.exchange.plan import ExchangePlan
from lightning_halo.exchange.wire import Wire


class Collectives:
    """The exact collectives of one rank, over its :class:`~lightning_halo.exchange.wire.Wire`.

    Every rank must call them in the same order (each is one collective, or two).

    Args:
        wire (Wire): the rank's wire.
    """

    def __init__(self, wire: Wire) -> None:
        self.wire = wire

    @property
    def world_size(self) -> int:
        return self.wire.world_size

    def to_halo(self, rows_inner: Tensor, plan: ExchangePlan, layer: str) -> Tensor:
        """The owners' rows of ``plan``'s halo nodes, ``[n_halo, ...]``, from every rank's inner rows."""
        if plan.world_size == 1:
            return rows_inner[:0]
        with torch.no_grad():
            rows = rows_inner[plan.send_index].reshape(plan.num_send, -1)
            halo = self.wire.exchange(rows, 32, *plan.counts(True), layer, "aux")
        return halo.reshape(plan.n_halo, *rows_inner.shape[1:])

    def to_owners(self, values_halo: Tensor, plan: ExchangePlan, layer: str) -> Tensor:
        """Per inner node, the sum of the values its peers hold for it as a halo node: ``[n_inner, ...]``.

        The reverse of :meth:`to_halo`, e.g. for out-degrees, whose parts are spread over the
        partitions of the edges' targets.
        """
        out = values_halo.new_zeros((plan.n_inner, *values_halo.shape[1:]))
        if plan.world_size == 1:
            return out
        with torch.no_grad():
            recv = self.wire.exchange(values_halo.reshape(plan.n_halo, -1), 32, *plan.counts(False), layer, "aux")
            out.index_add_(0, plan.send_index, recv.reshape(plan.num_send, *values_halo.shape[1:]).to(out.dtype))
        return out

    def all_to_all_rows(self, chunks: list[Tensor], layer: str) -> list[Tensor]:
        """Send ``chunks[q]`` (rows of any length) to peer ``q``; returns what each peer sent me.

        First the row counts travel, then the rows (used once per partition, e.g. to build its
        out-edges).
        """
        n = self.world_size
        if len(chunks) != n:
            raise ValueError(f"all_to_all_rows needs one chunk per rank ({n}), got {len(chunks)}")
        ref = chunks[0]
        counts = torch.tensor([c.size(0) for c in chunks], dtype=torch.long, device=ref.device)
        ones = (1,) * n
        got = [int(g) for g in self.wire.exchange(counts.view(-1, 1), 32, ones, ones, layer, "aux").view(-1).tolist()]
        width = int(math.prod(ref.shape[1:]))
        rows = torch.cat(chunks).reshape(sum(c.size(0) for c in chunks), width)
        recv = self.wire.exchange(rows, 32, tuple(c.size(0) for c in chunks), tuple(got), layer, "aux")
        return [r.reshape(-1, *ref.shape[1:]) for r in torch.split(recv, got)]

    def all_agree(self, flags: list[bool], layer: str, device: torch.device) -> list[bool]:
        """Each flag AND-ed over all ranks (one tiny all-reduce), so every rank takes the same branch."""
        t = torch.tensor([int(f) for f in flags], dtype=torch.int32, device=device)
        return [bool(v) for v in self.wire.all_agree(t, layer).tolist()]

    def global_max(self, value: Tensor, layer: str) -> Tensor:
        """The maximum of a 0-d tensor over all ranks."""
        neg = -value.detach().reshape(1).clone()
        return -self.wire.all_agree(neg, layer).reshape(())

    def all_sum(self, values: Tensor, layer: str) -> Tensor:
        """``values`` summed over all ranks (one all-reduce, in place; e.g. batch-norm statistics)."""
        return self.wire.all_sum(values, layer)
