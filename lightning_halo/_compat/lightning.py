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


def compiled_by_trainer(module: Any) -> bool:
    """Whether ``module`` is a LightningModule given to the Trainer as ``torch.compile(module)``.

    Lightning unwraps the ``OptimizedModule`` before the strategy sees the model
    (``lightning.pytorch.utilities.compile.from_compiled``) and records the compilation in the
    module's ``_compiler_ctx``, re-applying it after the strategy's setup.
    """
    return getattr(module, "_compiler_ctx", None) is not None
