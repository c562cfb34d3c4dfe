"""Tests of the wire format (lightning_halo.quant.format): record bytes, header precision, sizes, checks."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from lightning_halo.quant import SUPPORTED_BITS, QuantizedRows, dequantize, quantize, row_nbytes
from tests.quant.rows import DEVICE, LOW_BITS, adversarial_rows, gen, on_device, structured, unpack_all_slots


@on_device
@pytest.mark.parametrize("bits", LOW_BITS)
@pytest.mark.parametrize("d", [1, 3, 7, 9, 37, 257])
def test_codes_in_range_and_padding_zero(impl, bits, d):
    x = adversarial_rows(d)
    L = 2**bits - 1
    for seed in range(3):
        q = quantize(x.to(DEVICE), bits, gen(seed))
        q = QuantizedRows(q.data.cpu(), q.bits, q.d, q.dtype)
        slots = unpack_all_slots(q.data, d, bits)
        assert (slots >= 0).all() and (slots <= L).all()
        assert (slots[:, d:] == 0).all(), "padding codes must be zero"
        assert torch.equal(q.codes, torch.from_numpy(slots[:, :d]).to(torch.uint8))
        z, s = q.zero.double(), q.scale.double()
        xd = x.double()
        mn, mx = xd.min(1).values, xd.max(1).values
        nonconst = mx > mn
        # Grid covers the row: z <= min, z + L*s >= max (rounding only widens it).
        assert (z[nonconst] <= mn[nonconst]).all()
        top = z + L * s
        assert (top[nonconst] >= (mx - 2.0**-21 * (mx - z))[nonconst]).all()
        # Stochastic rounding picks a neighbouring grid point: |err| <= s.
        y = dequantize(q).double()
        slack = 1e-6 * xd.abs() + 1e-45
        assert ((y - xd).abs() <= s[:, None] + slack).all()


@on_device
@pytest.mark.parametrize("bits", LOW_BITS)
def test_metadata_precision(impl, bits):
    x = structured(200, 37, seed=11)
    x[:50] += 1e4  # rows with |min| >> range
    q = quantize(x.to(DEVICE), bits, gen(0))
    q = QuantizedRows(q.data.cpu(), q.bits, q.d, q.dtype)
    L = 2**bits - 1
    mn, mx = x.double().min(1).values, x.double().max(1).values
    z, s = q.zero.double(), q.scale.double()
    nc = mx > mn
    # zero-point: 24-bit float rounded toward -inf, within 2**-15 relative of |min|
    assert (z[nc] <= mn[nc]).all()
    assert ((mn - z)[nc] <= 2.0**-15 * mn[nc].abs()).all()
    assert (q.zero.view(torch.int32)[nc] & 0xFF == 0).all()
    # scale: >= the ideal (max-min)/L, at most ~2**-8 relative above (max-z)/L
    assert (s[nc] >= ((mx - mn) / L)[nc] * (1 - 2.0**-22)).all()
    assert (s[nc] <= ((mx - z) / L)[nc] * (1 + 2.0**-8) * (1 + 2.0**-22)).all()
    assert (q.scale.view(torch.int32)[nc] & 0x7FFF == 0).all()


@on_device
def test_record_bytes_exact():
    # Row [1, 3], 1 bit: z = 1.0, s = 2.0 (e = 128, m = 0); x=1 -> code 0, x=3 -> code 1.
    q = quantize(torch.tensor([[1.0, 3.0]], device=DEVICE), 1, gen(0))
    assert q.data[0].tolist() == [0b10, 0x00, 0x00, 0x80, 0x3F, 0x80]
    # Constant row: e = 0, m0..m3 = little-endian float32 bits of the value.
    q = quantize(torch.tensor([[-7.3] * 3], device=DEVICE), 4, gen(0))
    assert q.data[0, 2:].tolist() == list(struct.pack("<f", -7.3)) + [0]
    assert q.data[0, :2].tolist() == [0, 0]
    # Negative min with non-zero low mantissa byte rounds away from zero.
    q = quantize(torch.tensor([[-1.1, 2.0]], device=DEVICE), 8, gen(0))
    zbits = struct.unpack("<I", struct.pack("<f", -1.1))[0]
    expect = ((zbits & ~0xFF) + 0x100) & 0xFFFFFFFF
    assert q.zero.view(torch.int32).item() & 0xFFFFFFFF == expect


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_sizes(impl, bits, dtype):
    for n, d in [(0, 5), (3, 0), (0, 0), (5, 1), (7, 37), (4, 256)]:
        x = torch.randn(n, d).to(dtype)
        q = quantize(x, bits, gen(0))
        r = row_nbytes(d, bits, dtype)
        assert q.data.shape == (n, r) and q.nbytes == n * r and q.n == n
        if bits <= 8:
            assert r == math.ceil(d * bits / 8) + 5
        y = dequantize(q)
        assert y.shape == (n, d) and y.dtype == dtype
    assert row_nbytes(256, 1) == 37
    assert row_nbytes(256, 1) <= 1.05 * (32 + 4)
    assert 256 * 4 / row_nbytes(256, 1) >= 25
    assert row_nbytes(10, 16) == 20 and row_nbytes(10, 32, torch.float64) == 80


def test_validation_errors():
    x = torch.randn(4, 4)
    for bits in (0, 3, 5, 64, 2.0, True):
        with pytest.raises(ValueError, match=r"\(1, 2, 4, 8, 16, 32\)"):
            quantize(x, bits)
        with pytest.raises(ValueError, match=r"\(1, 2, 4, 8, 16, 32\)"):
            row_nbytes(4, bits)
    with pytest.raises(ValueError, match="2-D"):
        quantize(torch.randn(4), 8)
    with pytest.raises(ValueError, match="2-D"):
        quantize(torch.randn(2, 3, 4), 8)
    with pytest.raises(ValueError, match="floating"):
        quantize(torch.ones(3, 3, dtype=torch.int64), 8)
    with pytest.raises(ValueError, match="n\\*R"):
        QuantizedRows.from_buffer(torch.zeros(10, dtype=torch.uint8), 3, 4, 8)
    with pytest.raises(ValueError, match="bits <= 8"):
        _ = quantize(x, 16).scale
    with pytest.raises(ValueError):
        quantize(x, 8, out=torch.zeros(5, dtype=torch.uint8))
