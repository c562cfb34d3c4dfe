"""lightning_halo.verify on a heterogeneous graph: rows compared per node type in global order within the type.

It passes the zoo's HeteroNodeClassifier (SAGE per relation with a BatchNorm per type, dropout on, an embedded
type without features) and HGT, and names the first module fed rows that a line of forward computed over one
partition's nodes of a type (a mean over the type's rows between the layers).
"""

from __future__ import annotations

import pytest
import torch

from lightning_halo import HaloDataModule, verify
from lightning_halo.models import HeteroNodeClassifier
from tests.support.hetero import generated_hetero

pytestmark = pytest.mark.multiprocess


class _Centred(HeteroNodeClassifier):
    """Subtracts the mean over the paper rows it is given between the layers: per partition, not per graph."""

    def forward(self, batch):
        x = self.embed(batch)
        edges = batch.edge_index_dict
        x = {t: v.relu() for t, v in self.convs[0](x, edges).items()}
        x["paper"] = x["paper"] - x["paper"].mean(0)
        return self.head(self.convs[1](x, edges)[self.target])


def _model(cls: type, dm: HaloDataModule, conv: str, norm=None) -> HeteroNodeClassifier:
    torch.manual_seed(0)
    return cls(dm.num_classes, dm.metadata, dm.num_features, dm.num_nodes, dm.labelled_type, hidden_channels=8,
               conv=conv, heads=2, dropout=0.5, norm=norm)  # fmt: skip


@pytest.mark.parametrize(("conv", "devices", "norm"), [("sage", 2, "batch"), ("hgt", 3, None)])
def test_passes_a_heterogeneous_model_that_is_exact(conv: str, devices: int, norm, tmp_path) -> None:
    dm = HaloDataModule(generated_hetero(), cache_dir=str(tmp_path / "cache"))
    model = _model(HeteroNodeClassifier, dm, conv, norm)
    strategy = None
    if conv == "hgt":
        from lightning_halo import HaloQuantStrategy

        strategy = HaloQuantStrategy(find_unused_parameters=True)  # its last layer updates every type
    report = verify(model, dm, devices=devices, strategy=strategy)
    assert report.ok, str(report)
    assert report.first_difference is None and not report.grads_differ and report.error is None
    assert report.compared >= 4 and report.logits_diff is not None and report.logits_diff < 1e-12, str(report)
    assert report.loss is not None and abs(report.loss[0] - report.loss[1]) < 1e-12


def test_names_the_module_after_a_mean_over_one_partitions_rows_of_a_type(tmp_path) -> None:
    dm = HaloDataModule(generated_hetero(), cache_dir=str(tmp_path / "cache"))
    report = verify(_model(_Centred, dm, "sage"), dm, devices=2)
    assert not report.ok
    first = report.first_difference
    assert first is not None and (first.name, first.cls) == ("convs.1", "RelationSum"), str(report)
    assert first.inputs_differ and first.previous == "convs.0", str(report)
    assert report.loss is not None and report.loss[0] != pytest.approx(report.loss[1], rel=1e-9, abs=0)
    assert any(name.startswith("convs.0") for name in report.grads_differ), report.grads_differ
