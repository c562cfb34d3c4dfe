"""HaloSchedule: pipelined and periodic modes do exactly what they promise.

Checked in real 2- and 3-process runs (bits=32, float64) against a single-process simulation
of stale training, and directly on the rows and gradients each exchange moved.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from lightning_halo import HaloDataModule, HaloQuantStrategy, HaloSchedule
from lightning_halo.exchange.policy import MODES
from lightning_halo.partition import build_halo_partitions, partition_graph
from tests.support.graphs import awkward_graph, graph_by_name
from tests.support.isolation import isolated_process_state
from tests.support.models import build_any, tiny_sage_module
from tests.support.parity import TOL, load_records, run_parity
from tests.support.stale_sim import simulate

EPOCHS = 7


def test_step_modes() -> None:
    assert [HaloSchedule("pipelined").step_mode(e) for e in range(4)] == ["sync", "pipelined", "pipelined", "pipelined"]
    assert [HaloSchedule("pipelined", sync_every=3).step_mode(e) for e in range(7)] == [
        "sync", "pipelined", "pipelined", "sync", "pipelined", "pipelined", "sync",
    ]  # fmt: skip
    assert [HaloSchedule("periodic", refresh_every=3).step_mode(e) for e in range(8)] == [
        "sync", "sync", "periodic", "periodic", "sync", "periodic", "periodic", "sync",
    ]  # fmt: skip
    assert [HaloSchedule("pipelined", warmup_epochs=3).step_mode(e) for e in range(5)] == [
        "sync", "sync", "sync", "pipelined", "pipelined",
    ]  # fmt: skip
    assert {HaloSchedule("sync").step_mode(e) for e in range(10)} == {"sync"}
    assert [HaloSchedule("adaptive", sync_every=2).step_mode(e) for e in range(4)] == ["sync", "adaptive", "sync", "adaptive"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(mode="async"), "unknown mode"),
        (dict(mode="pipelined", sync_every=0), "sync_every"),
        (dict(mode="periodic", refresh_every=0), "refresh_every"),
        (dict(smoothing=1.0), "smoothing"),
        (dict(warmup_epochs=-1), "warmup_epochs"),
        (dict(mode="sync", sync_every=3), "applies to mode='pipelined' or 'adaptive' only"),
        (dict(mode="sync", drift_threshold=0.1), "applies to mode='adaptive' only"),
        (dict(mode="pipelined", wait_threshold=0.1), "wait_threshold applies to mode='adaptive' only"),
        (dict(mode="adaptive", wait_threshold=1.0), r"wait_threshold must be a share of the training step in \[0, 1\)"),
        (dict(mode="adaptive", wait_threshold=True), "wait_threshold must be"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HaloSchedule(**kwargs)


class _Modes(L.Callback):
    """The mode the exchange ran each training epoch in, and what the schedule logged."""

    def __init__(self) -> None:
        self.modes: list[str] = []
        self.logged: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.modes.append(trainer.strategy.exchanger.mode)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch > 0:  # the last epoch's epoch-level metrics are in now
            self.logged.append(float(trainer.callback_metrics.get("halo/mode", float("nan"))))

    def on_train_end(self, trainer, pl_module) -> None:
        self.logged.append(float(trainer.callback_metrics.get("halo/mode", float("nan"))))


def _fit(callbacks: list, tmp_path, strategy=None) -> L.Trainer:
    trainer = L.Trainer(strategy=strategy or HaloQuantStrategy(bits=32), accelerator="cpu", devices=1, max_epochs=4,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks)  # fmt: skip
    trainer.fit(tiny_sage_module(), datamodule=HaloDataModule(awkward_graph(1, dtype=torch.float32), cache_dir=str(tmp_path)))
    return trainer


def test_the_schedule_hands_its_policy_to_the_strategy_once(tmp_path) -> None:
    modes = _Modes()
    _fit([HaloSchedule("periodic", refresh_every=2), modes], tmp_path)
    assert modes.modes == ["sync", "sync", "periodic", "sync"]
    assert modes.logged == [0.0, 0.0, 2.0, 0.0]  # MODES.index: sync 0, pipelined 1, periodic 2
    plain = _Modes()
    _fit([plain], tmp_path)  # no schedule: every epoch fresh
    assert plain.modes == ["sync"] * 4 and all(v != v for v in plain.logged), "nothing logs modes without a schedule"


def test_the_schedule_needs_the_halo_strategy() -> None:
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False)
    with pytest.raises(TypeError, match="HaloSchedule needs strategy=HaloQuantStrategy"):
        HaloSchedule().setup(trainer, None, "fit")  # type: ignore[arg-type]


def _resume(tmp_path, callbacks: list, ckpt: Path | None = None, epochs: int = 2, fn: str = "fit") -> L.Trainer:
    """A world-size-1 run of ``epochs`` (from ``ckpt`` if given); its checkpoint is saved next to ``tmp_path``."""
    trainer = L.Trainer(strategy=HaloQuantStrategy(bits=32), accelerator="cpu", devices=1, max_epochs=epochs,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks)  # fmt: skip
    dm = HaloDataModule(awkward_graph(1, dtype=torch.float32), cache_dir=str(tmp_path / "cache"))
    getattr(trainer, fn)(_validated_sage(), datamodule=dm, ckpt_path=None if ckpt is None else str(ckpt))
    return trainer


def _validated_sage() -> L.LightningModule:
    """tiny_sage_module with a validation step (its loss on the validation nodes)."""

    class Validated(type(tiny_sage_module())):  # type: ignore[misc]
        def validation_step(self, batch, _):
            out = self.conv(batch.x, batch.edge_index)
            self.log("val_loss", F.cross_entropy(out[batch.val_mask], batch.y[batch.val_mask]), batch_size=1)

    return Validated()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A checkpoint after 2 epochs written with a pipelined schedule, and one written without a schedule."""
    tmp = tmp_path_factory.mktemp("ckpt")
    out = {}
    # Module scope runs before the autouse per-test isolation takes its snapshot: isolate here.
    with isolated_process_state():
        for name, callbacks in (("pipelined", [HaloSchedule("pipelined", sync_every=2)]), ("none", [])):
            trainer = _resume(tmp, callbacks)
            out[name] = tmp / f"{name}.ckpt"
            trainer.save_checkpoint(out[name])
    return out


@pytest.mark.parametrize(
    ("written", "resumed", "says"),
    [
        ("pipelined", HaloSchedule("pipelined", sync_every=3), "sync_every: 2 -> 3"),
        ("pipelined", HaloSchedule("adaptive", sync_every=2), "mode: 'pipelined' -> 'adaptive'"),
        ("pipelined", None, r"this run has no HaloSchedule \(every epoch sync\).*mode: 'pipelined' -> 'sync'"),
        ("none", HaloSchedule("periodic", refresh_every=2), r"written without a HaloSchedule \(every epoch sync\)"),
    ],
)
def test_resuming_with_another_schedule_is_refused(checkpoints, tmp_path, written, resumed, says) -> None:
    """A resumed run continues the checkpointed one only with its schedule: any other is refused, saying what
    differs and how to resume anyway (a test or validation run from the checkpoint does not train: allowed)."""
    callbacks = [] if resumed is None else [resumed]
    with pytest.raises(ValueError, match=says) as err:
        _resume(tmp_path, callbacks, checkpoints[written], epochs=3)
    assert "allow_resume_change=True" in str(err.value)
    _resume(tmp_path, callbacks, checkpoints[written], fn="validate")


def test_the_same_schedule_or_an_allowed_change_resumes(checkpoints, tmp_path) -> None:
    modes = _Modes()
    _resume(tmp_path, [HaloSchedule("pipelined", sync_every=2), modes], checkpoints["pipelined"], epochs=4)
    assert modes.modes == ["sync", "pipelined"], "epochs 2 and 3 of the checkpointed schedule"
    switched = _Modes()
    change = HaloSchedule("sync", allow_resume_change=True)  # e.g. a pipelined run that diverged goes on in sync
    _resume(tmp_path, [change, switched], checkpoints["pipelined"], epochs=4)
    assert switched.modes == ["sync", "sync"]
    _resume(tmp_path, [], checkpoints["none"], epochs=3)  # no schedule before, none now


def test_the_schedule_state_round_trips() -> None:
    sched = HaloSchedule("adaptive", sync_every=4, smoothing=0.5, warmup_epochs=1, drift_threshold=0.2, wait_threshold=0.1)
    state = sched.state_dict()
    assert state == {"mode": "adaptive", "sync_every": 4, "refresh_every": 10, "smoothing": 0.5, "warmup_epochs": 1,
                     "drift_threshold": 0.2, "wait_threshold": 0.1}  # fmt: skip
    HaloSchedule("adaptive", sync_every=4, smoothing=0.5, warmup_epochs=1, drift_threshold=0.2,
                 wait_threshold=0.1).load_state_dict(state)  # fmt: skip
    # a checkpoint written before the wait threshold existed holds no such key: it resumes under the default
    old = {k: v for k, v in HaloSchedule("adaptive").state_dict().items() if k != "wait_threshold"}
    fitting = HaloSchedule("adaptive")
    fitting._fitting = True
    fitting.load_state_dict(old)


def _sim(spec: str, world_size: int) -> dict:
    data = graph_by_name("awkward", world_size)
    mode, k = spec.split(":")
    sched = HaloSchedule("pipelined", sync_every=int(k)) if mode == "pipelined" else HaloSchedule("periodic", refresh_every=int(k))
    return simulate(data, build_any("sage:3", data), world_size, EPOCHS, sched.step_mode)


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("spec", "world_size", "halo_reduction"),
    [("pipelined:3", 2, "cover"), ("pipelined:3", 3, "none"), ("periodic:3", 2, "none"), ("periodic:3", 3, "cover")],
)
def test_matches_single_process_stale_simulation(spec: str, world_size: int, halo_reduction: str, tmp_path) -> None:
    """Stale rows (and stale partial sums, which are sums of stale rows) as a single process simulates them."""
    config = "sage:3:awkward"
    extra = ["--steps", str(EPOCHS), "--schedule", spec, "--trace", "--halo-reduction", halo_reduction]
    run_parity([config], world_size, tmp_path, extra=extra)
    ref = _sim(spec, world_size)
    recs = load_records(config, world_size, tmp_path)
    for r, rec in enumerate(recs):
        for name, p in ref.items():
            torch.testing.assert_close(rec["params"][name], p, **TOL, msg=lambda m: f"{spec} rank {r} {name}: {m}")
    # the mode really changed something: exact sync training ends elsewhere
    sync = simulate(
        graph_by_name("awkward", world_size), build_any("sage:3", graph_by_name("awkward", world_size)), world_size,
        EPOCHS, lambda e: "sync",
    )
    assert any((sync[n] - ref[n]).abs().max() > 1e-6 for n in ref)
    _check_trace(spec, world_size, recs, halo_reduction)


def _check_trace(spec: str, world_size: int, recs: list[dict], halo_reduction: str) -> None:
    """Rows (or partial sums) used in epoch t are the owners' of epoch t-1; gradients of rows likewise."""
    data = graph_by_name("awkward", world_size)
    parts = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, world_size), world_size)
    if halo_reduction == "cover":
        recv = [r["cover"]["recv_counts"] for r in recs]
        send = [r["cover"]["send_counts"] for r in recs]
        assert sum(map(sum, recv)) < sum(int(p.n_halo) for p in parts), "partial sums must have saved rows here"
    else:
        recv = [p.recv_counts.tolist() for p in parts]
        send = [p.send_counts.tolist() for p in parts]
    sched = HaloSchedule("pipelined", sync_every=int(spec.split(":")[1])) if spec.startswith("pipelined") else (
        HaloSchedule("periodic", refresh_every=int(spec.split(":")[1]))
    )
    fwd = {(r, e, s): (sent, used) for r, rec in enumerate(recs) for d, e, s, sent, used in rec["trace"] if d == "fwd"}
    bwd = {(r, e, s): (sent, got) for r, rec in enumerate(recs) for d, e, s, sent, got in rec["trace"] if d == "bwd"}
    last_refresh = 0
    checked = 0
    for epoch in range(1, EPOCHS):
        mode = sched.step_mode(epoch)
        src = epoch - 1 if mode == "pipelined" else (last_refresh if mode == "periodic" else epoch)
        if mode == "sync":
            last_refresh = epoch
        for slot in (0, 1):
            for q in range(world_size):
                offset = 0
                used = fwd[(q, epoch, slot)][1]
                for o, count in enumerate(recv[q]):
                    start = sum(send[o][:q])
                    owner_rows = fwd[(o, src, slot)][0][start : start + count]
                    torch.testing.assert_close(used[offset : offset + count], owner_rows, rtol=0, atol=0)
                    offset += count
                    checked += count
            if mode == "periodic":
                for o in range(world_size):
                    assert torch.count_nonzero(bwd[(o, epoch, slot)][1]) == 0, "no gradient crosses between refreshes"
                continue
            if halo_reduction == "cover":
                continue  # gradients of partial sums are spread by the senders' operators: checked by the parameters
            gsrc = epoch - 1 if mode == "pipelined" else epoch
            for o in range(world_size):
                expect = torch.zeros_like(bwd[(o, epoch, slot)][1])
                for q in range(world_size):
                    offset = 0
                    grad_halo_q = bwd[(q, gsrc, slot)][0]
                    for owner, count in enumerate(parts[q].recv_counts.tolist()):
                        if owner == o:
                            start = int(parts[o].send_counts[:q].sum())
                            rows = parts[o].send_index[start : start + count]
                            expect.index_add_(0, rows, grad_halo_q[offset : offset + count])
                        offset += count
                torch.testing.assert_close(bwd[(o, epoch, slot)][1], expect, **TOL)
    assert checked > 0


@pytest.mark.multiprocess
def test_periodic_sends_nothing_between_refreshes(tmp_path) -> None:
    config = "sage:3:awkward"
    run_parity([config], 2, tmp_path, extra=["--steps", str(EPOCHS), "--schedule", "periodic:3", "--bits", "1"])
    sched = HaloSchedule("periodic", refresh_every=3)
    for rec in load_records(config, 2, tmp_path):
        for epoch, counts in enumerate(rec["epoch_bytes"]):
            train = sum(v for (_, d), v in counts.items() if d in ("fwd", "bwd"))
            if sched.step_mode(epoch) == "periodic":
                assert train == 0, (epoch, counts)
            else:
                assert train > 0, (epoch, counts)


ADAPTIVE = "adaptive:0.05"


@pytest.mark.multiprocess
@pytest.mark.parametrize(("world_size", "halo_reduction"), [(2, "cover"), (3, "none")])
def test_adaptive_ranks_agree_and_match_the_stale_simulation_of_their_decisions(world_size: int, halo_reduction: str, tmp_path) -> None:
    """Every rank takes the same per-layer decision each epoch, and the run equals the single-process
    simulation of exactly those decisions (stale layers pipelined, the others synchronous)."""
    config = "sage:3:awkward"
    extra = ["--steps", str(EPOCHS), "--schedule", ADAPTIVE, "--trace", "--halo-reduction", halo_reduction]
    run_parity([config], world_size, tmp_path, extra=extra)
    recs = load_records(config, world_size, tmp_path)
    decisions = recs[0]["decisions"]
    assert all(rec["decisions"] == decisions for rec in recs), "ranks disagree"
    assert all(rec["drifts"] == recs[0]["drifts"] for rec in recs), "the agreed drifts differ"
    per_slot = [d for d in decisions if not isinstance(d, str)]
    flat = {m for d in per_slot for m in d}
    assert flat == {"sync", "pipelined"}, f"the test must see both decisions: {decisions} {recs[0]['drifts']}"
    assert decisions[:2] == ["sync", ["sync", "sync"]], "epoch 0 is synchronous; epoch 1 has no drift measured yet"
    ref = simulate(graph_by_name("awkward", world_size), build_any("sage:3", graph_by_name("awkward", world_size)),
                   world_size, EPOCHS, lambda e: decisions[e])  # fmt: skip
    for r, rec in enumerate(recs):
        for name, p in ref.items():
            torch.testing.assert_close(rec["params"][name], p, **TOL, msg=lambda m: f"rank {r} {name}: {m}")
    assert recs[0]["logged"]["halo/mode"] == MODES.index("adaptive")
    last = decisions[-1]
    assert recs[0]["logged"]["halo/stale_layers"] == sum(d == "pipelined" for d in last)
    assert recs[0]["logged"]["halo/sync_layers"] == sum(d == "sync" for d in last)


@pytest.mark.multiprocess
def test_adaptive_stays_synchronous_where_the_exchanges_wait_less_than_the_wait_threshold(tmp_path) -> None:
    """A wait threshold no exchange reaches (99 % of the step): every layer stays synchronous however little its rows
    move, the run equals its synchronous simulation, and the agreed waits are logged (the same on every rank)."""
    config = "sage:3:awkward"
    run_parity([config], 2, tmp_path, extra=["--steps", str(EPOCHS), "--schedule", "adaptive:100:0.99", "--trace"])
    recs = load_records(config, 2, tmp_path)
    decisions = recs[0]["decisions"]
    assert all(rec["decisions"] == decisions for rec in recs)
    assert {m for d in decisions if not isinstance(d, str) for m in d} == {"sync"}, decisions
    logged = recs[0]["logged"]
    waits = {k: v for k, v in logged.items() if k.startswith("halo/wait/")}
    assert waits and all(0.0 < v < 0.99 for v in waits.values()), waits
    assert all({k: v for k, v in rec["logged"].items() if k.startswith("halo/wait/")} == waits for rec in recs)
    ref = simulate(graph_by_name("awkward", 2), build_any("sage:3", graph_by_name("awkward", 2)), 2, EPOCHS,
                   lambda e: decisions[e])  # fmt: skip
    for r, rec in enumerate(recs):
        for name, p in ref.items():
            torch.testing.assert_close(rec["params"][name], p, **TOL, msg=lambda m: f"rank {r} {name}: {m}")
