"""Heterogeneous graphs in real processes: Lightning's fit on heterogeneous partitions equals single-process PyG.

The zoo's HeteroNodeClassifier (HeteroConv of SAGEConv or GATConv per relation, HGTConv or HANConv; a
learned embedding for the type without features) trains for a few epochs at bits=32 on 2 and 3
gloo processes (SAGE with and without partial sums per relation); its parameters and the gathered predictions of the labelled type equal those of
plain PyG trained on the whole graph. Quantized and pipelined runs train and move fewer bytes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.hetero import generated_hetero, train_reference, with_leaf_relation
from tests.support.launch import check, run_workers
from tests.workers.hetero_worker import EPOCHS

WORKER = "tests/workers/hetero_worker.py"
EXACT = ["sage:32:sync", "gat:32:sync", "hgt:32:sync", "han:32:sync"]
#: sage with partial sums per relation (the default, above) and without; the attention layers take none
NO_COVER = "sage:32:sync:none"
LEAF = "han:32:sync:leaf"


def _records(out: Path, config: str, world_size: int) -> list[dict]:
    return [torch.load(out / config.replace(":", "_") / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_fit_on_heterogeneous_partitions_equals_single_process_pyg(world_size: int, tmp_path: Path) -> None:
    configs = [*EXACT, "sage:1:sync", "hgt:2:pipelined", "lazy", LEAF] if world_size == 2 else EXACT
    check(run_workers([WORKER, "--out", str(tmp_path), "--configs", *configs], world_size, timeout=900))
    check(run_workers([WORKER, "--out", str(tmp_path), "--configs", NO_COVER], world_size, timeout=900))
    data = generated_hetero()
    for config in [*EXACT, NO_COVER]:
        ref = train_reference(config.split(":")[0], data, EPOCHS)
        for r, rec in enumerate(_records(tmp_path, config, world_size)):
            for name, value in ref["params"].items():
                torch.testing.assert_close(rec["params"][name], value, atol=1e-10, rtol=1e-9,
                                           msg=lambda m: f"{config} rank {r} {name}: {m}")  # fmt: skip
            torch.testing.assert_close(rec["pred"], ref["pred"], atol=1e-10, rtol=1e-9)
            assert rec["traffic"], f"{config}: halos must have travelled"
            covered = any("partial sums" in how for how in rec["choices"].values())
            assert covered == (config == "sage:32:sync"), (config, rec["choices"])
    fwd_total = lambda config: sum(v for r in _records(tmp_path, config, world_size)  # noqa: E731
                                   for (_, kind), v in r["traffic"].items() if kind == "fwd")  # fmt: skip
    assert fwd_total("sage:32:sync") < fwd_total(NO_COVER)
    if world_size == 2:
        _check_lazy(tmp_path, data)
        _check_leaf(tmp_path)
        exact = _records(tmp_path, "sage:32:sync", 2)[0]["traffic"]
        one_bit = _records(tmp_path, "sage:1:sync", 2)[0]["traffic"]
        fwd = lambda t: sum(v for (layer, kind), v in t.items() if kind == "fwd")  # noqa: E731
        assert 0 < fwd(one_bit) * 8 < fwd(exact), (one_bit, exact)
        for config in ("sage:1:sync", "hgt:2:pipelined"):
            for rec in _records(tmp_path, config, 2):
                assert all(torch.isfinite(v).all() for v in rec["params"].values()), config
                assert rec["pred"].shape == (data["paper"].num_nodes, 3)


def _check_leaf(out: Path) -> None:
    """HAN with find_unused_parameters=True where first-layer weights reach the loss only through an exchange's
    tie (DBLP's shape): DDP must see them as used (the tie is made inside its forward), or it fails with
    "marked ready twice". Those weights get a zero gradient (one process: none), so with weight decay they move
    where one process leaves them: the predictions are compared, and every other parameter."""
    ref = train_reference("han", with_leaf_relation(generated_hetero()), EPOCHS)
    for r, rec in enumerate(_records(out, LEAF, 2)):
        torch.testing.assert_close(rec["pred"], ref["pred"], atol=1e-10, rtol=1e-9)
        moved = [name for name in ref["params"] if not torch.allclose(rec["params"][name], ref["params"][name])]
        assert moved and all(name.startswith("convs.0.") and "venue" in name for name in moved), moved


def _check_lazy(out: Path, data) -> None:
    import lightning as L

    from tests.support.hetero import hetero_loss, lazy_model

    L.seed_everything(0, verbose=False)
    num_nodes = {t: int(data[t].num_nodes) for t in data.node_types}
    ref = lazy_model(data.metadata(), num_nodes, "paper", 3)
    with torch.no_grad():
        ref(data)
    opt = ref.configure_optimizers()
    for _ in range(EPOCHS):
        opt.zero_grad()
        hetero_loss(ref(data), data["paper"], int(data["paper"].train_mask.sum())).backward()
        opt.step()
    for r, rec in enumerate(_records(out, "lazy", 2)):
        assert "not initialised yet" in rec["refusal"] and "model(dm.data)" in rec["refusal"], rec["refusal"]
        for name, value in ref.state_dict().items():
            torch.testing.assert_close(rec["params"][name], value, atol=1e-10, rtol=1e-9, msg=lambda m: f"lazy rank {r} {name}: {m}")


def test_a_model_with_lazy_parameters_is_refused_naming_them() -> None:
    from lightning_halo.strategy import check_materialised

    data = generated_hetero()
    num_nodes = {t: int(data[t].num_nodes) for t in data.node_types}
    from tests.support.hetero import lazy_model

    model = lazy_model(data.metadata(), num_nodes, "paper", 3)
    with pytest.raises(RuntimeError, match=r"not initialised yet.*net\.c1\.") as err:
        check_materialised(model)
    assert "num_features" in str(err.value)
    with torch.no_grad():
        model(data)
    check_materialised(model)  # materialised: nothing to say
