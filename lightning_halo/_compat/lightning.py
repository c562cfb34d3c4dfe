"""Lightning internals lightning-halo relies on (pinned by ``tests/_compat/test_lightning.py``)."""

from __future__ import annotations

import time
from typing import Any

from lightning.fabric.strategies import _StrategyRegistry

#: The class of Lightning's strategy registry, which ``Strategy.register_strategies`` is given.
StrategyRegistryType = _StrategyRegistry


def stop_launched_ranks(launcher: Any, grace_s: float = 2.0) -> None:
    """Kill the rank processes Lightning's subprocess launcher started, after ``grace_s`` to print their errors.

    Lightning kills them itself only on ``KeyboardInterrupt`` (``trainer/call.py``); a rank
    frozen in user code would otherwise outlive a failed run. Ranks started by torchrun or
    SLURM are not the launcher's (it then has no children) and are left to them.
    """
    from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
    from lightning.pytorch.trainer.connectors.signal_connector import _get_sigkill_signal

    if not isinstance(launcher, _SubprocessScriptLauncher) or not launcher.procs:
        return
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in launcher.procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    launcher.kill(_get_sigkill_signal())


def precision_input_dtype(precision: Any) -> Any:
    """The dtype a precision plugin converts a step's floating inputs to (``None``: it leaves them as they are).

    ``DoublePrecision`` ("64-true") converts them to float64 and ``HalfPrecision`` ("16-true", "bf16-true")
    to its ``_desired_input_dtype``; the other plugins (``"32-true"``, ``"*-mixed"``) leave inputs alone.
    """
    import torch
    from lightning.pytorch.plugins.precision import DoublePrecision, HalfPrecision

    if isinstance(precision, DoublePrecision):
        return torch.float64
    if isinstance(precision, HalfPrecision):
        return precision._desired_input_dtype
    return None


def compiled_by_trainer(module: Any) -> bool:
    """Whether ``module`` is a LightningModule given to the Trainer as ``torch.compile(module)``.

    Lightning unwraps the ``OptimizedModule`` before the strategy sees the model
    (``lightning.pytorch.utilities.compile.from_compiled``) and records the compilation in the
    module's ``_compiler_ctx``, re-applying it after the strategy's setup.
    """
    return getattr(module, "_compiler_ctx", None) is not None


def step_output_redirection(tie: Any) -> Any:
    """Lightning's redirection of ``training_step`` through the DDP wrapper's ``forward``, with ``tie``
    applied to the step's output *inside* that forward.

    DDP with ``find_unused_parameters=True`` marks as unused every parameter its forward output
    does not reach, and fails if backward then reaches one ("marked ready twice"). lightning-halo
    ties the step's fetched halos into the loss so that backward runs every exchange on every
    rank; tied here, DDP sees what backward will reach. Other methods (validation, predict) are
    redirected unchanged.
    """
    from lightning.pytorch.strategies.strategy import _ForwardRedirection

    class _TiedStepOutput(_ForwardRedirection):
        def __call__(self, wrapper_module: Any, original_module: Any, method_name: str, *args: Any, **kwargs: Any) -> Any:
            if method_name != "training_step":
                return super().__call__(wrapper_module, original_module, method_name, *args, **kwargs)
            original_forward = original_module.forward

            def wrapped_forward(*_args: Any, **_kwargs: Any) -> Any:
                original_module.forward = original_forward  # as Lightning's: unpatched before the step runs
                out = tie(original_module.training_step(*_args, **_kwargs))
                self.on_after_inner_forward(wrapper_module, original_module)
                return out

            original_module.forward = wrapped_forward
            out = wrapper_module(*args, **kwargs)
            self.on_after_outer_forward(wrapper_module, original_module)
            return out

    return _TiedStepOutput()
