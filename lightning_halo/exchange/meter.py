"""TrafficMeter: bytes handed to the halo collectives, and the time spent on them."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

#: What a halo collective carries: training rows (``fwd``) and their gradients (``bwd``), rows for
#: validation/test/predict (``eval``), input features exchanged once (``input``), exact per-node
#: values such as degrees or edge lists (``aux``).
Traffic = Literal["fwd", "bwd", "eval", "input", "aux"]


@dataclass
class TrafficMeter:
    """Bytes handed to the collectives, per ``(layer, traffic)``, for the current epoch and in total.

    ``fp32`` counts what the same rows would cost as raw float32, the baseline for the
    reduction factor. ``wait_s`` is the time spent blocked on halo collectives (a blocking
    call, or waiting for an asynchronous one), ``codec_s`` the time spent quantizing and
    dequantizing. Written only by the exchange (the wire counts, the exchanger starts epochs, the
    checkpoint state restores totals); callbacks read it.

    Example:
        >>> m = TrafficMeter(); m.add("conv1", "fwd", 10, 40); m.total[("conv1", "fwd")]
        10
    """

    epoch: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    epoch_fp32: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    total: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    total_fp32: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    epoch_wait_s: float = 0.0
    total_wait_s: float = 0.0
    epoch_codec_s: float = 0.0
    total_codec_s: float = 0.0

    def add(self, layer: str, traffic: Traffic, nbytes: int, fp32_bytes: int) -> None:
        key = (layer, traffic)
        self.epoch[key] += nbytes
        self.epoch_fp32[key] += fp32_bytes
        self.total[key] += nbytes
        self.total_fp32[key] += fp32_bytes

    def add_wait(self, seconds: float) -> None:
        self.epoch_wait_s += seconds
        self.total_wait_s += seconds

    def add_codec(self, seconds: float) -> None:
        self.epoch_codec_s += seconds
        self.total_codec_s += seconds

    def reset_epoch(self) -> None:
        self.epoch.clear()
        self.epoch_fp32.clear()
        self.epoch_wait_s = 0.0
        self.epoch_codec_s = 0.0

    def restore_totals(self, total: dict, total_fp32: dict) -> None:
        """Continue the totals of a checkpointed run."""
        self.total.update(total)
        self.total_fp32.update(total_fp32)

    @staticmethod
    def sum_traffic(counts: dict[tuple[str, str], int], traffic: Traffic) -> int:
        """All layers' bytes of one kind of traffic."""
        return sum(v for (_, t), v in counts.items() if t == traffic)
