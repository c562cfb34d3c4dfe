"""What lightning-halo assumes about Lightning's internals (lightning_halo._compat.lightning)."""

from __future__ import annotations

import subprocess
import sys

from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
from lightning.pytorch.trainer.connectors.signal_connector import _get_sigkill_signal

from lightning_halo._compat.lightning import StrategyRegistryType, stop_launched_ranks


def test_the_launcher_keeps_its_processes_and_can_kill_them() -> None:
    from lightning.fabric.plugins.environments import LightningEnvironment

    launcher = _SubprocessScriptLauncher(LightningEnvironment(), num_processes=2, num_nodes=1)
    assert launcher.procs == []  # filled by launch() with the ranks it starts
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    launcher.procs.append(sleeper)
    stop_launched_ranks(launcher, grace_s=0.1)
    assert sleeper.wait(timeout=10) == -_get_sigkill_signal()


def test_the_registry_given_to_register_strategies_is_of_the_registry_class() -> None:
    import inspect

    from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

    assert isinstance(StrategyRegistry, StrategyRegistryType)
    assert list(inspect.signature(DDPStrategy.register_strategies).parameters) == ["strategy_registry"]


def test_other_launchers_are_left_alone() -> None:
    """Ranks started by torchrun or SLURM are theirs: a launcher of another kind keeps its processes alive."""

    class OtherLauncher:  # has procs like Lightning's, but is not its subprocess launcher
        def __init__(self, procs: list) -> None:
            self.procs = procs

        def kill(self, signum: int) -> None:
            raise AssertionError("stop_launched_ranks must not kill another launcher's processes")

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for launcher in (None, object(), OtherLauncher([sleeper])):
            stop_launched_ranks(launcher, grace_s=0.1)
        assert sleeper.poll() is None, "a process that is not the launcher's was stopped"
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)


def test_lightning_records_a_compiled_module_it_unwraps() -> None:
    """``trainer.fit(torch.compile(model))`` hands the strategy the module with ``_compiler_ctx`` set."""
    import lightning as L
    import torch
    from lightning.pytorch.utilities.compile import _maybe_unwrap_optimized

    from lightning_halo._compat.lightning import compiled_by_trainer

    model = L.LightningModule()
    assert not compiled_by_trainer(model)
    unwrapped = _maybe_unwrap_optimized(torch.compile(model, backend="eager"))
    assert unwrapped is model and compiled_by_trainer(model)


def test_the_training_step_runs_through_the_strategys_redirection_and_its_output_is_tied() -> None:
    """Lightning calls ``training_step`` of a wrapped module through ``strategy._forward_redirection`` (the
    wrapper's forward); the redirection of lightning-halo runs the step there and ties its output."""
    import torch
    from torch import nn

    from lightning_halo._compat.lightning import step_output_redirection

    calls = []

    class Step(nn.Module):
        def training_step(self, x):
            calls.append("step")
            return {"loss": x.sum()}

    class Wrapper(nn.Module):  # what DDP is to the redirection: it calls the wrapped module's forward
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            calls.append("wrapper")
            return self.inner(*args)

    inner = Step()
    redirect = step_output_redirection(lambda out: {**out, "tied": True})
    out = redirect(Wrapper(inner), inner, "training_step", torch.ones(3))
    assert calls == ["wrapper", "step"] and out["tied"] and float(out["loss"]) == 3.0
    assert inner.forward.__name__ != "wrapped_forward", "the module's forward is put back"
    import inspect

    from lightning.pytorch.strategies import Strategy

    assert '_forward_redirection(self.model, self.lightning_module, "training_step"' in inspect.getsource(Strategy.training_step)


def test_the_precision_plugins_say_which_dtype_they_convert_inputs_to() -> None:
    """``DoublePrecision`` and ``HalfPrecision`` (the ``"*-true"`` ones) convert a step's floating inputs; the others
    leave them alone: what ``strategy.check_input_dtype`` compares a partition's features with."""
    import torch
    from lightning.pytorch.plugins.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision

    from lightning_halo._compat.lightning import precision_input_dtype

    x = torch.zeros(2, dtype=torch.float32)
    for plugin, want in [(DoublePrecision(), torch.float64), (HalfPrecision("bf16-true"), torch.bfloat16),
                         (HalfPrecision("16-true"), torch.float16), (Precision(), None),
                         (MixedPrecision("bf16-mixed", "cpu"), None)]:  # fmt: skip
        assert precision_input_dtype(plugin) == want
        assert plugin.convert_input(x).dtype == (want or torch.float32)  # what Lightning does with a tensor input
