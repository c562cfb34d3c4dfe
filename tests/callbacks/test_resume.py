"""Checkpoint/resume continues bitwise like the uninterrupted run, in every halo mode.

The model has dropout and the exchange is 1-bit (stochastic rounding), so this holds only if
per-rank RNG streams, quantizer generators, stale halo rows and pending halo gradients are all
saved and restored; the partition is reused from the cache.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.device import max_ranks
from tests.support.launch import check, run_workers

MODES = ["sync", "pipelined:2", "periodic:2", "adaptive:0.75"]
WORLD_SIZE = min(2, max_ranks())  # 2 ranks on CPU; on a machine with one GPU, world size 1


@pytest.mark.multiprocess
@pytest.mark.device
@pytest.mark.parametrize(("model", "bits", "modes"), [("gcn", "1", MODES), ("appnp", "1", MODES),
                                                      ("gcn", "adaptive", ["pipelined:2", "adaptive:0.75"]),
                                                      ("gcn", "adaptive:val_acc:min:2", ["sync"])],
                         ids=["gcn", "appnp", "gcn-adaptive-bits", "gcn-adaptive-bits-plateau"])  # fmt: skip
def test_resume_is_bitwise_exact(model: str, bits: str, modes: list[str], tmp_path) -> None:
    """APPNP exchanges its halo before each of its 10 propagation steps: one slot per step. With ``bits="adaptive"``
    the resumed run chooses the widths the uninterrupted one chose (the measured signals are checkpointed). With a
    ``bit_monitor`` (``val_acc`` with mode ``min`` and patience 2: a rising accuracy is a plateau from the second
    value) the budget opens on trial at epoch 3, the resumed run's first: from the value the checkpoint of epoch 2
    holds; whether the trial keeps it or gives it back follows the rule on the values the monitor saw."""
    bits, *monitor = bits.split(":", 1)
    for phase in ("full", "first", "second"):
        check(
            run_workers(
                ["tests/workers/resume_worker.py", "--out", str(tmp_path), "--phase", phase, "--modes", *modes,
                 "--model", model, *(["--bits", bits] if bits != "1" else []),
                 *(["--bit-monitor", monitor[0]] if monitor else [])],
                WORLD_SIZE,
                timeout=600,
            )
        )  # fmt: skip
    # one partition folder; `sources/` holds the facts of named sources (sizes, fingerprints)
    caches = [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".") and p.name != "sources"]
    assert len(caches) == 1, "the resumed run must reuse the cached partition"
    for mode in modes:
        tag = mode.replace(":", "_")
        for rank in range(WORLD_SIZE):
            full = torch.load(tmp_path / "full" / model / tag / f"rank{rank}.pt")
            resumed = torch.load(tmp_path / "second" / model / tag / f"rank{rank}.pt")
            first = torch.load(tmp_path / "first" / model / tag / f"rank{rank}.pt")
            for name in full:
                assert torch.equal(full[name], resumed[name]), f"{mode} rank {rank}: {name} differs after resume"
            assert any(not torch.equal(full[n], first[n]) for n in full), "the second half must have trained"
            if WORLD_SIZE == 1:  # one rank has no halo: nothing to decide, no width to choose (the GPU check's case)
                continue
            if mode.startswith("adaptive"):  # the resumed run decides as the uninterrupted one: here sync, then stale
                full_d = torch.load(tmp_path / "full" / model / tag / f"decisions{rank}.pt")
                resumed_d = torch.load(tmp_path / "second" / model / tag / f"decisions{rank}.pt")
                assert resumed_d and resumed_d == {e: d for e, d in full_d.items() if e in resumed_d}
                assert {d for ds in resumed_d.values() for d in ds} == {"sync", "pipelined"}, full_d
            if bits == "adaptive":
                full_w = torch.load(tmp_path / "full" / model / tag / f"widths{rank}.pt")
                resumed_w = torch.load(tmp_path / "second" / model / tag / f"widths{rank}.pt")
                assert resumed_w and resumed_w == {e: w for e, w in full_w.items() if e in resumed_w}
                assert len({b for w in full_w.values() for per in w.values() for b in per.values()}) > 1, full_w
                if monitor:  # the narrowest widths until the plateau, the budget after: opened by the checkpoint's value
                    narrow = {e for e, w in full_w.items() if all(b == 1 for per in w.values() for b in per.values())}
                    assert narrow & {0, 1, 2, 3} == {0, 1, 2}, full_w
                    # and from then on the plateau rule on the ranks' mean value: the trial kept or given back
                    assert narrow == _narrow_epochs(tmp_path / "full" / model / tag, monitor[0]), full_w


def _narrow_epochs(run, spec: str) -> set[int]:
    """The epochs at the narrowest widths that :func:`~lightning_halo.quant.allocate.plateau_step` gives for the
    values the ranks' monitor saw: epoch ``e`` decides on the mean over the ranks of the value after ``e - 1``."""
    from lightning_halo.quant.allocate import Plateau, plateau_step

    _, mode, patience = spec.split(":")
    values = [torch.load(run / f"values{rank}.pt") for rank in range(WORLD_SIZE)]
    state, narrow = Plateau(), {0}
    for epoch in range(1, max(values[0]) + 1):
        state = plateau_step(state, sum(v[epoch - 1] for v in values) / WORLD_SIZE, mode, int(patience))  # type: ignore[arg-type]
        if not state.open:
            narrow.add(epoch)
    return narrow
