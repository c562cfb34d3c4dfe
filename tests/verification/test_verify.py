"""lightning_halo.verify: one step on one process against 2-3 forked processes, per module, in global node order.

It must pass what is exact (a plain GCN with dropout, per-node embeddings looked up by batch.n_id) and
catch, naming the module, what is not: a global mean pool between the layers, per-node parameters
looked up by position, a module that reduces over the rows it sees; a refused call is reported.
"""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy

from lightning_halo import HaloDataModule, HaloQuantStrategy, verify
from lightning_halo.verification import VerifyError
from lightning_halo.verification.run import RankTraceback
from tests.support.graphs import awkward_graph
from tests.support.verify_models import VerifyGCN

pytestmark = pytest.mark.multiprocess


def _run(mode: str, devices: int, tmp_path, graph: str = "cora", **kwargs):
    data = "cora" if graph == "cora" else awkward_graph(devices, dtype=torch.float32)
    dm = HaloDataModule(data, cache_dir=str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = VerifyGCN(dm.num_features, dm.num_classes, dm.num_nodes, mode)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = verify(model, dm, devices=devices, **kwargs)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "verify must leave the model as it was"
    return report


@pytest.mark.parametrize(("devices", "graph"), [(2, "cora"), (3, "cora"), (3, "awkward")])
@pytest.mark.parametrize("mode", ["plain", "n_id"])
def test_passes_what_is_exact(mode: str, devices: int, graph: str, tmp_path) -> None:
    """A plain GCN (with dropout in forward) and emb(batch.n_id); the awkward graph leaves a rank without train nodes."""
    report = _run(mode, devices, tmp_path, graph)
    assert report.ok, str(report)
    assert report.dtype == torch.float64 and report.devices == devices
    assert report.first_difference is None and not report.grads_differ and report.error is None
    assert report.logits_diff == 0.0 or report.logits_diff < 1e-12
    assert report.compared >= 3  # conv1, conv2 and the LightningModule's forward at least
    assert report.loss is not None and abs(report.loss[0] - report.loss[1]) < 1e-12
    assert str(report).startswith("lightning-halo verify: exact: one training step on")


@pytest.mark.parametrize("devices", [2, 3])
def test_catches_a_global_mean_pool_between_the_layers(devices: int, tmp_path) -> None:
    report = _run("pool", devices, tmp_path)
    assert not report.ok
    first = report.first_difference
    assert first is not None and (first.name, first.cls, first.call) == ("conv2", "GCNConv", 1), str(report)
    assert first.inputs_differ and first.previous == "conv1", str(report)
    assert report.loss is not None and report.loss[0] != pytest.approx(report.loss[1], rel=1e-9, abs=0)
    assert {"conv1.lin.weight", "conv2.lin.weight"} <= set(report.grads_differ)
    text = str(report)
    assert "NOT exact" in text and "`conv2` (GCNConv)" in text and "after `conv1`" in text and "global_mean_pool" in text


@pytest.mark.parametrize("devices", [2, 3])
def test_catches_per_node_parameters_looked_up_by_position(devices: int, tmp_path) -> None:
    report = _run("position", devices, tmp_path)
    assert not report.ok
    first = report.first_difference
    assert first is not None and (first.name, first.cls) == ("emb", "Embedding"), str(report)
    assert first.inputs_differ and first.previous is None
    assert "emb.weight" in report.grads_differ
    assert "batch.n_id" in str(report)


def test_catches_a_positional_slice_of_the_weight(tmp_path) -> None:
    """emb.weight[:n] calls no module: the first layer it feeds is named, with its input differing."""
    report = _run("weight_slice", 2, tmp_path)
    first = report.first_difference
    assert not report.ok and first is not None and first.name == "conv1" and first.inputs_differ, str(report)
    assert "emb.weight" in report.grads_differ


def test_names_a_module_that_reduces_over_its_rows(tmp_path) -> None:
    report = _run("center", 2, tmp_path)
    first = report.first_difference
    assert not report.ok and first is not None and (first.name, first.cls) == ("center", "Center"), str(report)
    assert not first.inputs_differ, "its input (conv1's output after relu) is the same: the module itself differs"
    assert "from the same input" in str(report)


def test_a_call_refused_on_partitions_is_reported(tmp_path) -> None:
    report = _run("self_loops", 2, tmp_path)
    assert not report.ok and report.error is not None
    assert "UnsupportedEdgesError" in report.error, report.error
    assert f"the 2-process run stopped: {report.error}" in str(report)


def test_float32_on_request_with_its_tolerances_and_the_user_s_strategy(tmp_path) -> None:
    """The strategy's options reach both runs (as the ranks built it, in the report); its 1 bit is checked exact."""
    strategy = HaloQuantStrategy(bits=1, aggregation="edge_index", halo_reduction="none", scale_loss="train_mean")
    report = _run("plain", 2, tmp_path, dtype=torch.float32, strategy=strategy)
    assert report.ok and report.dtype == torch.float32, str(report)
    assert report.strategy == "HaloQuantStrategy(bits=32, aggregation='edge_index', halo_reduction='none')"
    assert f"  strategy: {report.strategy}" in str(report)
    assert any(note.startswith("the strategy's bits=1 is not what is checked") for note in report.notes), report.notes
    assert _run("pool", 2, tmp_path, dtype=torch.float32).first_difference.name == "conv2"


def test_bad_arguments_are_refused_before_anything_runs(tmp_path) -> None:
    dm = HaloDataModule("cora", cache_dir=str(tmp_path / "cache"))
    model = VerifyGCN()
    for devices in (1, 0, 2.0, True):
        with pytest.raises(ValueError, match="must be an int >= 2"):
            verify(model, dm, devices=devices)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="float64"):
        verify(model, dm, dtype=torch.float16)
    with pytest.raises(TypeError, match="verify checks a HaloQuantStrategy"):
        verify(model, dm, strategy=DDPStrategy())
    parts = tmp_path / "parts"
    from lightning_halo.data.offline import partition_to_dir

    partition_to_dir("cora", parts, 2)
    with pytest.raises(ValueError, match="reads a partition directory"):
        verify(model, HaloDataModule(str(parts)))


def test_a_model_that_fails_on_one_process_is_an_error(tmp_path) -> None:
    dm = HaloDataModule("cora", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(VerifyError, match="does not train one step on one process") as err:
        verify(VerifyGCN(in_channels=5), dm)  # wrong input size: fails in float64 and in float32
    cause = err.value.__cause__
    assert isinstance(cause, RankTraceback), "the rank's traceback comes with the error"
    assert cause.text.startswith("Traceback (most recent call last):") and "verify_models.py" in cause.text, cause.text
