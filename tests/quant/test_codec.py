"""Tests of the public codec (lightning_halo.quant.codec): round trips, statistics, errors, buffers."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_halo.quant import SUPPORTED_BITS, NonFiniteError, QuantizedRows, dequantize, quantize, row_nbytes
from tests.quant.rows import DEVICE, LOW_BITS, gen, on_device, structured


@on_device
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_bits32_bitwise_exact(impl, dtype):
    x = structured(50, 37, dtype=dtype).to(DEVICE)
    x[3, 4] = -0.0
    x[4, 5] = torch.finfo(dtype).tiny / 4  # subnormal
    q = quantize(x, 32, gen(0))
    assert q.data.shape == (50, 37 * x.element_size())
    y = dequantize(q)
    assert y.dtype == dtype
    assert torch.equal(y.view(torch.uint8), x.view(torch.uint8))


@on_device
def test_bits16_bf16_rounding(impl):
    x = structured(64, 37, seed=3).to(DEVICE)
    x[5, :] = torch.logspace(-30, 30, 37)
    y = dequantize(quantize(x, 16, gen(1)))
    assert y.dtype == torch.float32
    assert ((y - x).abs() < 2.0**-7 * x.abs()).logical_or(y == x).all()
    xb = x.bfloat16().float()  # representable input: exact
    assert torch.equal(dequantize(quantize(xb, 16, gen(2))), xb)
    # bf16 keeps float32's exponent range: no overflow/underflow as fp16 would.
    big = torch.tensor([[3.0e38, -3.0e38, 1e-37, 6e4, torch.finfo(torch.float32).max]], device=DEVICE)
    yb = dequantize(quantize(big, 16, gen(3)))
    assert torch.isfinite(yb).all()
    assert ((yb - big).abs() <= 2.0**-7 * big.abs()).all()


@on_device
@pytest.mark.parametrize("bits", LOW_BITS)
def test_constant_rows_exact(impl, bits):
    consts = torch.tensor(
        [0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 3e20, -3e20, 1e-45, 3.4e38, -3.4e38, 0.1, -7.3]
    )
    g = gen(bits)
    consts = torch.cat([consts, torch.randn(40, generator=g) * 10.0 ** torch.randint(-20, 20, (40,), generator=g)])
    for d in (1, 3, 37, 64):
        x = consts[:, None].repeat(1, d).to(DEVICE)
        q = quantize(x, bits, gen(7))
        assert (q.scale == 0).all() and (q.codes == 0).all()
        y = dequantize(q)
        assert torch.equal(y.view(torch.int32), x.view(torch.int32)), d
    # float64 constant rows round-trip to their float32 value.
    x64 = torch.full((3, 5), 0.1, dtype=torch.float64, device=DEVICE)
    y64 = dequantize(quantize(x64, bits, gen(8)))
    assert y64.dtype == torch.float64
    assert torch.equal(y64, x64.float().double())


def test_overflowing_range_raises(impl):
    x = torch.tensor([[0.0, 1.0], [-3.0e38, 3.0e38]])
    for bits in LOW_BITS:
        with pytest.raises(ValueError, match=r"row 1") as ei:
            quantize(x, bits, gen(0), where="layer 0 halo")
        assert not isinstance(ei.value, NonFiniteError)
        assert "layer 0 halo" in str(ei.value)
    x64 = torch.tensor([[1.0, 2.0], [1.0, 1e300]], dtype=torch.float64)
    for bits in (1, 8, 16):
        with pytest.raises(ValueError, match="float32 range") as ei:
            quantize(x64, bits, gen(0))
        assert not isinstance(ei.value, NonFiniteError)
    # bits=32 sends float64 raw: no range limit.
    assert torch.equal(dequantize(quantize(x64, 32)), x64)


# --------------------------------------------------------------------------- statistics


TRIALS = 4000
COPIES = 500  # rows stacked per call; TRIALS // COPIES calls with different seeds


def sample_dequant(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, QuantizedRows]:
    """TRIALS independent dequantized copies of x (encoded and decoded on DEVICE): [TRIALS, n, d] float64."""
    n, d = x.shape
    outs, q = [], None
    stacked = x.repeat(COPIES, 1).to(DEVICE)  # distinct rows -> distinct counters
    for call in range(TRIALS // COPIES):
        q = quantize(stacked, bits, gen(1000 + call))
        outs.append(dequantize(q).double().view(COPIES, n, d).cpu())
    return torch.cat(outs), QuantizedRows(q.data[:n].cpu(), bits, d, x.dtype)


def max_z_score(samples: torch.Tensor, x: torch.Tensor, sd_bound: torch.Tensor) -> float:
    """Largest |mean - x| / (sd_bound / sqrt(T)), with a small float32 slack."""
    err = (samples.mean(0) - x.double()).abs() - 1e-6 * x.double().abs()
    return float((err.clamp(min=0) / (sd_bound / math.sqrt(samples.shape[0]))).max())


K_SIGMA = 6.0


@on_device
@pytest.mark.parametrize("bits", LOW_BITS)
def test_unbiased_and_variance_bound(bits):
    x = structured(64, 37, seed=5)
    samples, q1 = sample_dequant(x, bits)
    s = q1.scale.double()[:, None].expand_as(x)
    nc = s > 0
    # Unbiasedness with the worst-case variance s^2/4 per element.
    sd = (s / 2).clamp(min=1e-30)
    assert max_z_score(samples[:, nc], x[nc], sd[nc]) < K_SIGMA
    assert torch.equal(samples[:, ~nc], x.double()[~nc].expand(TRIALS, -1))  # constant rows
    # Per-element variance: s^2 f (1-f) <= s^2/4 (two-point distribution).
    var = samples.var(0)
    assert (var <= (s**2 / 4) * 1.1 + 1e-30).all()
    f = ((x.double() - q1.zero.double()[:, None]) / s.clamp(min=1e-30)).frac()
    ratio = var[nc].sum() / (s**2 * f * (1 - f))[nc].sum()
    assert 0.95 < float(ratio) < 1.05
    # Power check: the same statistic flags deterministic floor (u = 0) and a
    # mildly biased dither (u * 0.9), computed from the transmitted grid.
    z, L = q1.zero.double()[:, None], 2**bits - 1
    pos = (x.double() - z) / s.clamp(min=1e-30)
    floor_dq = z + pos.floor().clamp(0, L) * s
    assert max_z_score(floor_dq.expand(TRIALS, -1, -1)[:, nc], x[nc], sd[nc]) > K_SIGMA
    u = torch.rand(TRIALS, *x.shape, generator=gen(9), dtype=torch.float64) * 0.9
    dither_dq = z + (pos + u).floor().clamp(0, L) * s
    assert max_z_score(dither_dq[:, nc], x[nc], sd[nc]) > K_SIGMA


@on_device
def test_unbiased_bits16():
    x = structured(64, 37, seed=6)
    samples, _ = sample_dequant(x, 16)
    _, e = torch.frexp(x.double())
    ulp = torch.ldexp(torch.ones_like(x, dtype=torch.float64), e - 8)  # bf16 spacing
    assert max_z_score(samples, x, ulp / 2) < K_SIGMA
    assert (samples.var(0) <= ulp**2 / 4 * 1.1).all()
    # Power check: plain truncation to bf16 (what SR degenerates to without r).
    truncated = (x.view(torch.int32) & ~0xFFFF).view(torch.float32).double()
    assert max_z_score(truncated.expand(TRIALS, -1, -1), x, ulp / 2) > K_SIGMA


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_reproducible(impl, bits):
    x = structured(33, 37)
    a = quantize(x, bits, gen(5)).data
    assert torch.equal(a, quantize(x, bits, gen(5)).data)
    torch.manual_seed(3)
    b = quantize(x, bits).data.clone()
    torch.manual_seed(3)
    assert torch.equal(b, quantize(x, bits).data)
    if bits < 32:
        assert not torch.equal(a, quantize(x, bits, gen(6)).data)


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_raises(impl, bits, bad):
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = structured(20, 37).to(dtype)
        x[13, 36] = bad
        x[17, 0] = bad
        with pytest.raises(NonFiniteError, match=r"non-finite value in layer 2 halo \(row 13") as ei:
            quantize(x, bits, gen(0), where="layer 2 halo")
        assert isinstance(ei.value, ValueError)
    x = torch.tensor([[1.0, float("nan")]])
    with pytest.raises(NonFiniteError, match="non-finite value in input rows"):
        quantize(x, bits)


@on_device
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_from_buffer_and_row_slices(impl, bits, dtype):
    n, d = 40, 37
    x = structured(n, d, dtype=dtype).to(DEVICE)
    q = quantize(x, bits, gen(1))
    full = dequantize(q)
    r = row_nbytes(d, bits, dtype)
    flat = q.data.reshape(-1)
    q2 = QuantizedRows.from_buffer(flat, n, d, bits, dtype)
    assert torch.equal(dequantize(q2), full)
    for i, j in [(0, 1), (3, 17), (17, 40), (39, 40), (5, 5)]:
        # Rows i..j are bytes i*R..j*R: a peer's slice of a receive buffer.
        part = flat[i * r : j * r].clone()  # clone: arbitrary alignment of a recv buffer
        qs = QuantizedRows.from_buffer(part, j - i, d, bits, dtype)
        assert torch.equal(dequantize(qs), full[i:j])
        assert torch.equal(dequantize(QuantizedRows(q.data[i:j], bits, d, dtype)), full[i:j])
    # Unaligned byte offset (odd start inside a larger buffer) still decodes.
    big = torch.zeros(n * r + 1, dtype=torch.uint8, device=DEVICE)
    big[1:] = flat
    assert torch.equal(dequantize(QuantizedRows.from_buffer(big[1:], n, d, bits, dtype)), full)


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_out_buffers(impl, bits):
    n, d = 25, 37
    x = structured(n, d)
    r = row_nbytes(d, bits)
    send = torch.zeros(3 + n * r, dtype=torch.uint8)
    q = quantize(x, bits, gen(4), out=send[3:])
    assert q.data.data_ptr() == send[3:].data_ptr()
    assert torch.equal(q.data, quantize(x, bits, gen(4)).data)
    halo = torch.zeros(n + 10, d)
    y = dequantize(q, out=halo[10:])
    assert y.data_ptr() == halo[10:].data_ptr()
    assert torch.equal(halo[10:], dequantize(q)) and (halo[:10] == 0).all()
    y64 = dequantize(q, torch.float64, out=torch.empty(n, d, dtype=torch.float64))
    assert torch.equal(y64, dequantize(q).double())
