"""Partitioning heterogeneous graphs: every node of every type owned once, halos complete and minimal,
exchange plans that agree, the labelled type balanced, and bad graphs refused naming the type."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import HeteroData

from lightning_halo.partition.hetero import (
    HeteroAssignment,
    HeteroGraphError,
    assign_hetero_parts,
    balance_type,
    build_hetero_partitions,
    hetero_layout,
    homogeneous_edges,
    local_features,
    plan_hetero_parts,
    type_counts,
)
from tests.support.hetero import dblp, generated_hetero


def _check_plans(data: HeteroData, assignment: HeteroAssignment) -> None:
    """The partition's invariants, checked against the global graph by brute force."""
    plans = plan_hetero_parts(data, assignment)
    layout = assignment.layout
    P = assignment.num_parts
    assert len(plans) == P
    for t in layout.node_types:
        owner = assignment.parts[t]
        inner = torch.cat([pl.types[t].n_id[: pl.types[t].n_inner] for pl in plans])
        assert torch.equal(inner.sort().values, torch.arange(layout.num_nodes[t])), f"{t}: every node owned once"
        for pl in plans:
            tp = pl.types[t]
            mine = tp.n_id[: tp.n_inner]
            assert bool((owner[mine] == pl.part).all()) and bool((mine[1:] > mine[:-1]).all())
            halo = tp.n_id[tp.n_inner :]
            assert bool((owner[halo] != pl.part).all()), f"{t}: a halo node is owned elsewhere"
            assert tp.recv_counts == torch.bincount(owner[halo], minlength=P).tolist()
            assert bool((owner[halo][1:] >= owner[halo][:-1]).all()), f"{t}: the halo is grouped by owner"
    for e in layout.edge_types:
        src_t, _, dst_t = e
        ei = data[e].edge_index
        kept = torch.cat([pl.edge_ids[e] for pl in plans])
        assert torch.equal(kept.sort().values, torch.arange(ei.size(1))), f"{e}: every edge kept once"
        for pl in plans:
            ids, local = pl.edge_ids[e], pl.edge_index[e]
            src_space, dst_space = pl.types[src_t], pl.types[dst_t]
            assert bool((assignment.parts[dst_t][ei[1, ids]] == pl.part).all()), f"{e}: kept where its target is owned"
            assert torch.equal(src_space.n_id[local[0]], ei[0, ids]), f"{e}: local sources map back"
            assert bool((local[1] < dst_space.n_inner).all()) and torch.equal(dst_space.n_id[local[1]], ei[1, ids])
    for t in layout.node_types:  # minimal halos: exactly the remote sources of the kept edges, per type
        for pl in plans:
            needed = set()
            for e in layout.edge_types:
                if e[0] == t:
                    srcs = data[e].edge_index[0, pl.edge_ids[e]]
                    needed |= set(srcs[assignment.parts[t][srcs] != pl.part].tolist())
            assert set(pl.types[t].n_id[pl.types[t].n_inner :].tolist()) == needed, f"{t}: halo of part {pl.part}"
    for t in layout.node_types:  # what p sends q is q's halo rows owned by p, in q's order
        for p in plans:
            starts = torch.cumsum(torch.tensor([0, *p.types[t].send_counts]), 0)
            for q in plans:
                sent = p.types[t].n_id[p.types[t].send_index[starts[q.part] : starts[q.part + 1]]]
                qt = q.types[t]
                halo = qt.n_id[qt.n_inner :]
                expected = halo[assignment.parts[t][halo] == p.part] if q.part != p.part else halo[:0]
                assert torch.equal(sent, expected), (t, p.part, q.part)
                assert p.types[t].send_counts[q.part] == q.types[t].recv_counts[p.part]


@pytest.mark.parametrize("num_parts", [1, 2, 3, 4])
@pytest.mark.parametrize("partitioner", ["metis", "kaminpar", "random"])
def test_every_node_owned_once_halos_complete_plans_agree(num_parts: int, partitioner: str) -> None:
    data = generated_hetero()
    assignment = assign_hetero_parts(data, num_parts, partitioner=partitioner)
    assert assignment.balanced_type == "paper"
    _check_plans(data, assignment)


@pytest.mark.parametrize("partitioner", ["metis", "kaminpar"])
def test_the_labelled_type_is_balanced_within_the_tolerance(partitioner: str) -> None:
    data = generated_hetero(papers=400, authors=900)  # most nodes are not papers: a node balance alone skews papers
    for parts in (2, 3, 4):
        for tolerance in (0.0, 0.05):
            a = assign_hetero_parts(data, parts, partitioner=partitioner, tolerance=tolerance)
            counts = torch.bincount(a.parts["paper"], minlength=parts)
            assert int(counts.max()) <= -(-int(400 * (1 + tolerance)) // parts), (parts, tolerance, counts.tolist())
            _check_plans(data, a)


def test_balance_moves_only_what_it_must_and_keeps_neighbours_together() -> None:
    # two triangles of members, all in part 0; part 1 holds one non-member joined to the second triangle
    edges = torch.tensor([[0, 1, 2, 3, 4, 5, 5], [1, 2, 0, 4, 5, 3, 6]])
    parts = torch.tensor([0, 0, 0, 0, 0, 0, 1])
    members = torch.tensor([True] * 6 + [False])
    out = balance_type(parts, members, 2, edges, tolerance=0.0)
    assert out.tolist() == [0, 0, 0, 1, 1, 1, 1], "the triangle next to part 1 moves, whole"
    assert torch.equal(parts, torch.tensor([0, 0, 0, 0, 0, 0, 1])), "the input is not modified"
    assert torch.equal(balance_type(out, members, 2, edges), out), "balanced: nothing moves"
    assert torch.equal(balance_type(parts, ~members, 2, edges, 0.0), parts)  # one non-member: cap 1, already met


def test_the_homogeneous_view_lays_the_types_end_to_end() -> None:
    data = generated_hetero(papers=10, authors=5, venues=3)
    layout = hetero_layout(data)
    assert layout.offsets == {"paper": 0, "author": 10, "venue": 15} and layout.total_nodes == 18
    assert layout.labelled == ("paper",)
    assert layout.node_type_of().tolist() == [0] * 10 + [1] * 5 + [2] * 3
    edges = homogeneous_edges(data, layout)
    writes = data["author", "writes", "paper"].edge_index
    n_cites = data["paper", "cites", "paper"].edge_index.size(1)
    assert torch.equal(edges[:, n_cites : n_cites + writes.size(1)], torch.stack([writes[0] + 10, writes[1]]))


def test_partition_table_counts_per_type() -> None:
    data = generated_hetero()
    plans = plan_hetero_parts(data, assign_hetero_parts(data, 2))
    table = type_counts(plans)
    assert sum(row["paper"]["inner"] for row in table) == 300 and sum(row["venue"]["inner"] for row in table) == 7
    assert sum(row["paper__cites__paper"]["edges"] for row in table) == data["paper", "cites", "paper"].edge_index.size(1)
    assert all(row["author"]["halo"] == pl.types["author"].n_halo for row, pl in zip(table, plans))


def _graph(**changes) -> HeteroData:
    data = generated_hetero(papers=20, authors=10, venues=3)
    for path, value in changes.items():
        *store, key = path.split(".")
        target = data[tuple(store)] if len(store) > 1 else data[store[0]]
        if value is None:
            del target[key]
        else:
            target[key] = value
    return data


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda: _graph(**{"venue.num_nodes": None}), "node type 'venue' has neither x nor num_nodes"),
        (lambda: _graph(**{"paper.y": None}), "no node type has labels y"),
        (lambda: _graph(**{"paper.y": torch.zeros(5, dtype=torch.long)}), "node type 'paper': y has 5 rows"),
        (lambda: _graph(**{"author.num_nodes": 11}), "node type 'author': num_nodes is 11 but x has 10 rows"),
        (lambda: _graph(**{"author.writes.paper.edge_index": torch.tensor([[10], [0]])}),
         "edge type ('author', 'writes', 'paper'): source ids run from 10 to 10, but node type 'author' has 10 nodes"),
        (lambda: _graph(**{"paper.in.venue.edge_index": torch.tensor([[0], [-1]])}),
         "edge type ('paper', 'in', 'venue'): target ids run from -1 to -1"),
        (lambda: _graph(**{"paper.in.venue.edge_index": torch.tensor([0.0, 1.0])}), "edge_index must be [2, E]"),
        (lambda: _graph(**{"author.cites.journal.edge_index": torch.tensor([[0], [0]])}),
         "edge type ('author', 'cites', 'journal') names the target node type 'journal', which the graph does not have"),
    ],
)  # fmt: skip
def test_bad_graphs_are_refused_naming_the_type(build, says: str) -> None:
    data = build()
    with pytest.raises(HeteroGraphError) as err:
        assign_hetero_parts(data, 2)
    assert says in str(err.value), str(err.value)


def test_a_type_to_balance_that_the_graph_lacks_is_refused() -> None:
    with pytest.raises(HeteroGraphError, match="balance_type_of='journal' is not a node type"):
        assign_hetero_parts(generated_hetero(), 2, balance_type_of="journal")


def test_dblp_partitions_with_authors_balanced() -> None:
    data = dblp()
    if data is None:
        pytest.skip("../shared/datasets/heco is not on this machine (set LIGHTNING_HALO_SHARED)")
    for parts in (2, 3):
        a = assign_hetero_parts(data, parts)
        counts = torch.bincount(a.parts["author"], minlength=parts)
        assert int(counts.max()) <= -(-int(4057 * 1.05) // parts), counts.tolist()
        _check_plans(data, a)


def test_a_part_reads_like_a_hetero_data_with_n_id_per_type() -> None:
    from lightning_halo.partition.hetero import build_hetero_partitions

    data = generated_hetero()
    data["author", "writes", "paper"].edge_weight = torch.rand(data["author", "writes", "paper"].edge_index.size(1))
    data.note = "kept"
    assignment = assign_hetero_parts(data, 3)
    emb = torch.nn.Embedding(7, 4)  # the featureless type's learned rows
    for part in build_hetero_partitions(data, assignment):
        assert set(part.node_types) == set(data.node_types) and set(part.edge_types) == set(data.edge_types)
        assert part.note == "kept" and part.num_parts == 3
        for t in data.node_types:
            store, n_in = part[t], part[t].n_inner
            assert store.num_nodes == store.n_id.numel()
            assert bool((assignment.parts[t][store.n_id[:n_in]] == part.part_id).all())
            if "x" in data[t]:
                rows = torch.cat([store.x, store.halo_x])
                assert torch.equal(rows, data[t].x[store.n_id]) and store.x.size(0) == n_in
                assert store.halo_x.data_ptr() == store.x.data_ptr() + n_in * store.x.stride(0) * store.x.element_size()
        assert torch.equal(emb(part["venue"].n_id), emb.weight[part["venue"].n_id])
        n_in = part["paper"].n_inner
        for key in ("y", "train_mask", "val_mask", "test_mask"):
            assert torch.equal(part["paper"][key], data["paper"][key][part["paper"].n_id[:n_in]])
        e = ("author", "writes", "paper")
        assert torch.equal(part[e].edge_weight, data[e].edge_weight[part[e].e_id])
        assert set(part.x_dict) == {"paper", "author"} and set(part.edge_index_dict) == set(data.edge_types)
        for (src, _, dst), ei in part.edge_index_dict.items():
            if ei.numel():  # a part owning no venue keeps no paper->venue edge
                assert int(ei[0].max()) < part[src].num_nodes and int(ei[1].max()) < part[dst].n_inner


def test_metis_balances_the_labelled_type_itself() -> None:
    # most nodes are not papers: METIS' second constraint spreads the papers, so the post-pass moves none
    data = generated_hetero(papers=400, authors=900)
    for parts in (2, 3, 4):
        a = assign_hetero_parts(data, parts, tolerance=0.05)
        assert a.details["constraints"] == 2 and a.moved == 0, (parts, a.details, a.moved)
        counts = torch.bincount(a.parts["paper"], minlength=parts)
        assert int(counts.max()) <= 1.03 * 400 / parts + 1, counts.tolist()


def test_local_features_are_the_stacked_rows_only_while_x_is_as_partitioned() -> None:
    data = generated_hetero()
    part = build_hetero_partitions(data, assign_hetero_parts(data, 2))[0]
    store = part["author"]
    n, n_all = int(store.n_inner), int(store.num_nodes)
    whole = local_features(store)
    assert whole.size(0) == n_all and whole.data_ptr() == store.x.data_ptr()  # one tensor, no copy
    moved = part.apply(lambda t: t.clone())  # as .to("cuda") moves it: still one tensor, still as partitioned
    assert local_features(moved["author"]).size(0) == n_all
    assert moved.to("cpu")["author"].x is moved["author"].x  # no move: the very objects
    kept = store.x
    store.x = kept * 2  # replaced: the stored halo rows are not this tensor's
    assert local_features(store) is store.x
    store.x = kept
    assert local_features(store).size(0) == n_all
    kept.mul_(2)  # changed in place: neither
    assert local_features(store) is kept
    kept.div_(2)  # the values as partitioned again: the stored halo rows are its own again
    assert local_features(store).size(0) == n_all
