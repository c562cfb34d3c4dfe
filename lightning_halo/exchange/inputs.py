r"""The halo of a partition's own node-level tensors (input features): stored, or exchanged once.

Input features need no gradient and do not change during training, so (as in DistDGL) each
partition carries its halo's input features, ``halo_x``, written at partition time: the first
layer needs no exchange. If ``batch.x`` changed after partitioning (in place or by assigning a
new tensor), its hash no longer matches ``x_digest``; then every rank exchanges the owners'
current rows once, at full precision. Either way the result is kept while the tensor is the
same, unchanged object.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from lightning_halo.exchange.collectives import Collectives
from lightning_halo.exchange.plan import Direction, ExchangePlan
from lightning_halo.memo import TensorMemo
from lightning_halo.partition.halo_partition import HaloPartition, tensor_digest
from lightning_halo.partition.hetero import HeteroHaloPartition


class InputHalos:
    """Halo rows of the bound partition's node-level tensors, for the rank's :class:`HaloExchanger`.

    Args:
        collectives (Collectives): for the agreement and the one-time exchange.
    """

    def __init__(self, collectives: Collectives) -> None:
        self.collectives = collectives
        self._part: Optional[HaloPartition | HeteroHaloPartition] = None
        self._memo = TensorMemo()

    def bind(self, part: Optional[HaloPartition | HeteroHaloPartition], same_partition: bool = False) -> None:
        """Serve ``part``'s tensors (``None``: none). ``same_partition``: another view of the bound partition
        (its plan unchanged), whose halos already computed stay valid: they are kept by tensor, not by batch."""
        self._part = part
        if not same_partition:
            self._memo.clear()

    def holds(self, x: Tensor) -> bool:
        """Whether ``x`` is one of the bound partition's own tensors (and needs no gradient)."""
        part = self._part
        if part is None or x.requires_grad:
            return False
        stores = part.node_stores if isinstance(part, HeteroHaloPartition) else [part]
        return any(v is x for store in stores for v in store.values() if isinstance(v, Tensor))

    def halo(self, x: Tensor, plan: ExchangePlan, direction: Direction, layer: str) -> Tensor:
        """The halo rows of ``x`` (one of :meth:`holds`' tensors) along ``plan``."""
        hit = self._memo.get(direction, (x,))
        if hit is not None:
            return hit
        stored = self._stored(x, plan, layer) if direction != "out" else None
        if stored is None:
            stored = self.collectives.wire.exchange(x[plan.send_index], 32, *plan.counts(True), layer, "input")
        return self._memo.put(direction, (x,), stored)

    def _stored(self, x: Tensor, plan: ExchangePlan, layer: str) -> Optional[Tensor]:
        """The partition's ``halo_x`` if ``x`` is its ``x`` exactly as partitioned, else None.

        The decision must be the same on every rank (a rank that exchanges while its peer does
        not would hang), so the ranks agree on it with one tiny all-reduce.
        """
        part = self._part
        assert part is not None
        if isinstance(part, HeteroHaloPartition):  # the node type whose x this is (holds() found one)
            part = next((s for s in part.node_stores if s.get("x") is x), part.node_stores[0])
        halo_x, digest = part.get("halo_x"), part.get("x_digest")
        ok = (
            x is part.get("x")
            and isinstance(halo_x, Tensor)
            and halo_x.size(0) == plan.n_halo
            and halo_x.shape[1:] == x.shape[1:]
            and halo_x.dtype == x.dtype
            and digest == tensor_digest(x)
        )
        agreed = self.collectives.all_agree([bool(ok)], layer, plan.send_index.device)[0]
        return halo_x.to(x.device) if agreed else None
