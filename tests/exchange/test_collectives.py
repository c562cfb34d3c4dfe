"""The exact collectives a layer call is given, in process (threads over an in-process transport)."""

from __future__ import annotations

import torch

from lightning_halo.exchange import Collectives, ExchangePlan
from tests.support.threaded import on_wires


def _plan(rank: int) -> ExchangePlan:
    """Two ranks of 3 inner nodes; each needs the other's nodes 0 and 2 as its halo."""
    counts = (0, 2) if rank == 0 else (2, 0)
    return ExchangePlan(rank, 2, n_inner=3, n_halo=2, send_index=torch.tensor([0, 2]), send_counts=counts,
                        recv_counts=counts)  # fmt: skip


def test_to_halo_and_to_owners_are_exact_and_counted_as_aux() -> None:
    def rank_fn(rank, wire):
        coll, plan = Collectives(wire), _plan(rank)
        deg = torch.tensor([1.0, 2.0, 3.0]) + 10 * rank
        halo = coll.to_halo(deg, plan, "conv")
        owners = coll.to_owners(torch.tensor([0.5, 0.25]) * (rank + 1), plan, "conv")
        return halo, owners, dict(wire.meter.total)

    (h0, o0, m0), (h1, _, _) = on_wires(2, rank_fn)
    assert h0.tolist() == [11.0, 13.0] and h1.tolist() == [1.0, 3.0]
    assert o0.tolist() == [1.0, 0.0, 0.5]  # rank 1 holds rank 0's nodes 0 and 2 as halo
    assert set(m0) == {("conv", "aux")}


def test_rows_of_any_length_agreement_and_maximum() -> None:
    def rank_fn(rank, wire):
        coll = Collectives(wire)
        chunks = [torch.full((rank + q, 2), float(10 * rank + q)) for q in range(2)]
        got = coll.all_to_all_rows(chunks, "edges")
        agreed = coll.all_agree([True, rank == 0], "edges", torch.device("cpu"))
        return got, agreed, float(coll.global_max(torch.tensor(float(rank * 7)), "edges"))

    (g0, a0, m0), (g1, a1, m1) = on_wires(2, rank_fn)
    assert [c.shape for c in g0] == [(0, 2), (1, 2)] and [c.shape for c in g1] == [(1, 2), (2, 2)]
    assert g1[0].unique().tolist() == [1.0] and g0[1].unique().tolist() == [10.0]
    assert a0 == a1 == [True, False] and m0 == m1 == 7.0
