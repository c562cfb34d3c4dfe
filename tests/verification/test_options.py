"""verify checks the strategy the user trains with: every option of HaloQuantStrategy is carried to its ranks,
replaced by its exact value (and said in the report), or says how the check's own processes run."""

from __future__ import annotations

import inspect
from datetime import timedelta

import pytest
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

from lightning_halo import HaloQuantStrategy
from lightning_halo.verification.options import EXACT_VALUES, STRATEGY_OPTIONS, Treatment, exact_notes, shown_options
from lightning_halo.verification.run import RunOptions, rank_strategy, run_options

#: A value other than the default for every option the check carries (a new carried option needs one here).
CARRIED_VALUES = {
    "scale_loss": "share", "seed": 7, "check_finite": False, "aggregation": "edge_index", "halo_reduction": "none",
    "find_unused_parameters": True, "static_graph": True, "gradient_as_bucket_view": True,
}  # fmt: skip


def _parameters() -> dict[str, inspect.Parameter]:
    return {n: p for n, p in inspect.signature(HaloQuantStrategy.__init__).parameters.items() if n != "self"}


def test_every_option_of_the_strategy_is_classified() -> None:
    """A new parameter of HaloQuantStrategy fails here until verify says what it does with it."""
    assert set(STRATEGY_OPTIONS) == set(_parameters())
    for name, (how, why) in STRATEGY_OPTIONS.items():
        assert isinstance(how, Treatment) and (how is Treatment.CARRIED) == (why == ""), name
    assert {n for n, (how, _) in STRATEGY_OPTIONS.items() if how is Treatment.EXACT} == set(EXACT_VALUES)
    assert {n for n, (how, _) in STRATEGY_OPTIONS.items() if how is Treatment.CARRIED} == set(CARRIED_VALUES)


def test_the_strategy_keeps_every_argument_it_was_given() -> None:
    hook = fp16_compress_hook
    strategy = HaloQuantStrategy(bits=4, halo_reduction="none", ddp_comm_hook=hook, timeout=timedelta(seconds=5))
    args = strategy.init_args
    assert set(args) == set(_parameters())
    assert (args["bits"], args["halo_reduction"], args["ddp_comm_hook"], args["timeout"]) == (4, "none", hook, timedelta(seconds=5))
    assert args["grad_bits"] is None and args["scale_loss"] == "train_mean"
    args["bits"] = 1
    assert strategy.init_args["bits"] == 4, "a copy: the strategy's record is its own"


@pytest.mark.parametrize("name", sorted(CARRIED_VALUES))
def test_every_carried_option_reaches_the_ranks_strategy(name: str) -> None:
    """From the user's strategy object to the strategy each rank of the check builds (both runs build it so)."""
    value = CARRIED_VALUES[name]
    assert value != _parameters()[name].default, "test a value that is not the default"
    opts = run_options(HaloQuantStrategy(**{name: value}), timeout=30.0, seed=0)
    built = rank_strategy(opts).init_args
    assert built[name] == value
    assert built["bits"] == 32 and built["halo_timeout"] == 30.0 and built["num_threads"] == 1


def test_lossy_options_are_checked_exact_and_said_so() -> None:
    hook = fp16_compress_hook
    user = HaloQuantStrategy(bits=1, grad_bits=8, ddp_comm_hook=hook, halo_reduction="none")
    opts = run_options(user, timeout=30.0, seed=0)
    built = rank_strategy(opts).init_args
    assert (built["bits"], built["grad_bits"], built["ddp_comm_hook"]) == (32, None, None)
    notes = exact_notes(user.init_args)
    assert [n.split(":")[0] for n in notes] == [
        "the strategy's bits=1 is not what is checked", "the strategy's grad_bits=8 is not what is checked",
        "the strategy's ddp_comm_hook=fp16_compress_hook is not what is checked",
    ]  # fmt: skip
    assert exact_notes(HaloQuantStrategy(bits=32).init_args) == []
    assert shown_options(built) == "HaloQuantStrategy(bits=32, halo_reduction='none')"
    assert shown_options(rank_strategy(run_options(None, timeout=30.0, seed=0)).init_args) == "HaloQuantStrategy(bits=32)"


def test_only_a_halo_strategy_can_be_checked() -> None:
    from lightning.pytorch.strategies import DDPStrategy

    with pytest.raises(TypeError, match="verify checks a HaloQuantStrategy.*got DDPStrategy"):
        run_options(DDPStrategy(), timeout=30.0, seed=0)
    assert isinstance(run_options(None, timeout=30.0, seed=0), RunOptions)
