"""Second derivatives through the exchange (``create_graph=True``) equal single-process PyG's.

A gradient penalty differentiates the backward pass: on partitions that backward crosses the ranks
(halo gradients to their owners, all-reduced norm sums), so its terms from other ranks must
differentiate again. Ranks in threads (:func:`tests.support.threaded.run_threaded`), float64, on a
graph with repeated edges, self-loops and isolated nodes, at 2 and 3 ranks, with and without halo
partial sums.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric import nn as gnn

from tests.support.graphs import awkward_graph
from tests.support.hetero import (
    generated_hetero,
    hetero_model,
    hetero_reference,
    run_threaded_hetero,
    without_zero_extras,
)
from tests.support.threaded import assert_same, reference, run_threaded

DATA = awkward_graph(3)
D, C = DATA.num_features, int(DATA.y.max()) + 1
LAYERS = {
    "gcn": gnn.GCNConv,
    "sage": gnn.SAGEConv,
    "gat": lambda a, b: gnn.GATConv(a, b, heads=2, concat=False),
    "appnp": None,  # a multi-step layer: ten exchanges, each differentiated twice
}


class Penalised(nn.Module):
    """Two message-passing layers and an optional norm; the forward returns logits scaled by a gradient penalty:
    the squared norm of d(sum of squared logits)/d(first hidden layer), per node."""

    def __init__(self, kind: str, norm: str = "") -> None:
        super().__init__()
        self.inp = nn.Linear(D, 16)
        if kind == "appnp":
            self.c1, self.c2 = gnn.APPNP(K=3, alpha=0.2), gnn.GCNConv(16, C)
        else:
            self.c1, self.c2 = LAYERS[kind](16, 16), LAYERS[kind](16, C)
        self.norm = {"": nn.Identity(), "graph": gnn.GraphNorm(16), "pair": gnn.PairNorm(), "batch": nn.BatchNorm1d(16)}[norm]

    def forward(self, x, edge_index):
        h0 = self.inp(x)
        out = self.c2(self.norm(self.c1(h0, edge_index)).tanh(), edge_index)
        (g,) = torch.autograd.grad(out.square().sum(), h0, create_graph=True)
        return out * (1 + g.square().sum(1, keepdim=True))


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("reduction", ["cover", "none"])
@pytest.mark.parametrize("kind", list(LAYERS))
def test_a_gradient_penalty_matches_the_whole_graph(kind: str, reduction: str, world_size: int) -> None:
    torch.manual_seed(0)
    model = Penalised(kind).double()
    got = run_threaded(model, DATA, world_size, halo_reduction=reduction, timeout=30)
    assert_same(got, reference(model, DATA), what=f"{kind} penalty")


@pytest.mark.parametrize("norm", ["graph", "pair"])
def test_a_gradient_penalty_through_a_graph_wide_norm_matches_the_whole_graph(norm: str) -> None:
    """The norms' all-reduced sums are linear: their backward differentiates again."""
    torch.manual_seed(0)
    model = Penalised("sage", norm).double()
    assert_same(run_threaded(model, DATA, 3, timeout=30), reference(model, DATA), what=f"{norm} norm penalty")


def test_quantized_and_pipelined_exchanges_differentiate_twice() -> None:
    """At 1 bit and in pipelined epochs the second derivative runs (the synchronous exchange's, exact) and differs
    from the 32-bit one only by the rounding noise of the first-order rows."""
    torch.manual_seed(0)
    model = Penalised("gcn").double()
    exact = run_threaded(model, DATA, 2, timeout=30)
    for kwargs in ({"bits": 1}, {"bits": 1, "steps": 2, "mode": lambda e: "sync" if e == 0 else "pipelined"}):
        got = run_threaded(model, DATA, 2, timeout=30, **kwargs)
        assert all(torch.isfinite(g).all() for g in got["grad"].values())
        assert not torch.equal(got["grad"]["c1.lin.weight"], exact["grad"]["c1.lin.weight"])


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_gradient_penalty_through_a_global_batch_norm_matches_the_whole_graph(world_size: int) -> None:
    """The global batch norm's backward, under create_graph, is recomputed from its input with differentiable global
    sums and differentiated: the second derivative through the statistics of every rank's rows."""
    torch.manual_seed(0)
    model = Penalised("sage", "batch").double()
    got, ref = run_threaded(model, DATA, world_size, timeout=30), reference(model, DATA)
    assert_same(got, ref, what="batch norm penalty")
    for r in got["ranks"]:  # running statistics updated once per step, as one process updates them
        torch.testing.assert_close(r["buffers"]["norm.running_var"], ref["buffers"]["norm.running_var"])


@pytest.mark.parametrize("conv", ["sage", "hgt", "han"])
def test_a_gradient_penalty_on_heterogeneous_partitions_matches_the_whole_graph(conv: str) -> None:
    """Per source type's fetch (and HAN's all-reduced semantic attention), differentiated twice: the penalty is the
    squared gradient of the labelled type's logits with respect to each paper's features (through the papers that cite
    it and the authors between)."""
    data = generated_hetero()
    torch.manual_seed(0)
    num_features = {t: int(data[t].x.size(1)) if "x" in data[t] else 0 for t in data.node_types}
    num_nodes = {t: int(data[t].num_nodes) for t in data.node_types}
    model = hetero_model(conv, data.metadata(), num_features, num_nodes, "paper", 3)

    def penalised(net, batch):
        given = {"paper": batch["paper"].x}
        leaves = {t: x.detach().clone().requires_grad_() for t, x in given.items()}
        for t, x in leaves.items():
            batch[t].x = x
        try:
            out = net(batch)
            (g_paper,) = torch.autograd.grad(out.square().sum(), [leaves["paper"]], create_graph=True)
        finally:
            for t, x in given.items():
                batch[t].x = x
        return out * (1 + g_paper.square().sum(1, keepdim=True))

    ref = hetero_reference(model, data, penalised, "paper")
    got = run_threaded_hetero(model, data, 3, penalised, "paper")
    assert_same(without_zero_extras(got, ref), ref, what=f"{conv} penalty")
