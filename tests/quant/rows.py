"""Test inputs shared by the codec tests: generators, structured and adversarial rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_halo.quant import numba_available
from tests.support.device import DEVICE

LOW_BITS = (1, 2, 4, 8)
IMPLS = ["torch"] + (["numba"] if numba_available() else [])
needs_numba = pytest.mark.skipif(not numba_available(), reason="numba not installed")
#: Marks a test that runs on ``LIGHTNING_HALO_DEVICE`` (its inputs are created there).
on_device = pytest.mark.device
__all__ = ["DEVICE", "IMPLS", "LOW_BITS", "adversarial_rows", "gen", "needs_numba", "on_device", "structured", "unpack_all_slots"]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def structured(n: int, d: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Rows with varied offsets/scales, a constant row and a row with a repeated max."""
    g = gen(seed)
    x = torch.randn(n, d, generator=g) * torch.rand(n, 1, generator=g) * 5
    x += torch.randn(n, 1, generator=g) * 3
    if n > 2:
        x[1] = 0.75
        x[2, : max(1, d // 2)] = x[2].max()
    return x.to(dtype)


def unpack_all_slots(data: torch.Tensor, d: int, bits: int) -> np.ndarray:
    """Independent numpy unpacking of every code slot, padding included."""
    cb = (d * bits + 7) // 8
    raw = data[:, :cb].numpy().astype(np.int64)
    per = 8 // bits
    slots = [(raw >> (k * bits)) & ((1 << bits) - 1) for k in range(per)]
    return np.stack(slots, axis=-1).reshape(raw.shape[0], cb * per)


def adversarial_rows(d: int) -> torch.Tensor:
    g = gen(d)
    rows = [
        torch.randn(d, generator=g),
        torch.full((d,), 2.0).index_fill_(0, torch.tensor([d - 1]), 5.0),  # all equal but one
        torch.full((d,), 2.0).index_fill_(0, torch.tensor([0]), -5.0),
        torch.linspace(-1e30, 1e30, d) if d > 1 else torch.tensor([1e30]),  # huge range
        torch.tensor([-1e30, 1e30] * d)[:d],
        1.0 + torch.arange(d, dtype=torch.float32) * 1.1920929e-07,  # 1 + k ulp
        torch.randn(d, generator=g) * 1e-38,  # subnormal-ish tiny values
        torch.randn(d, generator=g).abs() + 1e6,  # |min| >> range
        -torch.randn(d, generator=g).abs() - 1e6,
        torch.randn(d, generator=g) * 1e4,  # mixed signs
        torch.full((d,), -1.1).index_fill_(0, torch.tensor([d // 2]), 3.3),
    ]
    x = torch.stack(rows)
    x[:, -1] = x.max(1).values  # value exactly at max in the last (padded) column
    return x
