"""Link prediction on one edge type of a heterogeneous graph: RandomLinkSplit's split with its reverse edge type,
bipartite negatives, every pair scored once by the owner of its source, no held-out edge in message passing
(either direction), and the trained model equal to single-process PyG at 2 and 3 processes."""

from __future__ import annotations

import pytest
import torch
import torch_geometric.transforms as T

from lightning_halo import HaloLinkDataModule
from lightning_halo.partition.hetero import HeteroHaloPartition
from tests.support.hetero import generated_hetero
from tests.support.hetero_link import EDGE, REV, SPLIT, link_graph, reference, run_hetero_link_workers
from tests.support.trainer import FakeTrainer


def _cols(ei: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, ei.t().tolist()))


def _ranks(tmp_path, world: int, **options) -> list[HaloLinkDataModule]:
    out = []
    for r in range(world):
        dm = HaloLinkDataModule(link_graph(), edge_type=EDGE, rev_edge_type=REV, cache_dir=str(tmp_path / "cache"),
                                **{**SPLIT, **options})  # fmt: skip
        dm.trainer = FakeTrainer(world, r)  # type: ignore[assignment]
        dm.prepare_data()
        dm.setup("fit")
        dm.setup("test")
        out.append(dm)
    return out


def test_split_equals_random_link_split_with_its_reverse_type() -> None:
    data = link_graph()
    dm = HaloLinkDataModule(data, edge_type=EDGE, rev_edge_type=REV, **SPLIT)
    torch.manual_seed(SPLIT["seed"])
    train, val, test = T.RandomLinkSplit(SPLIT["num_val"], SPLIT["num_test"], is_undirected=True, edge_types=EDGE,
                                         rev_edge_types=REV, add_negative_train_samples=False)(data)  # fmt: skip
    s = dm.split
    assert not s.undirected, "two node types: split as directed, the reverse in its own type"
    assert torch.equal(s.edge_index, train[EDGE].edge_index) and torch.equal(s.test_edge_index, test[EDGE].edge_index)
    assert torch.equal(s.val_pos, val[EDGE].edge_label_index[:, val[EDGE].edge_label == 1])
    assert torch.equal(s.test_pos, test[EDGE].edge_label_index[:, test[EDGE].edge_label == 1])
    graph = dm._stage_graph("train")  # what training's partitions are cut from
    assert torch.equal(graph[REV].edge_index, train[REV].edge_index), "the reverse type rebuilt from the split"
    assert torch.equal(dm._stage_graph("test")[REV].edge_index, test[REV].edge_index)
    assert graph["paper", "cites", "paper"].edge_index is data["paper", "cites", "paper"].edge_index, "others stay"
    n_author, n_paper = data["author"].num_nodes, data["paper"].num_nodes
    # held-out negatives avoid every edge of the type; training's those that pass messages (as PyG's example)
    for neg, avoided in ((s.val_neg, data[EDGE].edge_index), (s.test_neg, data[EDGE].edge_index), (dm.negatives(0), s.edge_index)):
        assert neg.size(1) and int(neg[0].max()) < n_author and int(neg[1].max()) < n_paper
        assert not _cols(neg) & _cols(avoided)
    assert int(dm.negatives(1)[0].max()) >= n_paper // 2, "sources drawn from the whole author type"
    assert dm.num_features == {"paper": 6, "author": 4, "venue": 0}


@pytest.mark.parametrize("world", [2, 3])
def test_every_pair_once_by_the_owner_of_its_source(tmp_path, world) -> None:
    ranks = _ranks(tmp_path, world)
    split = ranks[0].split
    for stage, epoch in (("train", 0), ("train", 2), ("val", 0), ("test", 0)):
        got: list = []
        for r, dm in enumerate(ranks):
            dm.trainer.current_epoch = epoch  # type: ignore[union-attr]
            batch = dm.batch(stage)
            assert isinstance(batch, HeteroHaloPartition)
            index, label = batch[EDGE].edge_label_index, batch[EDGE].edge_label
            authors = batch["author"].n_id[: batch["author"].n_inner]
            assert bool(torch.isin(index[0], authors).all()), f"rank {r} scores a pair whose author it does not own"
            assert index.size(1) == label.numel() and "edge_label_index" not in dm._partition_of(stage)[0][EDGE]
            got += list(map(tuple, torch.cat([index, label.view(1, -1).long()]).t().tolist()))
        want_index, want_label = (
            (torch.cat([split.train_pos, ranks[0].negatives(epoch)], 1), None) if stage == "train" else split.labelled(stage)
        )
        assert len(got) == want_index.size(1) and {g[:2] for g in got} == _cols(want_index), stage
        if want_label is not None:
            assert sorted(got) == sorted(map(tuple, torch.cat([want_index, want_label.view(1, -1).long()]).t().tolist()))
    held = _cols(split.val_pos) | _cols(split.test_pos)
    for dm in ranks:  # no held-out edge passes messages in training, in either direction
        part = dm._partition_of("train")[0]
        for edge_type, flip in ((EDGE, False), (REV, True)):
            ei = part[edge_type].edge_index
            src, dst = part[edge_type[0]].n_id[ei[0]], part[edge_type[2]].n_id[ei[1]]
            edges = _cols(torch.stack([dst, src]) if flip else torch.stack([src, dst]))
            assert not edges & held, edge_type


def test_stage_views_share_the_partition(tmp_path) -> None:
    (dm,) = _ranks(tmp_path, 1)
    part = dm._partition_of("train")[0]
    view = dm.batch("train")
    assert view is not part and view.shares_structure(part) and view["paper"].x is part["paper"].x
    assert not view.shares_structure(dm._partition_of("test")[0]), "the test stage is another partitioning"
    from lightning_halo.exchange import HaloExchanger

    ex = HaloExchanger(None, bits=32)
    assert ex.bind(part) and not ex.bind(view) and ex.part is view, "a stage's view keeps the bound plans"
    assert ex.bind(dm._partition_of("test")[0]), "another partitioning is bound afresh"


def test_bad_arguments_name_the_type() -> None:
    data = link_graph()
    with pytest.raises(ValueError, match="needs the edge type.*'author', 'writes', 'paper'"):
        HaloLinkDataModule(data)
    with pytest.raises(ValueError, match="not an edge type of the graph"):
        HaloLinkDataModule(data, edge_type=("author", "reads", "paper"))
    with pytest.raises(ValueError, match="does not run from 'paper' to 'author'"):
        HaloLinkDataModule(data, edge_type=EDGE, rev_edge_type=("paper", "cites", "paper"))
    with pytest.raises(ValueError, match="without edge_type"):
        HaloLinkDataModule(data, rev_edge_type=REV)
    from lightning_halo.data.datasets import load_bundled

    with pytest.raises(ValueError, match="is for heterogeneous graphs"):
        HaloLinkDataModule(load_bundled("cora"), edge_type=EDGE)
    with pytest.raises(ValueError, match="undirected=True.*another edge type"):
        _ = HaloLinkDataModule(data, edge_type=EDGE, undirected=True).split
    within = generated_hetero()  # cites: one node type, both ends papers; a distinct reverse type is directed
    within["paper", "cited_by", "paper"].edge_index = within["paper", "cites", "paper"].edge_index.flip(0)
    dm = HaloLinkDataModule(within, edge_type=("paper", "cites", "paper"), rev_edge_type=("paper", "cited_by", "paper"))
    assert not dm.split.undirected and not (dm.split.val_neg[0] == dm.split.val_neg[1]).any(), "no self-loop negatives"


def test_a_heterogeneous_file_without_edge_type_is_refused(tmp_path) -> None:
    path = tmp_path / "g.pt"
    torch.save(link_graph(), path)
    dm = HaloLinkDataModule(str(path))
    with pytest.raises(ValueError, match="heterogeneous graph: pass HaloLinkDataModule\\(edge_type"):
        _ = dm.split
    dm = HaloLinkDataModule(str(path), edge_type=EDGE, rev_edge_type=REV, **SPLIT)
    assert torch.equal(dm.split.val_pos, HaloLinkDataModule(link_graph(), edge_type=EDGE, **SPLIT).split.val_pos)


EPOCHS = 3


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size,kind", [(2, "plain"), (3, "plain"), (2, "zoo"), (3, "zoo")])
def test_hetero_link_prediction_equals_single_process_pyg(world_size: int, kind: str, tmp_path) -> None:
    """float64, bits=32: parameters after 3 Adam steps and the validation / test ROC-AUC (each pair once), for plain
    PyG code (HeteroConv of SAGEConv, a featureless type embedded by n_id) and the zoo's HeteroLinkPredictor (GATConv,
    MLP decoder), whose predictions are the test pairs once each."""
    recs = run_hetero_link_workers(world_size, tmp_path, EPOCHS, kind)
    ref = reference(EPOCHS, kind)
    for r, rec in enumerate(recs):
        for k, want in ref["params"].items():
            err = float((rec["params"][k] - want).abs().max() / want.abs().max())
            assert err <= 1e-10, f"rank {r}: {k} differs from single-process PyG by {err:.2e}"
        for stage in ("val", "test"):
            assert rec[f"{stage}_auroc"] == pytest.approx(ref[f"{stage}_auroc"], abs=1e-9), f"rank {r} {stage}"
    for stage in ("val", "test"):
        assert sum(rec["pairs"][stage].size(1) for rec in recs) == ref["split"].labelled(stage)[0].size(1)
    if kind == "zoo":
        pairs = torch.cat([rec["predicted"][0] for rec in recs], 1)
        assert _cols(pairs) == _cols(ref["split"].labelled("test")[0]) and pairs.size(1) == len(_cols(pairs))
    meter = recs[0]["meter_total"]
    assert meter[("gather_rows", "fwd")] > 0 and meter[("gather_rows", "bwd")] > 0, "pairs cross ranks"
