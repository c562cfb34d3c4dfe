"""Strategy options and traps: registered names say what they do, bad models fail before partitioning."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import EGConv, GCNConv, LayerNorm

from lightning_halo import HaloDataModule, HaloQuantStrategy, UnsupportedLayerError, global_mean
from lightning_halo.loss import check_scale_loss
from tests.support.graphs import awkward_graph


class _Module(L.LightningModule):
    def __init__(self, conv, norm=None) -> None:
        super().__init__()
        self.conv, self.norm = conv, norm

    def training_step(self, batch, _):
        h = self.conv(batch.x, batch.edge_index)
        if self.norm is not None:
            h = self.norm(h)
        return F.cross_entropy(h[batch.train_mask], batch.y[batch.train_mask])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(**kw) -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, **kw)  # fmt: skip


def test_registered_names_say_whether_they_are_exact() -> None:
    from lightning.pytorch.strategies import StrategyRegistry

    import lightning_halo  # noqa: F401  # registers on import

    bits = {name: StrategyRegistry[name]["init_params"]["bits"] for name in
            ("halo_exact", "halo_1bit", "halo_8bit", "halo_quant", "halo_quant_spawn")}  # fmt: skip
    assert bits == {"halo_exact": 32, "halo_1bit": 1, "halo_8bit": 8, "halo_quant": 1, "halo_quant_spawn": 1}
    assert "equals single-process training" in StrategyRegistry["halo_exact"]["description"]
    assert "lossy" in StrategyRegistry["halo_quant"]["description"]
    assert StrategyRegistry["halo_quant_spawn"]["init_params"]["start_method"] == "spawn"


@pytest.mark.parametrize(
    "kwargs, name",
    [(dict(bits=3), "bits=3"), (dict(bits=True), "bits=True"), (dict(grad_bits=5), "grad_bits=5"),
     (dict(eval_bits=2.0), "eval_bits=2.0"), (dict(bits="1"), "bits='1'")],  # fmt: skip
)
def test_bit_widths_are_checked_once_and_name_the_argument(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name} is not supported; choose one of \(1, 2, 4, 8, 16, 32\)"):
        HaloQuantStrategy(**kwargs)


def test_unsupported_model_is_refused_before_anything_is_partitioned(tmp_path) -> None:
    data = awkward_graph(1, dtype=torch.float32)
    dm = HaloDataModule(data, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(UnsupportedLayerError, match="EGConv cannot run on graph partitions"):
        _trainer(strategy=HaloQuantStrategy(bits=32)).fit(_Module(EGConv(8, 3, num_heads=1, num_bases=1)), datamodule=dm)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir()), "METIS ran for nothing"


def test_a_graph_norm_that_is_not_made_global_is_refused_at_more_than_one_process() -> None:
    from torch_geometric.nn import HeteroBatchNorm

    class TwoRanks(HaloQuantStrategy):
        world_size = 2  # what the refusal depends on; no processes needed

    with pytest.raises(UnsupportedLayerError, match=r"norm \(torch_geometric HeteroBatchNorm\): its per-type batch"):
        TwoRanks(bits=32)._refuse_graph_norms(_Module(GCNConv(8, 3), HeteroBatchNorm(3, num_types=2)))
    TwoRanks(bits=32)._refuse_graph_norms(_Module(GCNConv(8, 3), LayerNorm(3, mode="graph")))  # made global
    HaloQuantStrategy(bits=32)._refuse_graph_norms(_Module(GCNConv(8, 3), HeteroBatchNorm(3, num_types=2)))  # one process


def test_scale_loss_options() -> None:
    assert [check_scale_loss(v) for v in (True, False, "share")] == ["train_mean", "none", "share"]
    with pytest.raises(ValueError, match="'train_mean'.*'share'.*'none'"):
        HaloQuantStrategy(scale_loss="mean")
    with pytest.raises(ValueError, match="aggregation"):
        HaloQuantStrategy(aggregation="fused")
    with pytest.raises(ValueError, match="num_threads"):
        HaloQuantStrategy(num_threads=0)


def test_global_mean_on_one_process() -> None:
    v = torch.tensor([1.0, 2.0, 4.0], requires_grad=True)
    m = torch.tensor([True, False, True])
    assert float(global_mean(v, m)) == 2.5
    assert float(global_mean(v, m, weight=torch.tensor([3.0, 9.0, 1.0]))) == pytest.approx((3 + 4) / 4)
    assert float(global_mean(v, torch.zeros(3, dtype=torch.bool))) == 0.0  # nothing selected: zero, still a graph
    global_mean(v, m).backward()
    assert v.grad.tolist() == [0.5, 0.0, 0.5]
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        global_mean(v, torch.tensor([1, 0, 1]))


def test_batch_size_idiom_gets_a_pointer_to_the_masks() -> None:
    from lightning_halo import build_halo_partitions, partition_graph

    data = awkward_graph(2)
    part = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, 2))[0]
    with pytest.raises(AttributeError, match="not a NeighborLoader mini-batch.*train_mask"):
        part.batch_size  # noqa: B018


def test_layers_built_in_configure_model_are_hooked(tmp_path) -> None:
    class Lazy(_Module):
        def __init__(self) -> None:
            super().__init__(None)

        def configure_model(self) -> None:
            if self.conv is None:
                self.conv = GCNConv(8, 3)

    data = awkward_graph(1, dtype=torch.float32)
    trainer = _trainer(strategy=HaloQuantStrategy(bits=32))
    trainer.fit(Lazy(), datamodule=HaloDataModule(data, cache_dir=str(tmp_path)))
    assert "fused sparse" in trainer.strategy.layer_choices["conv"]


@pytest.mark.multiprocess
def test_ddp_communication_hooks_run_on_gloo(tmp_path) -> None:
    """A DDP communication hook is registered on CPU/gloo too: an exact one keeps parity and is
    called every step; fp16 compression changes the parameters a little, as it should."""
    from tests.support.parity import assert_parity, load_records, run_parity

    config = "gcn:2:cora"
    run_parity([config], 2, tmp_path / "count", extra=["--comm-hook", "count"])
    exact = assert_parity(config, 2, tmp_path / "count")
    assert all(r.get("comm_hook_calls", 0) >= 5 for r in exact), [r.get("comm_hook_calls") for r in exact]
    run_parity([config], 2, tmp_path / "fp16", extra=["--comm-hook", "fp16"])
    for a, b in zip(exact, load_records(config, 2, tmp_path / "fp16")):
        assert any(not torch.equal(a["params"][k], b["params"][k]) for k in a["params"]), "fp16 compression changed nothing"
        for k in a["params"]:  # Adam's steps after fp16-rounded gradients: close to the exact ones, relatively
            diff = float((b["params"][k] - a["params"][k]).norm() / a["params"][k].norm())
            assert diff < 0.05, (k, diff)


def test_a_communication_hook_must_be_callable() -> None:
    with pytest.raises(TypeError, match="ddp_comm_hook must be a DDP communication hook"):
        HaloQuantStrategy(ddp_comm_hook="powersgd")  # type: ignore[arg-type]


def test_a_true_precision_needs_features_of_its_dtype(tmp_path) -> None:
    """Lightning converts a step's input collections, not a PyG graph: float32 features under precision="64-true"
    are refused at the first step, naming the fix; the graph converted before the data module trains in float64."""
    data = awkward_graph(1, dtype=torch.float32)
    model = _Module(GCNConv(data.num_features, 3))
    with pytest.raises(TypeError, match=r"precision='64-true'\) runs the model in torch.float64, .* `x` are torch.float32"):
        _trainer(strategy=HaloQuantStrategy(bits=32), precision="64-true").fit(
            model, datamodule=HaloDataModule(data, cache_dir=str(tmp_path / "cache")))  # fmt: skip
    data.x = data.x.double()
    trainer = _trainer(strategy=HaloQuantStrategy(bits=32), precision="64-true")
    trainer.fit(model, datamodule=HaloDataModule(data, cache_dir=str(tmp_path / "cache")))
    assert model.conv.lin.weight.dtype == torch.float64 and trainer.state.finished
