"""The planner's options and their checks, defined once (``plan()``, the CLI and the benchmark import them).

The bit widths, modes, partitioners and halo reductions are the library's own
(:data:`~lightning_halo.quant.format.SUPPORTED_BITS`, :data:`~lightning_halo.exchange.policy.MODES`,
:data:`~lightning_halo.partition.options.PARTITIONERS`,
:data:`~lightning_halo.layers.reduction.HALO_REDUCTIONS`); this module adds the models the
planner has formulas for and the parsing of link speeds and latencies.
"""

from __future__ import annotations

import re
from typing import Literal, get_args

PlanModel = Literal["gcn", "sage"]
#: Models with a memory and compute formula (:mod:`lightning_halo.planner.memory`, :mod:`lightning_halo.planner.timing`).
PLAN_MODELS: tuple[str, ...] = get_args(PlanModel)
#: The partitioners the partition step's memory is predicted for (``"auto"`` and ``"random"`` need no table row).
PLAN_PARTITIONERS: tuple[str, ...] = ("metis", "kaminpar")

_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgt]?)(bit|bps|b/s|B/s|Bps)?\s*$", re.I)
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(s|ms|us|µs|ns)?\s*$")
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def check_model(model: str) -> str:
    """``model`` if the planner has formulas for it, else a ``ValueError`` that lists them.

    Example:
        >>> check_model("sage")
        'sage'
    """
    if model not in PLAN_MODELS:
        raise ValueError(
            f"the planner has no formulas for model {model!r}; choose one of {PLAN_MODELS} (GCN-style layers that "
            "transform then aggregate, or SAGE-style layers that aggregate then transform)"
        )
    return model


def parse_rate(text: str | float) -> float:
    r"""A link speed in **bytes per second**, from ``tc``-style text (``"10gbit"``, ``"100mbit"``) or a number.

    ``...bit`` and ``...bps`` are bits per second, decimal prefixes (``tc`` and Ethernet use
    :math:`10^3`, :math:`10^6`, :math:`10^9`); ``...B/s`` / ``...Bps`` are bytes per second; a
    bare number is bits per second.

    Args:
        text (str or float): the speed, e.g. ``"1gbit"``, ``"12.5MB/s"``, ``1e9``.

    Example:
        >>> parse_rate("100mbit"), parse_rate("1.25GB/s")
        (12500000.0, 1250000000.0)
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), 1.0 / 8
    else:
        match = _RATE.match(str(text))
        if match is None:
            raise ValueError(f"cannot read the link speed {text!r}: write it like 10gbit, 100mbit, 25gbps or 1.25GB/s")
        number, prefix, kind = match.groups()
        bytes_unit = kind is not None and kind in ("B/s", "Bps")
        value, unit = float(number) * _SCALE[prefix.lower()], 1.0 if bytes_unit else 1.0 / 8
    if value <= 0:
        raise ValueError(f"the link speed must be positive, got {text!r}")
    return value * unit


def parse_latency(text: str | float) -> float:
    """A latency in seconds, from ``"50us"``, ``"0.2ms"``, ``"1e-5"`` (seconds) or a number of seconds.

    Example:
        >>> parse_latency("250us")
        0.00025
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        match = _TIME.match(str(text))
        if match is None:
            raise ValueError(f"cannot read the latency {text!r}: write it like 50us, 0.2ms or 1e-5 (seconds)")
        value = float(match.group(1)) / (1.0 / _SECONDS[match.group(2) or "s"])
    if value < 0:
        raise ValueError(f"the latency cannot be negative, got {text!r}")
    return value


def format_bytes(n: float) -> str:
    """``n`` bytes in decimal units, as the recommendation prints them.

    Example:
        >>> format_bytes(1.93e9), format_bytes(512e3)
        ('1.93 GB', '512 kB')
    """
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            value = n / scale
            return f"{value:.2f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{n:.0f} B"
