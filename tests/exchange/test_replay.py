"""Recomputation in backward (activation checkpointing, reversible layers) replays the step's halo rows.

A checkpointed run must be the same training as the run without checkpoints, at every width and halo
mode: the same logits, gradients and bytes (the recomputed calls fetch nothing). Ranks in threads
(:func:`tests.support.threaded.run_threaded`), float64, at 3 ranks on a graph with repeated edges,
self-loops and isolated nodes; the reversible and reentrant cases against single-process PyG.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch_geometric import nn as gnn

from lightning_halo.exchange.replay import Replays, fingerprint, may_recompute, recomputing
from tests.support.graphs import awkward_graph
from tests.support.hetero import generated_hetero, hetero_reference, run_threaded_hetero
from tests.support.threaded import assert_same, reference, run_threaded

DATA = awkward_graph(3)
D, C = DATA.num_features, int(DATA.y.max()) + 1


def _conv(kind: str, d_in: int, d_out: int) -> nn.Module:
    return {"gcn": gnn.GCNConv, "sage": gnn.SAGEConv, "gat": lambda a, b: gnn.GATConv(a, b, heads=2, concat=False)}[kind](d_in, d_out)


class Layers(nn.Module):
    """Two layers, each its own checkpointed segment (``per_layer``), both in one (``segment``) or none."""

    def __init__(self, kind: str, how: str) -> None:
        super().__init__()
        self.how, self.c1, self.c2 = how, _conv(kind, D, 16), _conv(kind, 16, C)

    def body(self, x, edge_index):
        return self.c2(self.c1(x, edge_index).relu(), edge_index)

    def forward(self, x, edge_index):
        if self.how == "segment":
            return checkpoint(self.body, x, edge_index, use_reentrant=False)
        if self.how == "per_layer":
            h = checkpoint(self.c1, x, edge_index, use_reentrant=False).relu()
            return checkpoint(self.c2, h, edge_index, use_reentrant=False)
        return self.body(x, edge_index)


class Shared(nn.Module):
    """One layer applied three times, each application its own segment: the recomputations come in reverse order,
    and each must get the rows of its own call."""

    def __init__(self, kind: str, how: str) -> None:
        super().__init__()
        self.how, self.inp, self.conv, self.out = how, nn.Linear(D, 16), _conv(kind, 16, 16), nn.Linear(16, C)

    def forward(self, x, edge_index):
        h = self.inp(x)
        for _ in range(3):
            h = (checkpoint(self.conv, h, edge_index, use_reentrant=False) if self.how else self.conv(h, edge_index)).relu()
        return self.out(h)


def _pair(make) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    plain = make("").double()
    ckpt = make("checkpointed").double()
    ckpt.load_state_dict(plain.state_dict())
    return plain, ckpt


def _run(model: nn.Module, **kwargs) -> dict:
    torch.manual_seed(5)
    return run_threaded(model, DATA, 3, steps=3, timeout=30, **kwargs)


@pytest.mark.parametrize("mode", ["sync", "pipelined"])
@pytest.mark.parametrize("bits", [1, 32])
@pytest.mark.parametrize(("kind", "how"), [("gcn", "per_layer"), ("sage", "segment"), ("gat", "per_layer"), ("sage", "shared")])
def test_a_checkpointed_run_is_the_same_training_as_without_checkpoints(kind: str, how: str, bits: int, mode: str) -> None:
    if how == "shared":
        plain, ckpt = _pair(lambda h: Shared(kind, h))
    else:
        plain, ckpt = _pair(lambda h: Layers(kind, how if h else ""))
    a = _run(plain, bits=bits, mode=lambda e: mode)
    b = _run(ckpt, bits=bits, mode=lambda e: mode)
    assert torch.equal(a["out"], b["out"]) and a["loss"] == b["loss"]
    assert set(a["grad"]) == set(b["grad"]) and all(torch.equal(a["grad"][k], b["grad"][k]) for k in a["grad"])
    # the recomputed calls fetch nothing: every rank's bytes per layer and direction are the unchecked run's
    assert a["meters"] == b["meters"] and any(kind == "fwd" for (_, kind) in a["meters"][0])
    assert a["ranks"][0]["slots"] == b["ranks"][0]["slots"]


def test_a_reentrant_segment_is_exact_and_crosses_once() -> None:
    """``use_reentrant=True`` runs the segment's forward without gradients: its exchange is exact (32 bits, outside
    the training slots) and the recomputation in backward replays it; the result is single-process PyG's."""

    class Reentrant(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp, self.c1, self.c2 = nn.Linear(D, 16), gnn.SAGEConv(16, 16), gnn.SAGEConv(16, C)

        def forward(self, x, edge_index):
            return checkpoint(self.c2, self.c1(self.inp(x), edge_index).relu(), edge_index, use_reentrant=True)

    torch.manual_seed(0)
    model = Reentrant().double()
    got = run_threaded(model, DATA, 3, bits=32, timeout=30)
    assert_same(got, reference(model, DATA), what="reentrant")
    one_bit = run_threaded(model, DATA, 3, bits=1, timeout=30)
    for exact, quantized in zip(got["meters"], one_bit["meters"]):
        # c2's rows cross once each way, at 32 bits; only c1 (not checkpointed) is quantized
        assert quantized[("c2", "fwd")] == exact[("c2", "fwd")] and quantized[("c2", "bwd")] == exact[("c2", "bwd")]
        assert 0 < 8 * quantized[("c1", "fwd")] < exact[("c1", "fwd")]
    assert one_bit["ranks"][0]["slots"] == ["c1"]  # the checkpointed layer takes no training slot


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = gnn.SAGEConv(8, 8)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index).tanh()


class Reversible(nn.Module):
    """PyG's ``GroupAddRev`` (``reversible``), or the same coupling computed plainly with autograd."""

    def __init__(self, reversible: bool) -> None:
        super().__init__()
        self.reversible = reversible
        self.inp, self.rev, self.out = nn.Linear(D, 16), gnn.GroupAddRev(_Block(), num_groups=2), nn.Linear(16, C)

    def forward(self, x, edge_index):
        h = self.inp(x)
        return self.out(self.rev(h, edge_index) if self.reversible else self.rev._forward(h, edge_index))


def test_a_reversible_block_is_exact_at_32_bits() -> None:
    """``GroupAddRev`` runs its forward without gradients and calls its layers again in backward to invert them and
    to differentiate; those calls get the forward's rows: single-process PyG's result."""
    torch.manual_seed(0)
    model = Reversible(True).double()
    assert_same(run_threaded(model, DATA, 3, timeout=30), reference(model, DATA), what="GroupAddRev")


@pytest.mark.parametrize("mode", ["sync", "pipelined"])
def test_a_reversible_layer_trains_at_the_runs_widths_as_its_plain_coupling_does(mode: str) -> None:
    """At 1 bit the reversible block's layers are training exchanges (1-bit rows forward, 1-bit gradients back, their
    own slots), and the run is the plain coupling's: the same logits and bytes, gradients up to the rounding of the
    inversion."""
    torch.manual_seed(0)
    plain = Reversible(False).double()
    rev = Reversible(True).double()
    rev.load_state_dict(plain.state_dict())
    a = _run(plain, bits=1, mode=lambda e: mode)
    b = _run(rev, bits=1, mode=lambda e: mode)
    assert torch.equal(a["out"], b["out"]) and a["meters"] == b["meters"]
    assert b["ranks"][0]["slots"] == ["rev.convs.0.conv", "rev.convs.1.conv"]
    for k, g in a["grad"].items():
        torch.testing.assert_close(b["grad"][k], g, atol=1e-12, rtol=1e-9)
    exact = _run(rev, bits=32)
    for quantized, full in zip(b["meters"], exact["meters"]):
        for key in (("rev.convs.0.conv", "fwd"), ("rev.convs.1.conv", "bwd")):
            assert 0 < 8 * quantized[key] < full[key]


class Deeper(nn.Module):
    """DeeperGCN's blocks (``DeepGCNLayer``, res+), whose layers run under torch's reentrant checkpoint with
    ``ckpt_grad=True``, as PyG's ogbn-proteins example trains them."""

    def __init__(self, ckpt_grad: bool) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(D, 16), nn.Linear(16, C)
        self.blocks = nn.ModuleList(
            [gnn.DeepGCNLayer(gnn.SAGEConv(16, 16), nn.LayerNorm(16), nn.ReLU(), block="res+", ckpt_grad=ckpt_grad) for _ in range(2)]
        )

    def forward(self, x, edge_index):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h, edge_index)
        return self.out(h)


@pytest.mark.parametrize("mode", ["sync", "pipelined"])
def test_deepgcn_blocks_with_ckpt_grad_train_at_the_runs_widths_as_without(mode: str) -> None:
    """``DeepGCNLayer(ckpt_grad=True)`` checkpoints its layer with ``use_reentrant=True`` (forward without autograd);
    the block is marked, so its layer's fetches are training exchanges at 1 bit, replayed in backward: the run is
    the one without checkpoints, bitwise; and exact against PyG at 32 bits."""
    torch.manual_seed(0)
    plain, ckpt = Deeper(False).double(), Deeper(True).double()
    ckpt.load_state_dict(plain.state_dict())
    a = _run(plain, bits=1, mode=lambda e: mode)
    b = _run(ckpt, bits=1, mode=lambda e: mode)
    assert torch.equal(a["out"], b["out"]) and a["meters"] == b["meters"]
    assert all(torch.equal(a["grad"][k], b["grad"][k]) for k in a["grad"])
    assert b["ranks"][0]["slots"] == ["blocks.0.conv", "blocks.1.conv"]
    assert_same(run_threaded(ckpt, DATA, 3, timeout=30), reference(ckpt, DATA), what="DeepGCNLayer(ckpt_grad=True)")


def test_a_checkpointed_heterogeneous_model_replays_each_types_rows() -> None:
    data = generated_hetero()

    class Hetero(nn.Module):
        def __init__(self, how: str) -> None:
            super().__init__()
            self.how = how
            self.emb = nn.Embedding(int(data["venue"].num_nodes), 4)
            rel = lambda a, b: gnn.SAGEConv((a, b), 8)
            self.c1 = gnn.HeteroConv({("paper", "cites", "paper"): rel(6, 6), ("author", "writes", "paper"): rel(4, 6),
                                      ("paper", "rev_writes", "author"): rel(6, 4), ("paper", "in", "venue"): rel(6, 4)})  # fmt: skip
            self.c2 = gnn.HeteroConv({("paper", "cites", "paper"): rel(8, 8), ("author", "writes", "paper"): rel(8, 8)})
            self.out = nn.Linear(8, 3)

        def body(self, x_dict, edge_index_dict):
            h = {t: v.relu() for t, v in self.c1(x_dict, edge_index_dict).items()}
            return self.out(self.c2(h, edge_index_dict)["paper"])

        def forward(self, batch):
            x = dict(batch.x_dict)
            store = batch["venue"]
            x["venue"] = self.emb(store.n_id if "n_id" in store else torch.arange(store.num_nodes))
            if self.how:
                return checkpoint(self.body, x, batch.edge_index_dict, use_reentrant=False)
            return self.body(x, batch.edge_index_dict)

    torch.manual_seed(0)
    plain = Hetero("").double()
    ckpt = Hetero("checkpointed").double()
    ckpt.load_state_dict(plain.state_dict())
    forward = lambda net, batch: net(batch)
    a = run_threaded_hetero(plain, data, 2, forward, "paper", bits=1, steps=2)
    b = run_threaded_hetero(ckpt, data, 2, forward, "paper", bits=1, steps=2)
    assert torch.equal(a["out"], b["out"]) and all(torch.equal(a["grad"][k], b["grad"][k]) for k in a["grad"])
    assert [r["meter"] for r in a["ranks"]] == [r["meter"] for r in b["ranks"]]
    assert_same(run_threaded_hetero(ckpt, data, 2, forward, "paper"), hetero_reference(ckpt, data, forward, "paper"))


# ----------------------------------------------------------------------------------------------- the bookkeeping
def test_keeps_only_where_a_recomputation_can_follow_and_knows_backward() -> None:
    assert not may_recompute() and not recomputing()
    with torch.no_grad():
        assert may_recompute()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        assert not may_recompute()  # hooks that recompute nothing (offloading): nothing kept
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[override]
            return x.clone()

        @staticmethod
        def backward(ctx, g):  # type: ignore[override]
            seen.append(recomputing())
            return g

    Probe.apply(torch.ones(2, requires_grad=True)).sum().backward()
    assert seen == [True]


def test_a_layers_calls_are_told_apart_by_their_input() -> None:
    r = Replays()
    key = ("conv", "in", False)
    inputs = [torch.full((4, 3), float(i)) for i in range(3)]
    rows = [torch.full((2, 3), 10.0 + i) for i in range(3)]
    for x, h in zip(inputs, rows):
        r.keep(key, x, h, fetch=None)
    assert len(r) == 3
    for i in (2, 0, 1):  # recomputed in any order, each gets its own call's rows
        assert torch.equal(r.find(key, inputs[i] + 1e-12).rows, rows[i])  # type: ignore[union-attr]
    assert r.find(("conv", "out", False), inputs[0]) is None and r.find(("conv", "in", True), inputs[0]) is None
    assert torch.equal(fingerprint(torch.zeros(0, 3)), torch.zeros(3, dtype=torch.float64))
    r.clear()
    assert len(r) == 0 and r.find(key, inputs[0]) is None
