"""Heterogeneous models on heterogeneous partitions give the whole-graph result, or are refused with the reason.

In-process (each rank a thread, :func:`tests.support.hetero.run_threaded_hetero`), float64, on a
generated graph with a type without features (embedded by ``n_id``), a relation within one type
with repeated edges and self-loops, reverse edge types and an isolated node: logits of every
labelled node, the loss and every parameter's gradient equal plain PyG on the whole graph at 1-4
ranks, METIS and KaMinPar, for ``to_hetero`` (SAGE, GAT, GIN-style; sum and mean), ``HeteroConv``
with mixed layers and ``HGTConv``. The real-process runs are in tests/strategy/test_hetero.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric import nn as gnn
from torch_geometric.nn import HANConv, HeteroConv, HGTConv, Linear, to_hetero

from lightning_halo import UnsupportedLayerError
from tests.support.hetero import dblp, generated_hetero, hetero_reference, run_threaded_hetero, without_zero_extras
from tests.support.threaded import assert_same

TARGET = "paper"


def _ids(batch, node_type: str) -> torch.Tensor:
    store = batch[node_type]
    return store.n_id if "n_id" in store else torch.arange(store.num_nodes)


class _Homogeneous(nn.Module):
    """What users hand to ``to_hetero``: a plain two-layer GNN on (x, edge_index)."""

    def __init__(self, kind: str, classes: int = 3) -> None:
        super().__init__()
        make = {
            "sage": lambda d: gnn.SAGEConv((-1, -1), d),
            "gat": lambda d: gnn.GATConv((-1, -1), d, heads=2, concat=False, add_self_loops=False),
            "gin": lambda d: gnn.GraphConv((-1, -1), d, aggr="max"),
            "median": lambda d: gnn.SAGEConv((-1, -1), d, aggr="median"),  # PyG's fails where a call's first node has no message
        }[kind]
        self.c1, self.c2 = make(8), make(classes)

    def forward(self, x, edge_index):
        return self.c2(self.c1(x, edge_index).relu(), edge_index)


class ToHetero(nn.Module):
    def __init__(self, kind: str, metadata, aggr: str) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 5)
        self.net = to_hetero(_Homogeneous(kind), metadata, aggr=aggr)

    def forward(self, batch):
        x = dict(batch.x_dict)
        x["venue"] = self.emb(_ids(batch, "venue"))
        return self.net(x, batch.edge_index_dict)[TARGET]


class Mixed(nn.Module):
    """HeteroConv with a different layer per relation, one relation within a type fed a single tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 5)
        self.c1 = HeteroConv({("paper", "cites", "paper"): gnn.GraphConv(-1, 8),
                              ("author", "writes", "paper"): gnn.SAGEConv((-1, -1), 8),
                              ("paper", "rev_writes", "author"): gnn.GATConv((-1, -1), 8, add_self_loops=False),
                              ("paper", "in", "venue"): gnn.GraphConv((-1, -1), 8)}, aggr="sum")  # fmt: skip
        self.c2 = HeteroConv({("paper", "cites", "paper"): gnn.GATConv(-1, 3),  # self-loops: one type
                              ("author", "writes", "paper"): gnn.GINConv(nn.Linear(8, 3))}, aggr="mean")  # fmt: skip

    def forward(self, batch):
        x = dict(batch.x_dict)
        x["venue"] = self.emb(_ids(batch, "venue"))
        h = {k: v.relu() for k, v in self.c1(x, batch.edge_index_dict).items()}
        return self.c2(h, batch.edge_index_dict)[TARGET]


def _edge_weight(batch, edge_type) -> torch.Tensor:
    """Weights of an edge type's edges from their positions in the graph's edge list (alike on partitions)."""
    store = batch[edge_type]
    ids = store.e_id if "e_id" in store else torch.arange(store.edge_index.size(1))
    return 1.0 + (ids % 3).double()


class RowsAndSums(nn.Module):
    """Partial sums beside rows in one exchange: layer 2 reads paper rows through an attention relation and a
    ``max`` one (rows) and a linear one (partial sums); layer 3 gives a GraphConv edge weights, a call its layer's
    exchange was not built for (its own rows)."""

    def __init__(self) -> None:
        super().__init__()
        cites, writes, rev, venue = ("paper", "cites", "paper"), ("author", "writes", "paper"), \
            ("paper", "rev_writes", "author"), ("paper", "in", "venue")  # fmt: skip
        self.emb = nn.Embedding(7, 5)
        self.c1 = HeteroConv({cites: gnn.GraphConv(-1, 8), writes: gnn.SAGEConv((-1, -1), 8),
                              rev: gnn.SAGEConv((-1, -1), 8), venue: gnn.GraphConv((-1, -1), 8)}, aggr="sum")  # fmt: skip
        self.c2 = HeteroConv({cites: gnn.GATConv(8, 8, add_self_loops=False), rev: gnn.GraphConv((8, 8), 8),
                              writes: gnn.SAGEConv((8, 8), 8), venue: gnn.GraphConv((8, 8), 8, aggr="max")}, aggr="sum")  # fmt: skip
        self.c3 = HeteroConv({writes: gnn.GraphConv((8, 8), 3), cites: gnn.SAGEConv(8, 3)}, aggr="sum")
        self.writes = writes

    def forward(self, batch):
        x = dict(batch.x_dict)
        x["venue"] = self.emb(_ids(batch, "venue"))
        h = {k: v.relu() for k, v in self.c1(x, batch.edge_index_dict).items()}
        h = {k: v.relu() for k, v in self.c2(h, batch.edge_index_dict).items()}
        weights = {self.writes: _edge_weight(batch, self.writes)}
        return self.c3(h, batch.edge_index_dict, edge_weight_dict=weights)[TARGET]


class HGT(nn.Module):
    def __init__(self, metadata) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 6)
        self.lin = nn.ModuleDict({t: Linear(-1, 8) for t in metadata[0]})
        self.c1, self.c2 = HGTConv(8, 8, metadata, heads=2), HGTConv(8, 8, metadata, heads=2)
        self.out = Linear(8, 3)

    def forward(self, batch):
        x = dict(batch.x_dict)
        x["venue"] = self.emb(_ids(batch, "venue"))
        x = {t: self.lin[t](v).relu() for t, v in x.items()}
        x = self.c2(self.c1(x, batch.edge_index_dict), batch.edge_index_dict)
        return self.out(x[TARGET])


class HAN(nn.Module):
    """Two HANConv layers over every edge type: paper has three metapaths (cites, writes, and the co-author
    metapath of :func:`_with_metapath` where present), so its semantic attention weighs several."""

    def __init__(self, metadata) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 6)
        self.c1 = HANConv(-1, 8, metadata, heads=2)
        self.c2 = HANConv(8, 8, metadata, heads=2)
        self.out = Linear(8, 3)

    def forward(self, batch):
        x = dict(batch.x_dict)
        x["venue"] = self.emb(_ids(batch, "venue"))
        h = {t: v.relu() for t, v in self.c1(x, batch.edge_index_dict).items()}
        out, attention = self.c2(h, batch.edge_index_dict, return_semantic_attention_weights=True)
        return self.out(out[TARGET]) + 0 * attention[TARGET].sum()


def _with_metapath(data):
    """The co-author metapath paper -> author -> paper as an edge type of its own (``metapath_0``), made before
    partitioning, as ``T.AddMetaPaths([[rev_writes, writes]])`` makes it: every connected pair once, sorted by
    row. Computed with scipy: ``AddMetaPaths`` multiplies two sparse CSR tensors with torch, which crashed this
    process now and then (a segfault in ``torch.matmul`` on CPU, torch 2.13, about one call in 30)."""
    import numpy as np
    import scipy.sparse as sp

    def adjacency(edge_type, rows: int, cols: int):
        src, dst = data[edge_type].edge_index.numpy()
        return sp.csr_matrix((np.ones(len(src)), (src, dst)), shape=(rows, cols))

    n_paper, n_author = data["paper"].num_nodes, data["author"].num_nodes
    pairs = (adjacency(("paper", "rev_writes", "author"), n_paper, n_author)
             @ adjacency(("author", "writes", "paper"), n_author, n_paper)).tocoo()  # fmt: skip
    order = np.lexsort((pairs.col, pairs.row))
    data = data.clone()
    data["paper", "metapath_0", "paper"].edge_index = torch.from_numpy(np.stack([pairs.row[order], pairs.col[order]])).long()
    return data


def _forward(model, batch):
    return model(batch)


def _model(name: str, data) -> nn.Module:
    torch.manual_seed(0)
    meta = data.metadata()
    model = {
        "to_hetero(sage, sum)": lambda: ToHetero("sage", meta, "sum"),
        "to_hetero(gat, mean)": lambda: ToHetero("gat", meta, "mean"),
        "to_hetero(graphconv-max, sum)": lambda: ToHetero("gin", meta, "sum"),
        "to_hetero(sage-median, sum)": lambda: ToHetero("median", meta, "sum"),
        "heteroconv(mixed)": Mixed,
        "heteroconv(rows and partial sums)": RowsAndSums,
        "hgt": lambda: HGT(meta),
        "han": lambda: HAN(meta),
    }[name]().double()
    with torch.no_grad():
        _forward(model, data)  # PyG's way to materialise lazy (in_channels=-1) parameters
    return model


MODELS = ["to_hetero(sage, sum)", "to_hetero(gat, mean)", "to_hetero(graphconv-max, sum)", "to_hetero(sage-median, sum)",
          "heteroconv(mixed)",
          "heteroconv(rows and partial sums)", "hgt", "han"]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("name", MODELS)
def test_every_model_matches_the_whole_graph(name: str, world_size: int) -> None:
    data = generated_hetero()
    model = _model(name, data)
    got = run_threaded_hetero(model, data, world_size, _forward, TARGET)
    assert_same(got, hetero_reference(model, data, _forward, TARGET), what=f"{name} at {world_size} ranks")


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("name", MODELS)
def test_every_model_matches_the_whole_graph_without_partial_sums(name: str, world_size: int) -> None:
    """The matrix above runs with ``halo_reduction="cover"`` (the default: partial sums per relation where a layer
    aggregates linearly); here every halo row travels."""
    data = generated_hetero()
    model = _model(name, data)
    got = run_threaded_hetero(model, data, world_size, _forward, TARGET, halo_reduction="none")
    assert_same(got, hetero_reference(model, data, _forward, TARGET), what=f"{name} at {world_size} ranks, no cover")
    assert not any("partial sums" in c for c in got["ranks"][0]["choices"].values())


def _joint_rows(part, layer_relations: list[tuple[str, str, str]], folds: list[bool]) -> int:
    """The rows one exchange of a layer brings for its source type: :func:`relation_cover` of its relations' cut
    edges, recomputed here from the partition."""
    from lightning_halo.partition.cover import RelationCut, cut_edges, relation_cover

    src = layer_relations[0][0]
    n_inner = int(part[src].n_inner)
    cuts = [RelationCut(*cut_edges(part[e].edge_index, n_inner), int(part[e[-1]].n_inner), f)
            for e, f in zip(layer_relations, folds)]  # fmt: skip
    return relation_cover(cuts, int(part[src].num_nodes) - n_inner, part[src].recv_counts.tolist())[0].rows


@pytest.mark.parametrize("world_size", [2, 3])
def test_partial_sums_per_relation_move_exactly_the_joint_covers_rows(world_size: int) -> None:
    """to_hetero(SAGE): layer 2 reads paper rows through three relations (cites, rev_writes, in) in one exchange of
    the joint cover's rows; its gradients come back the same way; fewer than every halo row."""
    from lightning_halo.partition.hetero import assign_hetero_parts, build_hetero_partitions
    from lightning_halo.quant import row_nbytes

    data = generated_hetero()
    model = _model("to_hetero(sage, sum)", data)
    cover = run_threaded_hetero(model, data, world_size, _forward, TARGET)
    rows = run_threaded_hetero(model, data, world_size, _forward, TARGET, halo_reduction="none")
    parts = build_hetero_partitions(data, assign_hetero_parts(data, world_size))
    reading = {"paper": [("paper", "cites", "paper"), ("paper", "rev_writes", "author"), ("paper", "in", "venue")],
               "author": [("author", "writes", "paper")]}  # fmt: skip
    saved = 0
    for r, (c, plain) in enumerate(zip(cover["ranks"], rows["ranks"])):
        for node_type, relations in reading.items():
            layer = f"net.c2[{node_type}]"
            block = _joint_rows(parts[r], relations, [True] * len(relations))
            assert c["meter"][(layer, "bwd")] == block * row_nbytes(8, 32, torch.float64), (r, layer)
            n_halo = int(parts[r][node_type].num_nodes) - int(parts[r][node_type].n_inner)
            assert plain["meter"][(layer, "bwd")] == n_halo * row_nbytes(8, 32, torch.float64)
            saved += n_halo - block
        assert all("partial sums (net.c2[" in how for name, how in c["choices"].items() if ".c2." in name), c["choices"]
    assert saved > 0, "this graph has rows to save"
    sent = lambda res: sum(v for rk in res["ranks"] for (_, kind), v in rk["meter"].items() if kind == "fwd")  # noqa: E731
    assert sent(cover) < sent(rows)


def test_relations_that_read_rows_share_the_exchange_and_a_call_it_was_not_built_for_fetches_its_own() -> None:
    data = generated_hetero()
    got = run_threaded_hetero(_model("heteroconv(rows and partial sums)", data), data, 2, _forward, TARGET)
    choices = got["ranks"][0]["choices"]
    assert "halo rows (" in choices["c2.convs.<paper___cites___paper>"]  # attention: rows, in the joint exchange
    assert "partial sums (c2.convs[paper]" in choices["c2.convs.<paper___rev_writes___author>"]
    assert "rows of its own" in choices["c3.convs.<author___writes___paper>"]  # edge weights: not predicted
    assert {layer for layer, _ in got["ranks"][0]["meter"]} >= {"c2.convs[paper]", "c3.convs.<author___writes___paper>[author]"}


@pytest.mark.parametrize("name", ["to_hetero(sage, sum)", "hgt"])
def test_kaminpar_partitions_match_too(name: str) -> None:
    data = generated_hetero(seed=1)
    model = _model(name, data)
    got = run_threaded_hetero(model, data, 3, _forward, TARGET, partitioner="kaminpar")
    assert_same(got, hetero_reference(model, data, _forward, TARGET), what=f"{name}, KaMinPar")


def test_each_layer_fetches_a_source_type_once_however_many_relations_read_it() -> None:
    """Layer 2 reads paper rows through two relations (cites, rev_writes) and author rows through one: two fetches."""
    data = generated_hetero()
    got = run_threaded_hetero(_model("to_hetero(sage, sum)", data), data, 2, _forward, TARGET)
    for rank in got["ranks"]:
        assert rank["slots"] == ["net.c2[paper]", "net.c2[author]"], rank["slots"]  # layer 1 reads stored input halos
        assert {layer for layer, _ in rank["meter"]} == {"net.c2[paper]", "net.c2[author]"}


@pytest.mark.parametrize("reduction", ["cover", "none"])
def test_a_steps_fetched_halos_are_let_go_when_the_next_step_begins(reduction: str) -> None:
    """The halos a layer fetched (kept for the step so that every relation reading a source type shares them) are
    not held past the step: a MAG-shaped run grew by its three source types' blocks (135 MB) every epoch."""
    import gc
    import weakref

    from lightning_halo.exchange import HaloExchanger
    from lightning_halo.layers.hooks import LayerContext, install_hooks
    from lightning_halo.partition.hetero import assign_hetero_parts, build_hetero_partitions
    from lightning_halo.testing import ThreadGroup
    from tests.support.hetero import hetero_loss
    from tests.support.threaded import on_threads

    data = generated_hetero()
    model = _model("heteroconv(rows and partial sums)", data)
    parts = build_hetero_partitions(data, assign_hetero_parts(data, 2, partitioner="metis"))
    group = ThreadGroup(2, timeout=60)

    def rank_main(r: int) -> list[int]:
        net = __import__("copy").deepcopy(model)
        ex = HaloExchanger(group.transport(r))
        ctx = LayerContext(ex, halo_reduction=reduction)  # type: ignore[arg-type]
        install_hooks(net, ctx)
        ex.bind(parts[r])
        ctx.bind(parts[r])
        fetched: list[weakref.ref] = []
        fetch = ex.fetch

        def recording(*args, **kwargs):
            out = fetch(*args, **kwargs)
            if out.requires_grad:  # a layer's halo (input features' halos are kept by design)
                fetched.append(weakref.ref(out))
            return out

        ex.fetch = recording  # type: ignore[method-assign]
        alive = []
        for step in range(3):
            ex.begin_step(True, epoch=step, keep_history=False)  # as the strategy begins a synchronous run's step
            ctx.begin_step()
            gc.collect()
            alive.append(sum(ref() is not None for ref in fetched))
            net.zero_grad()
            out = net(parts[r])
            hetero_loss(out, parts[r][TARGET], int(data[TARGET].train_mask.sum())).backward()
            assert fetched, "the model fetched no halo"
        return alive

    for alive in on_threads(2, rank_main, 90):
        assert alive == [0, 0, 0], alive


def test_relations_aggregate_with_their_fused_adjacency_where_pyg_has_a_sparse_path() -> None:
    """SAGE (mean) and GraphConv-max relations get the relation's fused adjacency, GAT keeps edge_index; the
    matrix above checks that both give the whole-graph result."""
    data = generated_hetero()
    for name, how in [("to_hetero(sage, sum)", "aggregation fused"), ("to_hetero(graphconv-max, sum)", "aggregation fused"),
                      ("to_hetero(gat, mean)", "aggregation edge_index")]:  # fmt: skip
        choices = run_threaded_hetero(_model(name, data), data, 2, _forward, TARGET)["ranks"][0]["choices"]
        assert choices and all(how in c for c in choices.values()), (name, choices)


def test_quantized_halos_train_and_move_fewer_bytes() -> None:
    data = generated_hetero()
    model = _model("hgt", data)
    exact = run_threaded_hetero(model, data, 2, _forward, TARGET)
    one_bit = run_threaded_hetero(model, data, 2, _forward, TARGET, bits=1)
    fwd = lambda meter: sum(v for (_, kind), v in meter.items() if kind == "fwd")  # noqa: E731
    for e, q in zip(exact["ranks"], one_bit["ranks"]):
        assert 0 < fwd(q["meter"]) * 8 < fwd(e["meter"])
    assert torch.isfinite(one_bit["out"]).all() and not torch.equal(one_bit["out"], exact["out"])


def test_pipelined_epochs_read_last_epochs_halos() -> None:
    """A pipelined epoch after a sync one runs (stale rows of the slot's node type) and differs from sync."""
    data = generated_hetero()
    model = _model("heteroconv(mixed)", data)
    sync = run_threaded_hetero(model, data, 2, _forward, TARGET, steps=2)
    stale = run_threaded_hetero(model, data, 2, _forward, TARGET, steps=2, mode=lambda e: "sync" if e == 0 else "pipelined")
    assert torch.isfinite(stale["out"]).all() and stale["ranks"][0]["slots"] == sync["ranks"][0]["slots"]


def _drifting(model, batch):
    """The forward, after moving every weight a little (as an optimiser step would, alike on every rank and in the
    reference): the rows a layer sends then change from step to step."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.05)
    return model(batch)


def test_periodic_epochs_send_nothing_and_read_the_last_refresh() -> None:
    """Periodic mode between refreshes (DIGEST): each source type's slot reads the rows of the last sync epoch
    (so the output differs from sync's while the weights move); the refresh epoch after it is exact again."""
    data = generated_hetero()
    model = _model("to_hetero(sage, sum)", data)
    modes = ["sync", "periodic", "sync"]
    got = run_threaded_hetero(model, data, 2, _drifting, TARGET, steps=3, mode=lambda e: modes[e])
    exact = run_threaded_hetero(model, data, 2, _drifting, TARGET, steps=3)
    for g, e in zip(got["ranks"], exact["ranks"]):
        assert torch.equal(g["outs"][0], e["outs"][0]) and not torch.equal(g["outs"][1], e["outs"][1])
        assert torch.isfinite(g["outs"][1]).all() and torch.equal(g["outs"][2], e["outs"][2])


@pytest.mark.parametrize(("bound", "stale"), [(0.0, False), (1e9, True)])
def test_adaptive_staleness_decides_per_source_type_slot_alike_on_every_rank(bound: float, stale: bool) -> None:
    """Adaptive staleness on heterogeneous partitions: every rank takes the same decision per `<layer>[<type>]`
    slot; with no drift allowed every epoch is sync (the exact result), with any drift allowed the slots go stale."""
    data = generated_hetero()
    model = _model("heteroconv(mixed)", data)
    modes = ["sync", "adaptive", "adaptive"]
    got = run_threaded_hetero(model, data, 3, _drifting, TARGET, steps=3, mode=lambda e: modes[e], drift_bound=bound)
    decisions = [r["decisions"] for r in got["ranks"]]
    assert decisions[0] and all(d == decisions[0] for d in decisions), decisions
    assert all((mode != "sync") == stale for mode, _ in decisions[0]), decisions[0]
    if not stale:
        exact = run_threaded_hetero(model, data, 3, _drifting, TARGET, steps=3)
        for g, e in zip(got["ranks"], exact["ranks"]):
            assert torch.equal(g["outs"][-1], e["outs"][-1])


def test_adaptive_bits_agree_per_node_type_slot() -> None:
    """bits="adaptive" on heterogeneous partitions: each source type's fetch is a slot with its own widths, the
    same on every rank, and the epochs after the first choose them from what was sent."""
    data = generated_hetero()
    model = _model("heteroconv(mixed)", data)
    got = run_threaded_hetero(model, data, 3, _forward, TARGET, bits="adaptive", steps=3, options={"bit_target": 0.0})
    widths = [rank["widths"] for rank in got["ranks"]]
    assert widths[0] and all(w == widths[0] for w in widths), widths
    assert any(b > 1 for w in widths[0] for b in w.values()), f"the budget buys wider widths somewhere: {widths[0]}"
    assert len(widths[0]) == len(got["ranks"][0]["slots"]) and any("[" in name for name in got["ranks"][0]["slots"])
    assert torch.isfinite(got["out"]).all()
    assert sum(v for (layer, kind), v in got["ranks"][0]["meter"].items() if layer == "bits" and kind == "aux") > 0
    noise = [rank["noise"] for rank in got["ranks"]]
    assert all(n == noise[0] for n in noise) and all(v >= 0 for per in noise[0] for v in per.values()), noise


def _brute_reach(edge_index: torch.Tensor, n_dst: int, n_src: int) -> float:
    """Sum over the edges from a halo source into an inner target of 1/deg(target)^2, one edge at a time."""
    deg: dict[int, int] = {}
    for s, d in edge_index.t().tolist():
        if d < n_dst:
            deg[d] = deg.get(d, 0) + 1
    return sum(1.0 / deg[d] ** 2 for s, d in edge_index.t().tolist() if d < n_dst and s >= n_src)


def test_adaptive_bits_weigh_each_source_types_halo_by_the_edge_types_that_read_it() -> None:
    """A node type's halo rows reach the outputs of every edge type they are the source of, each relation
    aggregating its own in-edges (to_hetero, HeteroConv): its reach sums theirs over its target types' inner nodes."""
    from lightning_halo.exchange import HaloExchanger
    from lightning_halo.partition.hetero import assign_hetero_parts, build_hetero_partitions

    data = generated_hetero()
    parts = build_hetero_partitions(data, assign_hetero_parts(data, 2, partitioner="metis"))
    seen = 0.0
    for part in parts:
        ex = HaloExchanger(None, bits="adaptive")
        ex.bind(part)
        for t in part.node_types:
            read = [e for e in part.edge_types if e[0] == t]
            w = sum(_brute_reach(part[e].edge_index, int(part[e[-1]].n_inner), int(part[t].n_inner)) for e in read)
            outputs = sum({e[-1]: int(part[e[-1]].n_inner) for e in read}.values())
            assert ex.reach(f"in:{t}") == pytest.approx((w, float(outputs))), (part.part_id, t)
            seen += w
    assert seen > 0, "the graph must have halo edges"


def test_dblp_matches_the_whole_graph() -> None:
    data = dblp()
    if data is None:
        pytest.skip("the shared datasets (heco/dblp) are not on this machine")
    data["paper"].x = data["paper"].x[:, :64].contiguous()  # its 4,231 columns cost time, not coverage
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(20, 8)
            self.net = to_hetero(_Homogeneous("sage", classes=4), data.metadata(), aggr="sum")

        def forward(self, batch):
            x = dict(batch.x_dict)
            x["conference"] = self.emb(_ids(batch, "conference"))
            return self.net(x, batch.edge_index_dict)["author"]

    model = Net()
    with torch.no_grad():
        _forward(model, data)
    got = run_threaded_hetero(model, data, 2, _forward, "author")
    ref = hetero_reference(model, data, _forward, "author")
    assert_same(without_zero_extras(got, ref), ref, atol=1e-5, rtol=1e-5, what="DBLP to_hetero(sage)")


# ---------------------------------------------------------------------------------------- refusals
class _OneRelation(nn.Module):
    def __init__(self, conv: nn.Module, edge_type, x_types) -> None:
        super().__init__()
        self.conv, self.edge_type, self.x_types = conv, edge_type, x_types

    def forward(self, batch):
        x = tuple(batch[t].x for t in self.x_types)
        return self.conv(x[0] if len(x) == 1 else x, batch[self.edge_type].edge_index)


def _refused(model: nn.Module, match: str) -> None:
    data = generated_hetero()
    with pytest.raises(UnsupportedLayerError, match=match) as err:
        run_threaded_hetero(model.double(), data, 2, _forward, TARGET)
    assert all(e is not None for e in err.value.rank_errors), "every rank refuses (none waits for a peer)"


class GCNRelations(nn.Module):
    """HeteroConv with GCNConv on the relation within one type (repeated edges and self-loops, weighted or not)
    and LGConv beside SAGEConv: the halo papers' degrees in the relation come from their owners."""

    def __init__(self, improved: bool, weighted: bool) -> None:
        super().__init__()
        self.weighted = weighted
        self.c1 = HeteroConv({("paper", "cites", "paper"): gnn.GCNConv(6, 8, improved=improved),
                              ("author", "writes", "paper"): gnn.SAGEConv((4, 6), 8)}, aggr="sum")  # fmt: skip
        self.c2 = HeteroConv({("paper", "cites", "paper"): gnn.LGConv()}, aggr="sum")
        self.out = Linear(8, 3)

    def forward(self, batch):
        edges = batch.edge_index_dict
        kwargs = {}
        if self.weighted:
            kwargs = {"edge_weight_dict": {("paper", "cites", "paper"): batch["paper", "cites", "paper"].weight}}
        h = {k: v.relu() for k, v in self.c1(batch.x_dict, edges, **kwargs).items()}
        return self.out(self.c2(h, edges)[TARGET])


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("improved, weighted", [(False, False), (True, True)])
def test_gcn_normalised_relations_match_the_whole_graph(improved: bool, weighted: bool, world_size: int) -> None:
    data = generated_hetero()
    if weighted:
        e = data["paper", "cites", "paper"].edge_index.size(1)
        data["paper", "cites", "paper"].weight = torch.rand(e, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    torch.manual_seed(0)
    model = GCNRelations(improved, weighted).double()
    got = run_threaded_hetero(model, data, world_size, _forward, TARGET)
    assert_same(got, hetero_reference(model, data, _forward, TARGET), what=f"GCN relations at {world_size} ranks")
    if world_size > 1:
        aux = [sum(v for (layer, kind), v in r["meter"].items() if kind == "aux") for r in got["ranks"]]
        assert all(a > 0 for a in aux), "the halo papers' degrees travel"


def test_a_gcn_normalised_layer_between_two_types_is_refused_with_the_reason() -> None:
    model = _OneRelation(gnn.GCNConv(4, 3), ("author", "writes", "paper"), ["author", "paper"])
    _refused(model, "between two node types, but it normalises with the degrees of one node set")


class ClusterRelations(nn.Module):
    """ClusterGCNConv (it normalises in its forward, no flag to switch it off) on the citations, which repeat and
    loop, beside SAGE relations; the same on the next layer, whose paper rows could travel as partial sums."""

    def __init__(self) -> None:
        super().__init__()
        cites, writes = ("paper", "cites", "paper"), ("author", "writes", "paper")
        self.c1 = HeteroConv({cites: gnn.ClusterGCNConv(6, 8, diag_lambda=0.3), writes: gnn.SAGEConv((4, 6), 8)})
        self.c2 = HeteroConv({cites: gnn.ClusterGCNConv(8, 3)})

    def forward(self, batch):
        h = {k: v.relu() for k, v in self.c1(batch.x_dict, batch.edge_index_dict).items()}
        return self.c2(h, batch.edge_index_dict)[TARGET]


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_relation_layer_that_normalises_in_its_forward_runs_on_edge_index(dtype: torch.dtype, world_size: int) -> None:
    """Given the fused adjacency, PyG's ClusterGCNConv normalised the coalesced matrix: wrong logits in float32
    (repeated citations merged), and in float64 its float32 weights failed the sparse product."""
    data = generated_hetero()
    for t in ("paper", "author"):
        data[t].x = data[t].x.to(dtype)
    torch.manual_seed(0)
    model = ClusterRelations().to(dtype)
    ref = hetero_reference(model, data, _forward, TARGET)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {}
    for reduction in ("cover", "none"):
        got = run_threaded_hetero(model, data, world_size, _forward, TARGET, halo_reduction=reduction)
        assert_same(got, ref, what=f"ClusterGCNConv relations at {world_size} ranks, {reduction}", **tol)
    if world_size > 1:
        why = got["ranks"][0]["choices"]["c1.convs.<paper___cites___paper>"]
        assert "aggregation edge_index (it normalises its input in its forward" in why, why


class StepRelations(nn.Module):
    """Layers that propagate several times in one call on the relation within one type: TAGConv (normalised,
    K=3) beside SAGEConv, then APPNP (normalised with self-loops, fed an embedding of every local row) and
    GatedGraphConv (not normalised) in separate layers, optionally weighted."""

    def __init__(self, weighted: bool) -> None:
        super().__init__()
        self.weighted = weighted
        cites = ("paper", "cites", "paper")
        self.c1 = HeteroConv({cites: gnn.TAGConv(6, 8, K=3), ("author", "writes", "paper"): gnn.SAGEConv((4, 6), 8)},
                             aggr="sum")  # fmt: skip
        self.lin = Linear(8, 8)
        self.c2 = HeteroConv({cites: gnn.APPNP(K=3, alpha=0.2)}, aggr="sum")
        self.c3 = HeteroConv({cites: gnn.GatedGraphConv(8, num_layers=2)}, aggr="sum")
        self.emb = nn.Embedding(300, 8)
        self.out = Linear(16, 3)

    def forward(self, batch):
        edges = batch.edge_index_dict
        kwargs = {}
        if self.weighted:
            kwargs = {"edge_weight_dict": {("paper", "cites", "paper"): batch["paper", "cites", "paper"].weight}}
        h = self.c1(batch.x_dict, edges, **kwargs)["paper"].relu()
        ids = _ids(batch, "paper")  # every local row (inner and halo): the steps fetch their own halo anyway
        h = self.c2({"paper": self.lin(h)}, edges, **kwargs)["paper"]
        g = self.c3({"paper": self.emb(ids)}, edges, **kwargs)["paper"]
        n = h.size(0)
        return self.out(torch.cat([h, g[:n]], 1))


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("weighted", [False, True])
def test_multi_step_layers_on_a_relation_match_the_whole_graph(weighted: bool, world_size: int) -> None:
    data = generated_hetero()
    if weighted:
        e = data["paper", "cites", "paper"].edge_index.size(1)
        data["paper", "cites", "paper"].weight = torch.rand(e, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    torch.manual_seed(0)
    model = StepRelations(weighted).double()
    got = run_threaded_hetero(model, data, world_size, _forward, TARGET)
    assert_same(got, hetero_reference(model, data, _forward, TARGET), what=f"multi-step relations at {world_size} ranks")
    if world_size > 1:
        fetched = {layer for (layer, kind) in got["ranks"][0]["meter"] if kind == "fwd"}
        steps = {f"c2.convs.<paper___cites___paper>#{k}[paper]" for k in (1, 2, 3)}
        assert steps <= fetched, f"every propagation fetches its halo: {sorted(fetched)}"


def test_multi_step_relations_in_pipelined_and_periodic_epochs() -> None:
    """Each propagation is a slot of its own (``<layer>#<k>[paper]``): a pipelined epoch reads last epoch's rows of
    every step, and a periodic epoch after its refresh is exact again, as on homogeneous partitions."""
    data = generated_hetero()
    torch.manual_seed(0)
    model = StepRelations(False).double()
    sync = run_threaded_hetero(model, data, 2, _drifting, TARGET, steps=3)
    stale = run_threaded_hetero(model, data, 2, _drifting, TARGET, steps=3, mode=lambda e: ("sync", "pipelined", "sync")[e])
    slots = stale["ranks"][0]["slots"]
    assert slots == sync["ranks"][0]["slots"] and any("#3[paper]" in s for s in slots)
    assert not torch.allclose(stale["ranks"][0]["outs"][1], sync["ranks"][0]["outs"][1]), "the pipelined epoch is stale"
    torch.testing.assert_close(stale["ranks"][0]["outs"][2], sync["ranks"][0]["outs"][2], rtol=1e-10, atol=1e-12)


def test_a_multi_step_layer_that_cannot_switch_its_normalisation_off_is_refused() -> None:
    _refused(_OneRelation(gnn.SGConv(6, 3, K=2), ("paper", "cites", "paper"), ["paper"]), "without a flag to switch it off")


def test_a_multi_step_layer_between_two_types_is_refused() -> None:
    model = _OneRelation(gnn.TAGConv(4, 3, K=2), ("author", "writes", "paper"), ["author", "paper"])
    _refused(model, "propagates several times in one call.*which needs one node set")


def test_another_types_rows_are_refused_by_their_count() -> None:
    """Author rows handed to a relation whose sources are papers: the counts differ, the call is refused."""
    model = _OneRelation(gnn.SAGEConv((4, 6), 3), ("paper", "cites", "paper"), ["author", "paper"])
    _refused(model, "rows for node type 'paper'")


def test_a_relation_layer_with_reversed_flow_is_refused() -> None:
    model = _OneRelation(gnn.SAGEConv((4, 6), 3, flow="target_to_source"), ("author", "writes", "paper"), ["author", "paper"])
    _refused(model, "flow='target_to_source'")


def test_edges_that_are_no_edge_type_of_the_partition_are_refused() -> None:
    class Flipped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = gnn.SAGEConv(6, 3)

        def forward(self, batch):
            return self.conv(batch["paper"].x, batch["paper", "cites", "paper"].edge_index.flip(0))

    _refused(Flipped(), "none of the partition's edge types")


def test_han_with_a_coauthor_metapath_matches_the_whole_graph() -> None:
    """HAN as PyG's example builds it: a metapath edge type made before partitioning (T.AddMetaPaths), whose
    halos come from the partitioner like any other edge type's; three metapaths into paper."""
    data = _with_metapath(generated_hetero(seed=2))
    model = _model("han", data)
    got = run_threaded_hetero(model, data, 3, _forward, TARGET)
    assert_same(got, hetero_reference(model, data, _forward, TARGET), what="HAN with a metapath at 3 ranks")


def test_global_attention_is_refused_on_heterogeneous_models_too() -> None:
    from lightning_halo.layers.hooks import check_model

    gps = nn.ModuleDict({"paper": gnn.GPSConv(8, gnn.GINEConv(nn.Linear(8, 8)), heads=2)})
    with pytest.raises(UnsupportedLayerError, match="global attention reads every node"):
        check_model(gps)


def test_a_han_whose_forward_skips_pygs_semantic_attention_is_refused() -> None:
    """The global mean is made where PyG's HANConv computes it (han_conv.group); a HANConv (here a subclass)
    that averages elsewhere would be silently inexact, so the call is refused."""

    class OwnMean(HANConv):
        def forward(self, x_dict, edge_index_dict):
            h = {t: self.proj[t](x) for t, x in x_dict.items()}
            return {t: v - v.mean(0) for t, v in h.items()}

    class Net(nn.Module):
        def __init__(self, metadata) -> None:
            super().__init__()
            self.emb, self.conv = nn.Embedding(7, 6), OwnMean(-1, 3, metadata)

        def forward(self, batch):
            x = dict(batch.x_dict)
            x["venue"] = self.emb(_ids(batch, "venue"))
            return self.conv(x, batch.edge_index_dict)[TARGET]

    from lightning_halo import register_layer

    register_layer(OwnMean, "types", propagations=None)  # as a user would declare their subclass
    data = generated_hetero()
    model = Net(data.metadata()).double()
    with torch.no_grad():
        model(data)
    with pytest.raises(UnsupportedLayerError, match="computed its semantic attention 0 time"):
        run_threaded_hetero(model, data, 2, _forward, TARGET)


class NormedToHetero(nn.Module):
    """PyG's ``GraphSAGE`` with a norm between its layers, through ``to_hetero``: one norm per node type."""

    def __init__(self, metadata, norm: str) -> None:
        super().__init__()
        from torch_geometric.nn.models import GraphSAGE

        self.emb = nn.Embedding(7, 5)
        self.net = to_hetero(GraphSAGE((-1, -1), 8, 2, 3, norm=norm), metadata)

    def forward(self, batch):
        x = dict(batch.x_dict)
        x["venue"] = self.emb(_ids(batch, "venue"))
        return self.net(x, batch.edge_index_dict)[TARGET]


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("norm", ["batch_norm", "layer_norm", "graph_norm"])
def test_norms_on_each_type_use_the_statistics_of_every_ranks_rows_of_that_type(norm: str, world_size: int) -> None:
    """Batch norms (running statistics too) and graph norms of every node type, as single-process PyG computes them."""
    data = generated_hetero()
    torch.manual_seed(0)
    model = NormedToHetero(data.metadata(), norm).double()
    with torch.no_grad():
        _forward(model, data)  # lazy parameters take their shapes
    got = run_threaded_hetero(model, data, world_size, _forward, TARGET)
    ref = hetero_reference(model, data, _forward, TARGET)
    assert_same(without_zero_extras(got, ref), ref, what=f"to_hetero(GraphSAGE(norm={norm!r})) at {world_size} ranks")
    for rank in got["ranks"]:
        assert set(rank["buffers"]) == set(ref["buffers"])
        for k, b in ref["buffers"].items():
            torch.testing.assert_close(rank["buffers"][k], b, atol=1e-9, rtol=1e-7, msg=lambda m: f"buffer {k}: {m}")


def test_a_norm_on_a_types_inner_and_halo_rows_is_refused() -> None:
    from lightning_halo.partition.hetero import local_features

    class Normed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.norm = gnn.SAGEConv((4, 6), 3), nn.BatchNorm1d(6)

        def forward(self, batch):
            rows = local_features(batch["paper"])  # every local paper row, its halo too
            x = (batch["author"].x, self.norm(rows)[: batch["paper"].x.size(0)])
            return self.conv(x, batch["author", "writes", "paper"].edge_index)

    data = generated_hetero()
    with pytest.raises(UnsupportedLayerError, match="inner and halo nodes of type 'paper'"):
        run_threaded_hetero(Normed().double(), data, 2, _forward, TARGET)
