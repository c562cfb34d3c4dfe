"""Resuming a checkpoint at another process count (issue 39): weights carry over, halo state restarts sync."""

from __future__ import annotations

import pytest
import torch

from tests.support.launch import check, run_workers

WORKER = "tests/workers/resize_worker.py"


def _run(tmp_path, phase: str, world: int, *extra: str) -> str:
    results = run_workers([WORKER, "--out", str(tmp_path), "--phase", phase, *extra], world, timeout=300)
    check(results)
    return "\n".join(r.stdout for r in results)


@pytest.mark.multiprocess
@pytest.mark.parametrize(("p", "q"), [(4, 2), (2, 3), (3, 1), (1, 4)])
def test_resize_at_bits32_sync_matches_one_process(p: int, q: int, tmp_path) -> None:
    """HALF epochs at P ranks, then the rest at Q, equal the uninterrupted single-process run."""
    _run(tmp_path, "full", 1)
    _run(tmp_path, "first", p)
    _run(tmp_path, "second", q)
    full = torch.load(tmp_path / "full" / "rank0.pt")["params"]
    first = torch.load(tmp_path / "first" / "rank0.pt")["params"]
    for rank in range(q):
        resumed = torch.load(tmp_path / "second" / f"rank{rank}.pt")["params"]
        for name, want in full.items():
            err = (resumed[name] - want).norm() / want.norm().clamp_min(1e-30)
            assert err <= 1e-5, f"{p}->{q} rank {rank}: {name} off by {err:.2e}"
    assert any(not torch.equal(full[n], first[n]) for n in full), "the second half must have trained"


@pytest.mark.multiprocess
def test_pipelined_1bit_resize_restarts_sync(tmp_path) -> None:
    """A pipelined 1-bit run resized 2 -> 3 says so once and trains its first resumed epoch sync."""
    _run(tmp_path, "first", 2, "--mode", "pipelined", "--bits", "1")
    log = _run(tmp_path, "second", 3, "--mode", "pipelined", "--bits", "1")
    assert log.count("written by 2 processes with 3") == 1, log[-4000:]
    for rank in range(3):
        modes = torch.load(tmp_path / "second" / f"rank{rank}.pt")["modes"]
        first = min(modes)
        assert modes[first] == "sync" and all(m == "pipelined" for e, m in modes.items() if e > first), modes


def test_checkpoint_of_another_graph_is_refused() -> None:
    """The graph's fingerprint is in the checkpoint: another graph's checkpoint names both and the fix."""
    from lightning_halo import HaloQuantStrategy, HaloStateCallback

    writer, reader = HaloStateCallback(), HaloStateCallback()
    for cb, graph in ((writer, "aaaa"), (reader, "bbbb")):
        cb.attach(HaloQuantStrategy(bits=32).exchanger.state, 0, 1)
        cb._graph = graph  # what setup reads from the data module's graph_fingerprint
    with pytest.raises(ValueError, match=r"another graph \(fingerprint aaaa, this run's is bbbb\).*graph it was"):
        reader.load_state_dict(writer.state_dict())


def test_truncated_checkpoint_names_the_file_and_overwrites_nothing(tmp_path) -> None:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_halo import HaloDataModule, HaloQuantStrategy
    from tests.support.graphs import awkward_graph
    from tests.support.lightning_models import APPNPNet

    def trainer(epochs: int) -> L.Trainer:
        return L.Trainer(strategy=HaloQuantStrategy(bits=32), accelerator="cpu", devices=1, max_epochs=epochs,
                         logger=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)])  # fmt: skip

    dm = HaloDataModule(awkward_graph(1), cache_dir=str(tmp_path / "cache"))
    trainer(1).fit(APPNPNet(dm.num_features, 8, dm.num_classes, k=2, dropout=0.0).double(), datamodule=dm)
    last = tmp_path / "ckpt" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:200])
    before = {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()}
    with pytest.raises(RuntimeError, match=r"cannot read the checkpoint .*last\.ckpt.*truncated or corrupt.*earlier"):
        trainer(2).fit(APPNPNet(dm.num_features, 8, dm.num_classes, k=2, dropout=0.0).double(), datamodule=dm,
                       ckpt_path=str(last))  # fmt: skip
    assert {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()} == before, "nothing may be overwritten"


def test_checkpoint_of_another_model_is_refused_clearly(tmp_path) -> None:
    """Lightning's own state_dict loading refuses another model, naming the parameter and both shapes."""
    import lightning as L

    from lightning_halo import HaloDataModule, HaloQuantStrategy
    from tests.support.graphs import awkward_graph
    from tests.support.lightning_models import APPNPNet

    def trainer(epochs: int) -> L.Trainer:
        return L.Trainer(strategy=HaloQuantStrategy(bits=32), accelerator="cpu", devices=1, max_epochs=epochs,
                         logger=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         default_root_dir=tmp_path)  # fmt: skip

    dm = HaloDataModule(awkward_graph(1), cache_dir=str(tmp_path / "cache"))
    first = trainer(1)
    first.fit(APPNPNet(dm.num_features, 8, dm.num_classes, k=2, dropout=0.0).double(), datamodule=dm)
    path = tmp_path / "one.ckpt"
    first.save_checkpoint(path)
    with pytest.raises(RuntimeError, match=r"size mismatch for lin1\.weight.*torch\.Size\(\[8, 8\]\).*\[16, 8\]"):
        trainer(2).fit(APPNPNet(dm.num_features, 16, dm.num_classes, k=2, dropout=0.0).double(), datamodule=dm,
                       ckpt_path=str(path))  # fmt: skip
