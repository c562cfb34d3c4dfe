"""What the strategy binds: every new partition's plan is checked with the peers, and teardown lets go of it.

No state is kept by object identity: the plan check and gather_rows' row directory belong to the
exchanger's binding, which a new partition replaces and teardown drops, so a second fit in the
same process starts clean and the first run's partition can be freed.
"""

from __future__ import annotations

import copy
import gc
import weakref

import lightning as L
import pytest
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import LightningEnvironment

from lightning_halo import HaloLinkDataModule, HaloQuantStrategy
from lightning_halo.exchange import ExchangePlan
from lightning_halo.models import LinkPredictor
from lightning_halo.partition import build_halo_partitions, partition_graph
from tests.support.graphs import awkward_graph


def test_every_newly_bound_partition_is_checked_with_the_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 of 2 (the peer's answer simulated): the check runs whenever another partition is bound, however
    often one was bound before, and not for another stage's view of the bound one."""
    data = awkward_graph(2)
    a, b = (build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, 2, partitioner=m), 2)
            for m in ("metis", "random"))  # fmt: skip
    sig_a, sig_b = (ExchangePlan.from_partition(p[0]).signature() for p in (a, b))
    peer = {sig: ExchangePlan.from_partition(p[1]).signature() for sig, p in ((sig_a, a), (sig_b, b))}
    checked: list[tuple] = []

    def all_gather_object(out: list, obj: tuple, group=None) -> None:
        checked.append(obj)
        out[0], out[1] = obj, peer.get(obj, peer[sig_a])  # an unknown plan meets a's peer: a mismatch

    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    env = LightningEnvironment()
    env.set_world_size(2)
    env.set_global_rank(0)
    strategy = HaloQuantStrategy(bits=32, cluster_environment=env)
    views = [a[0].with_attrs(edge_label=torch.ones(k)) for k in (1, 2)]  # other stages' batches of a[0]
    for batch in (a[0], a[0], views[0], b[0], a[0], views[1]):
        strategy._begin((batch,), {}, training=False)  # what every step does first
    assert checked == [sig_a, sig_b, sig_a], "each newly bound partition once: a[0], b[0], a[0] again; views never"
    mismatched = copy.deepcopy(b[0])
    mismatched.send_counts = mismatched.send_counts + torch.tensor([0, 1])  # a different plan than the peer expects
    with pytest.raises(ValueError, match="exchange plan disagrees"):
        strategy._begin((mismatched,), {}, training=False)


def _fit(strategy: HaloQuantStrategy, dm: HaloLinkDataModule) -> float:
    torch.manual_seed(0)
    model = LinkPredictor(dm.num_features, hidden_channels=8, out_channels=8).double()
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0)  # fmt: skip
    trainer.fit(model, datamodule=dm)
    return float(trainer.callback_metrics["train_loss"])


def test_teardown_releases_the_partition_and_a_second_fit_runs(tmp_path) -> None:
    """World-size-1 link fits (gather_rows in every step): teardown unbinds; a second fit in the same process, on
    another split, runs; once the runs' objects are gone their partitions are freed (nothing global holds one)."""
    strategy = HaloQuantStrategy(bits=32, scale_loss="share")
    dm = HaloLinkDataModule(awkward_graph(1), seed=0, cache_dir=str(tmp_path))
    first = _fit(strategy, dm)
    assert not strategy.exchanger.bound and strategy.exchanger.part is None, "teardown unbinds the partition"
    other = HaloLinkDataModule(awkward_graph(1), seed=1, cache_dir=str(tmp_path))
    second = _fit(HaloQuantStrategy(bits=32, scale_loss="share"), other)  # Lightning does not reuse a strategy
    assert torch.isfinite(torch.tensor([first, second])).all() and first != second
    # the partitions and their features (which every stage's batch object shares)
    released = [weakref.ref(obj) for d in (dm, other) for obj in (d.partition, d.partition.x)]
    del dm, other, strategy  # the Trainers and models went with _fit (the strategies hold the last ones)
    gc.collect()
    held = [[type(r).__name__ for r in gc.get_referrers(ref())] for ref in released if ref() is not None]
    assert not held, f"a partition outlives its run, held by {held}"
