"""The model zoo: plain PyG node classifiers that train on one process and log global metrics."""

from __future__ import annotations

import inspect

import lightning as L
import pytest
import torch

from lightning_halo import HaloDataModule
from lightning_halo.models import GAT, GCN, GIN, GraphSAGE, NodeClassifier
from tests.support.graphs import awkward_graph


@pytest.mark.parametrize("cls", [GCN, GraphSAGE, GAT, GIN])
@pytest.mark.parametrize("norm", [None, "layer", "batch"])
def test_models_train_and_log(cls, norm, tmp_path) -> None:
    L.seed_everything(0)
    data = awkward_graph(1, dtype=torch.float32)
    dm = HaloDataModule(data, cache_dir=str(tmp_path))
    model = cls(in_channels=dm.num_features, out_channels=dm.num_classes, hidden_channels=16, norm=norm)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(model, datamodule=dm)
    assert torch.isfinite(trainer.callback_metrics["train_loss"])
    val = trainer.validate(model, datamodule=dm, verbose=False)[0]["val_acc"]
    test = trainer.test(model, datamodule=dm, verbose=False)[0]["test_acc"]
    logits = dm.gather_predictions(trainer.predict(model, datamodule=dm))
    assert logits.shape == (dm.num_nodes, dm.num_classes) == (data.num_nodes, data.y.max() + 1)
    model.eval()
    torch.testing.assert_close(logits, model(data.x, data.edge_index).detach(), rtol=1e-5, atol=1e-6)
    pred = logits.argmax(1)
    # the logged metrics are the micro accuracies of the model's own predictions (norm="batch": eval mode in both)
    for mask, logged in ((data.val_mask, val), (data.test_mask, test)):
        assert abs(float((pred[mask] == data.y[mask]).float().mean()) - logged) < 1e-6


def test_binary_task_logs_auroc(tmp_path) -> None:
    data = awkward_graph(1, num_classes=2, dtype=torch.float32)
    dm = HaloDataModule(data, cache_dir=str(tmp_path))
    model = GCN(in_channels=dm.num_features, out_channels=2, hidden_channels=8)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(model, datamodule=dm)
    assert "val_auroc" in trainer.callback_metrics


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="number of classes"):
        GCN(in_channels=4, out_channels=1)
    with pytest.raises(ValueError, match="norm"):
        GCN(in_channels=4, out_channels=3, norm="group")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="divisible by heads"):
        GAT(in_channels=4, out_channels=3, hidden_channels=10, heads=4)
    with pytest.raises(NotImplementedError, match="pyg_model"):
        NodeClassifier(in_channels=4, out_channels=3)


@pytest.mark.parametrize("cls", [GraphSAGE, GIN, GCN])
def test_sparse_adjacency_trains_to_the_same_parameters(cls, tmp_path) -> None:
    """sparse=True (fused spmm on a cached adjacency) is the same model as the edge-list path."""
    data = awkward_graph(1, dtype=torch.float64)  # repeated edges and self-loops
    if cls is GCN:  # PyG adds self-loops differently for the two inputs; compare on a loop-free graph
        data.edge_index = data.edge_index[:, data.edge_index[0] != data.edge_index[1]]
    params = []
    for sparse in (False, True):
        L.seed_everything(0)
        dm = HaloDataModule(data, cache_dir=str(tmp_path / str(sparse)))
        model = cls(in_channels=dm.num_features, out_channels=dm.num_classes, hidden_channels=16, sparse=sparse).double()
        trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=3, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
        trainer.fit(model, datamodule=dm)
        params.append(dict(model.named_parameters()))
    for name, p in params[0].items():
        torch.testing.assert_close(params[1][name], p, atol=1e-10, rtol=1e-10, msg=lambda m, name=name: f"{name}: {m}")


def test_sparse_adjacency_is_cached_until_edges_change() -> None:
    data = awkward_graph(1, dtype=torch.float32)
    model = GraphSAGE(in_channels=data.num_features, out_channels=3, sparse=True)
    adj = model.adjacency(data)
    assert adj.layout == torch.sparse_csr and model.adjacency(data) is adj
    # SAGE aggregates with mean: each row of values sums to its count of distinct in-neighbours
    distinct = torch.bincount(torch.unique(data.edge_index.t(), dim=0)[:, 1], minlength=data.num_nodes).float()
    torch.testing.assert_close(adj.to_dense().sum(1), distinct)
    data.edge_index[0, 0] = (int(data.edge_index[0, 0]) + 1) % data.num_nodes  # in-place edit: rebuilt
    assert model.adjacency(data) is not adj
    assert GraphSAGE(in_channels=4, out_channels=3).adjacency(data) is data.edge_index  # default: the edge list
    assert "sparse" not in inspect.signature(GAT).parameters  # attention needs per-edge coefficients anyway


def test_sparse_adjacency_refuses_16_bit_precision(tmp_path) -> None:
    dm = HaloDataModule(awkward_graph(1, dtype=torch.float32), cache_dir=str(tmp_path))
    model = GraphSAGE(in_channels=dm.num_features, out_channels=dm.num_classes, sparse=True)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, precision="bf16-mixed")  # fmt: skip
    with pytest.raises(ValueError, match="sparse=True cannot run with precision='bf16-mixed'"):
        trainer.fit(model, datamodule=dm)
