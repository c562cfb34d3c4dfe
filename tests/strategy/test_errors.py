"""Bad models and setups fail with a clear message on every rank, never a hang."""

from __future__ import annotations

import pytest

from lightning_halo import HaloQuantStrategy
from tests.support.launch import check, run_workers

SCENARIOS = {
    "no_mp": "has no torch_geometric MessagePassing layer",
    "unsupported_layer": "EGConv cannot run on graph partitions",
    "tuple_gcn": "was called with a tuple (x_src, x_dst), but it does not take bipartite input",
    "wrong_rows": "got x with 10 rows, but this rank owns",
    "return_none": "training_step returned None",
    "num_parts": "num_parts=3) but the Trainer runs 2 processes",
    "plan_mismatch": "the exchange plan disagrees with rank",
    "unused_parameter": "strategy=HaloQuantStrategy(find_unused_parameters=True)",
    "empty_masks": "OK HaloQuantStrategy",
    "registered_name": "OK HaloQuantStrategy",
}


@pytest.mark.multiprocess
def test_error_scenarios_on_two_ranks(tmp_path) -> None:
    results = run_workers(
        ["tests/workers/errors_worker.py", "--out", str(tmp_path), "--scenarios", *SCENARIOS], 2, timeout=600
    )
    check(results)
    for name, fragment in SCENARIOS.items():
        for rank in range(2):
            msg = (tmp_path / name / f"rank{rank}.txt").read_text()
            assert fragment in msg, f"{name} rank {rank}: {msg}"
    for rank in range(2):  # Lightning's own advice names DDPStrategy, which would drop the halo exchange
        assert "DDPStrategy" not in (tmp_path / "unused_parameter" / f"rank{rank}.txt").read_text()


@pytest.mark.parametrize("kwargs", [dict(bits=3), dict(grad_bits=0), dict(eval_bits=64)])
def test_unsupported_bits(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=r"choose one of \(1, 2, 4, 8, 16, 32\)"):
        HaloQuantStrategy(**kwargs)


def test_bad_timeout() -> None:
    with pytest.raises(ValueError, match="halo_timeout"):
        HaloQuantStrategy(halo_timeout=0)


def test_registered_names() -> None:
    from lightning.pytorch.strategies import StrategyRegistry

    import lightning_halo  # noqa: F401  # registers on import

    assert "halo_quant" in StrategyRegistry and "halo_quant_spawn" in StrategyRegistry
    assert StrategyRegistry["halo_quant_spawn"]["init_params"]["start_method"] == "spawn"
