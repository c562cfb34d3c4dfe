"""The strategy names lightning-halo registers with Lightning (one table, no heavy imports).

The names say what they do: only ``"halo_exact"`` equals single-process training; the class
default (and ``"halo_quant"``) quantizes halos to 1 bit.
"""

from __future__ import annotations

from typing import Any, Callable

#: (name, bits, start method, what it does)
STRATEGY_NAMES: tuple[tuple[str, int, str, str], ...] = (
    ("halo_exact", 32, "popen", "exact halos (bits=32): equals single-process training"),
    ("halo_1bit", 1, "popen", "1-bit quantized halos (lossy, unbiased)"),
    ("halo_8bit", 8, "popen", "8-bit quantized halos (lossy, unbiased)"),
    ("halo_quant", 1, "popen", "1-bit quantized halos (lossy, unbiased; the class default)"),
    ("halo_quant_spawn", 1, "spawn", "1-bit quantized halos (lossy), start_method 'spawn'"),
    # The class by its name, as `--trainer.strategy HaloQuantStrategy` hands it over: jsonargparse keeps a bare
    # name as a string (the Trainer's strategy may be one), and Lightning looks strings up lowercased.
    ("haloquantstrategy", 1, "popen", "HaloQuantStrategy() by its class name: 1-bit quantized halos (lossy, unbiased)"),
)


def register_names(registry: Any, factory: Callable[..., Any]) -> None:
    """Register every name of :data:`STRATEGY_NAMES` with ``registry`` (once: a second registration raises).

    Example:
        >>> from lightning.pytorch.strategies import StrategyRegistry
        >>> register_names(StrategyRegistry, HaloQuantStrategy)  # doctest: +SKIP
    """
    for name, bits, start_method, what in STRATEGY_NAMES:
        if name not in registry:
            registry.register(
                name, factory, description=f"lightning-halo full-graph GNN strategy: {what}", bits=bits,
                start_method=start_method,
            )  # fmt: skip
