"""Tests of the backend choice (lightning_halo.quant.backend): numba vs torch parity, selection, fallback."""

from __future__ import annotations

import pytest
import torch

from lightning_halo.quant import SUPPORTED_BITS, dequantize, get_impl, numba_available, quantize, set_impl, use_impl
from lightning_halo.quant import backend
from tests.quant.rows import adversarial_rows, gen, needs_numba, structured

SHAPES = [(1, 1), (1, 3), (1, 8), (2, 7), (5, 37), (64, 8), (9, 64), (13, 257), (300, 100)]


@needs_numba
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_torch_numba_identical(bits, dtype):
    for k, (n, d) in enumerate(SHAPES):
        x = structured(n, d, seed=k, dtype=dtype)
        if n * d > 10:
            x.view(-1)[:: 7] = x.view(-1)[0]  # ties with the first value
        with use_impl("torch"):
            qt = quantize(x, bits, gen(k))
        with use_impl("numba"):
            qn = quantize(x, bits, gen(k))
        assert torch.equal(qt.data, qn.data), (n, d)
        for out_dtype in (None, torch.float64, torch.bfloat16):
            with use_impl("torch"):
                yt = dequantize(qt, out_dtype)
            with use_impl("numba"):
                yn = dequantize(qt, out_dtype)
            assert torch.equal(yt, yn), (n, d, out_dtype)
    adv = adversarial_rows(37)
    if dtype == torch.float16:
        adv = adv.clamp(-6e4, 6e4)  # keep the ±1e30 rows finite in fp16
    with use_impl("torch"):
        at = quantize(adv.to(dtype), bits, gen(1))
    with use_impl("numba"):
        an = quantize(adv.to(dtype), bits, gen(1))
    assert torch.equal(at.data, an.data)


def test_fallback_without_numba(monkeypatch):
    # Simulate a machine without numba: auto mode must use the torch path.
    monkeypatch.setattr(backend, "_numba_kernels", None)
    monkeypatch.setattr(backend, "_numba_failed", True)
    assert not numba_available() and get_impl() == "torch"
    with pytest.raises(RuntimeError):
        set_impl("numba")
    x = structured(10, 37)
    assert dequantize(quantize(x, 4, gen(0))).shape == (10, 37)


def test_impl_selection(monkeypatch):
    with pytest.raises(ValueError, match="auto"):
        set_impl("fast")
    with use_impl("torch"):
        assert get_impl() == "torch"
    monkeypatch.setenv("LIGHTNING_HALO_NUMBA", "0")
    assert get_impl() == "torch"
    monkeypatch.setenv("LIGHTNING_HALO_NUMBA", "1")
    assert get_impl() == ("numba" if numba_available() else "torch")
