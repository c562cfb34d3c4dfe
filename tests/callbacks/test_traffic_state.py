"""The traffic and checkpoint-state callbacks, in process (their multi-process behaviour: tests/strategy, test_resume)."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_halo import HaloDataModule, HaloQuantStrategy, HaloStateCallback, HaloTrafficLogger
from lightning_halo.exchange import HaloExchanger
from lightning_halo.partition import build_halo_partitions, partition_graph
from lightning_halo.testing import ThreadGroup
from tests.support.graphs import awkward_graph
from tests.support.models import tiny_sage_module
from tests.support.threaded import on_threads


def test_strategy_adds_the_callbacks_and_one_process_sends_nothing(tmp_path, capsys) -> None:
    trainer = L.Trainer(strategy=HaloQuantStrategy(bits=1), accelerator="cpu", devices=1, max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(tiny_sage_module(), datamodule=HaloDataModule(awkward_graph(1, dtype=torch.float32), cache_dir=str(tmp_path)))
    traffic = [cb for cb in trainer.callbacks if isinstance(cb, HaloTrafficLogger)]
    assert len(traffic) == 1 and sum(isinstance(cb, HaloStateCallback) for cb in trainer.callbacks) == 1
    assert traffic[0].summary["train_bytes"] == 0 and traffic[0].summary["epochs"] == 2
    assert float(trainer.callback_metrics["halo/MB"]) == 0.0 and float(trainer.callback_metrics["halo/fwd_bytes"]) == 0.0


def _exchangers_after_one_step(world: int = 2):
    """Two ranks' exchangers after one pipelined 1-bit epoch of slot traffic (threads)."""
    data = awkward_graph(world)
    parts = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, world), world)
    group = ThreadGroup(world)

    def rank(r: int) -> tuple:
        ex = HaloExchanger(group.transport(r), bits=1, seed=3)
        ex.bind(parts[r])
        for epoch, mode in enumerate(("sync", "pipelined")):
            ex.begin_step(True, epoch=epoch, mode=mode)
            h = torch.randn(int(parts[r].n_inner), 4, dtype=torch.float64, requires_grad=True)
            ex.prepare_loss(ex.fetch(h, "conv").sum()).backward()
        return ex, parts[r]

    return on_threads(world, rank)


def test_state_round_trip_restores_every_rank_exactly() -> None:
    (ex, part), _ = _exchangers_after_one_step()
    cb = HaloStateCallback()
    cb.attach(ex.state, rank=0, world_size=1)
    state = cb.state_dict()
    fresh = HaloExchanger(None, bits=1, seed=3)
    other = HaloStateCallback()
    other.attach(fresh.state, rank=0, world_size=1)
    other.load_state_dict(state)
    fresh.bind(part)
    a, b = ex.state.state_dict(), fresh.state.state_dict()
    assert torch.equal(a["generator"], b["generator"]) and a["plans"] == b["plans"]
    for sa, sb in zip(a["slots"], b["slots"]):
        assert sa["layer"] == sb["layer"] and sa["fresh_epoch"] == sb["fresh_epoch"]
        assert torch.equal(sa["halo"], sb["halo"]) and torch.equal(sa["grad"], sb["grad"])
    assert fresh.meter.total == ex.meter.total


def test_state_of_another_world_size_restarts_and_another_partition_is_refused() -> None:
    (ex, part), (ex1, part1) = _exchangers_after_one_step()
    cb = HaloStateCallback()
    cb.attach(ex.state, rank=0, world_size=1)
    state = cb.state_dict()
    two = HaloStateCallback()
    resized = HaloExchanger(None)
    two.attach(resized.state, rank=0, world_size=2)
    with pytest.warns(UserWarning, match="written by 1 processes with 2"):
        two.load_state_dict(state)  # another process count: the halo state restarts (issue 39)
    assert resized.state._restored is None and not resized.state._seeded, "nothing of the old ranks is restored"
    wrong = HaloExchanger(None, bits=1)
    wrong.state.load_state_dict(ex.state.state_dict())
    assert (int(part.n_halo), int(part.send_counts.sum())) != (int(part1.n_halo), int(part1.send_counts.sum()))
    with pytest.raises(Exception, match="belongs to a different partition"):
        wrong.bind(part1)  # rank 0's state on rank 1's partition


@pytest.mark.parametrize(("bits", "says"), [(32, "exact for the hooked layers; run `lightning-halo verify`"),
                                            (1, "quantized: lossy, unbiased")])  # fmt: skip
def test_the_start_of_training_says_what_is_exact(tmp_path, caplog, bits: int, says: str) -> None:
    """At bits=32 the banner claims exactness only for the hooked layers and points to verify."""
    trainer = L.Trainer(strategy=HaloQuantStrategy(bits=bits), accelerator="cpu", devices=1, max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    with caplog.at_level("INFO"):
        trainer.fit(tiny_sage_module(), datamodule=HaloDataModule(awkward_graph(1, dtype=torch.float32), cache_dir=str(tmp_path)))
    banner = [r.getMessage() for r in caplog.records if "training halos at bits" in r.getMessage()]
    assert len(banner) == 1 and f"bits={bits}" in banner[0] and says in banner[0]
