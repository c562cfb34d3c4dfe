"""What :func:`~lightning_halo.verify` does with each option of the strategy you train with.

verify checks your :class:`~lightning_halo.HaloQuantStrategy`, not a default one. Each of its
options is, by :data:`STRATEGY_OPTIONS`:

- *carried*: the ranks of the check build their strategy with your value (``scale_loss``,
  ``aggregation``, ``halo_reduction``, the DDP options, ...);
- *exact*: lossy by design (``bits``, a gradient compression hook), checked at its exact value
  (:data:`EXACT_VALUES`); the report says so when yours differs;
- *run*: how the check's own processes run (forked CPU processes, its ``timeout``, one
  thread each), which changes no value it compares.

Every parameter of ``HaloQuantStrategy.__init__`` is in the table (tests/verification/test_options.py),
so an option added later cannot be left out unnoticed.
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["EXACT_VALUES", "STRATEGY_OPTIONS", "Treatment", "exact_notes", "result_options", "shown_options"]


class Treatment(enum.Enum):
    """What the check does with an option of the strategy."""

    CARRIED = "carried"  #: the ranks' strategy gets the user's value
    EXACT = "exact"  #: lossy by design: checked at its exact value, said in the report when the user's differs
    RUN = "run"  #: how the check's processes run: changes no value it compares


_LOSSY_BITS = "verify checks the exact exchange, bits=32 (fewer bits are lossy by design: validate them by accuracy)"
_LOSSY_HOOK = ("verify compares exact gradients, all-reduced by DDP itself (a compression hook is lossy like "
               "bits < 32: validate it by accuracy)")  # fmt: skip

#: Every option of ``HaloQuantStrategy.__init__``: what the check does with it, and why when it is not carried.
STRATEGY_OPTIONS: dict[str, tuple[Treatment, str]] = {
    "bits": (Treatment.EXACT, _LOSSY_BITS),
    "grad_bits": (Treatment.EXACT, _LOSSY_BITS),
    "eval_bits": (Treatment.RUN, "one training step: nothing is evaluated"),
    "bit_choices": (Treatment.RUN, "the widths of bits='adaptive': verify checks bits=32, where they change nothing"),
    "bit_budget": (Treatment.RUN, "the bytes of bits='adaptive': verify checks bits=32, where they change nothing"),
    "bit_target": (Treatment.RUN, "the noise target of bits='adaptive': verify checks bits=32, where it changes nothing"),
    "bit_monitor": (Treatment.RUN, "when bits='adaptive' widens: verify checks bits=32, where it changes nothing"),
    "bit_mode": (Treatment.RUN, "when bits='adaptive' widens: verify checks bits=32, where it changes nothing"),
    "bit_patience": (Treatment.RUN, "when bits='adaptive' widens: verify checks bits=32, where it changes nothing"),
    "scale_loss": (Treatment.CARRIED, ""),
    "halo_timeout": (Treatment.RUN, "the check's timeout= bounds its runs and their collectives"),
    "seed": (Treatment.CARRIED, ""),
    "check_finite": (Treatment.CARRIED, ""),
    "aggregation": (Treatment.CARRIED, ""),
    "halo_reduction": (Treatment.CARRIED, ""),
    "num_threads": (Treatment.RUN, "each rank is forked and runs one thread (OpenMP's pool belongs to the parent)"),
    "accelerator": (Treatment.RUN, "the check runs on the CPU"),
    "parallel_devices": (Treatment.RUN, "the check runs one CPU process per rank"),
    "cluster_environment": (Treatment.RUN, "the ranks are forked from the calling process, on this machine"),
    "checkpoint_io": (Treatment.RUN, "one step: nothing is checkpointed"),
    "precision_plugin": (Treatment.RUN, "the check runs in float64 if the model allows (else float32, or dtype=)"),
    "process_group_backend": (Treatment.RUN, "gloo, on the CPU"),
    "timeout": (Treatment.RUN, "the check's timeout= bounds its runs and their collectives"),
    "start_method": (Treatment.RUN, "the ranks are forked from the calling process"),
    "find_unused_parameters": (Treatment.CARRIED, ""),
    "static_graph": (Treatment.CARRIED, ""),
    "gradient_as_bucket_view": (Treatment.CARRIED, ""),
    "ddp_comm_hook": (Treatment.EXACT, _LOSSY_HOOK),
    "ddp_comm_state": (Treatment.EXACT, _LOSSY_HOOK),
    "ddp_comm_wrapper": (Treatment.EXACT, _LOSSY_HOOK),
}

#: The value the check uses for each *exact* option (``grad_bits=None``: the same as ``bits``).
EXACT_VALUES: dict[str, Any] = {"bits": 32, "grad_bits": None, "ddp_comm_hook": None, "ddp_comm_state": None,
                                "ddp_comm_wrapper": None}  # fmt: skip


def result_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options among ``options`` (a strategy's ``init_args``) that change what the check computes.

    Example:
        >>> sorted(result_options({"bits": 32, "halo_reduction": "none", "timeout": None}))
        ['bits', 'halo_reduction']
    """
    return {name: value for name, value in options.items() if STRATEGY_OPTIONS[name][0] is not Treatment.RUN}


def _name(value: Any) -> str:
    return getattr(value, "__name__", None) or repr(value)


def exact_notes(options: dict[str, Any]) -> list[str]:
    """A note for each lossy option of the user's strategy (``options``, its ``init_args``) that is not what is checked.

    Example:
        >>> exact_notes({"bits": 1, "grad_bits": None})[0][:45]
        "the strategy's bits=1 is not what is checked:"
    """
    return [
        f"the strategy's {name}={_name(options[name])} is not what is checked: {STRATEGY_OPTIONS[name][1]}"
        for name, exact in EXACT_VALUES.items()
        if name in options and options[name] != exact
    ]


def shown_options(options: dict[str, Any]) -> str:
    """The ranks' strategy as the report shows it: ``bits`` and every option that is not its default.

    Example:
        >>> shown_options({"bits": 32, "halo_reduction": "none", "aggregation": "auto"})
        "HaloQuantStrategy(bits=32, halo_reduction='none')"
    """
    import inspect

    from lightning_halo.strategy import HaloQuantStrategy

    defaults = {n: p.default for n, p in inspect.signature(HaloQuantStrategy.__init__).parameters.items()}
    given = [f"{n}={_name(v) if callable(v) else repr(v)}" for n, v in result_options(options).items()
             if n == "bits" or v != defaults[n]]  # fmt: skip
    return f"HaloQuantStrategy({', '.join(given)})"
