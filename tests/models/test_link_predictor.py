"""LinkPredictor: options checked, decoders, and a single-process fit (gather_rows is z[ids] there)."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_halo.data.link_datamodule import HaloLinkDataModule
from lightning_halo.models import LinkPredictor


def test_options_are_checked_and_decoders_score_pairs() -> None:
    with pytest.raises(ValueError, match="encoder must be"):
        LinkPredictor(4, encoder="gat")  # type: ignore[arg-type]
    z_u, z_v = torch.randn(5, 8), torch.randn(5, 8)
    dot = LinkPredictor(4, out_channels=8)
    torch.testing.assert_close(dot.decode(z_u, z_v), (z_u * z_v).sum(-1))
    assert LinkPredictor(4, out_channels=8, decoder="mlp").decode(z_u, z_v).shape == (5,)


def test_single_process_fit_learns(tmp_path) -> None:
    torch.manual_seed(0)
    dm = HaloLinkDataModule("cora", cache_dir=str(tmp_path))
    model = LinkPredictor(dm.num_features, hidden_channels=32, out_channels=32)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=30, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(model, datamodule=dm)
    got = trainer.test(model, datamodule=dm, verbose=False)[0]
    assert got["test_auroc"] > 0.75 and 0 < got["test_hits@50"] <= 1


def test_hetero_link_predictor_options_and_relations() -> None:
    from lightning_halo.models import HeteroLinkPredictor

    meta = (["paper", "author", "venue"], [("author", "writes", "paper"), ("paper", "rev_writes", "author"),
                                           ("paper", "in", "venue")])  # fmt: skip
    sizes = ({"paper": 8, "author": 0, "venue": 0}, {"paper": 10, "author": 5, "venue": 2})
    model = HeteroLinkPredictor(meta, *sizes, ("author", "writes", "paper"), hidden_channels=8)
    used = {e for conv in model.convs for e in conv.convs.keys()}
    assert all("venue" not in e for e in used), "a relation reaching neither end type has no weights (DDP)"
    assert sorted(model.inputs) == ["author", "paper"] and isinstance(model.inputs["author"], torch.nn.Embedding)
    with pytest.raises(ValueError, match="together"):
        HeteroLinkPredictor(meta, *sizes)
    with pytest.raises(ValueError, match="not an edge type"):
        HeteroLinkPredictor(meta, *sizes, ("venue", "hosts", "paper"))
    with pytest.raises(ValueError, match="decoder"):
        HeteroLinkPredictor(decoder="cosine")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="conv must be"):
        HeteroLinkPredictor(conv="gcn")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="norm must be"):
        HeteroLinkPredictor(norm="graph")  # type: ignore[arg-type]
    normed = HeteroLinkPredictor(meta, *sizes, ("author", "writes", "paper"), hidden_channels=8, norm="layer")
    assert len(model.norms) == 0 and [sorted(n) for n in normed.norms] == [["author", "paper"]] * 2  # both ends


def test_hetero_link_predictor_learns_on_one_process(tmp_path) -> None:
    """Built from the data module at configure_model (a CLI config), fit on the whole graph: the pairs' scores move."""
    from lightning_halo.models import HeteroLinkPredictor
    from tests.support.hetero_link import EDGE, REV, link_graph

    torch.manual_seed(0)
    graph = link_graph()
    for t in ("paper", "author"):
        graph[t].x = graph[t].x.float()
    dm = HaloLinkDataModule(graph, edge_type=EDGE, rev_edge_type=REV, cache_dir=str(tmp_path))
    model = HeteroLinkPredictor(hidden_channels=8, decoder="mlp", lr=0.02)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=15, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(model, datamodule=dm)
    assert model.hparams.edge_type == EDGE and model.edge_type == EDGE
    losses = trainer.callback_metrics
    assert float(losses["train_loss"]) < 0.69, "below the untrained 0.69 (log 2) on the training pairs"
