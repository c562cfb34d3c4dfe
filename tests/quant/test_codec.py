"""Tests of the halo row codec (lightning_halo.quant): format, bounds, statistics, impl parity."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

from lightning_halo.quant import (
    SUPPORTED_BITS,
    NonFiniteError,
    QuantizedRows,
    dequantize,
    get_impl,
    numba_available,
    quantize,
    row_nbytes,
    set_impl,
    use_impl,
)
from lightning_halo.quant import codec

LOW_BITS = (1, 2, 4, 8)
IMPLS = ["torch"] + (["numba"] if numba_available() else [])
needs_numba = pytest.mark.skipif(not numba_available(), reason="numba not installed")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(params=IMPLS)
def impl(request):
    with use_impl(request.param):
        yield request.param


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


# --------------------------------------------------------------------------- 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_bits32_bitwise_exact(impl, dtype):
    x = structured(50, 37, dtype=dtype)
    x[3, 4] = -0.0
    x[4, 5] = torch.finfo(dtype).tiny / 4  # subnormal
    q = quantize(x, 32, gen(0))
    assert q.data.shape == (50, 37 * x.element_size())
    y = dequantize(q)
    assert y.dtype == dtype
    assert torch.equal(y.view(torch.uint8), x.view(torch.uint8))


def test_bits16_bf16_rounding(impl):
    x = structured(64, 37, seed=3)
    x[5, :] = torch.logspace(-30, 30, 37)
    y = dequantize(quantize(x, 16, gen(1)))
    assert y.dtype == torch.float32
    assert ((y - x).abs() < 2.0**-7 * x.abs()).logical_or(y == x).all()
    xb = x.bfloat16().float()  # representable input: exact
    assert torch.equal(dequantize(quantize(xb, 16, gen(2))), xb)
    # bf16 keeps float32's exponent range: no overflow/underflow as fp16 would.
    big = torch.tensor([[3.0e38, -3.0e38, 1e-37, 6e4, torch.finfo(torch.float32).max]])
    yb = dequantize(quantize(big, 16, gen(3)))
    assert torch.isfinite(yb).all()
    assert ((yb - big).abs() <= 2.0**-7 * big.abs()).all()


# --------------------------------------------------------------------------- 2


@pytest.mark.parametrize("bits", LOW_BITS)
def test_constant_rows_exact(impl, bits):
    consts = torch.tensor(
        [0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 3e20, -3e20, 1e-45, 3.4e38, -3.4e38, 0.1, -7.3]
    )
    g = gen(bits)
    consts = torch.cat([consts, torch.randn(40, generator=g) * 10.0 ** torch.randint(-20, 20, (40,), generator=g)])
    for d in (1, 3, 37, 64):
        x = consts[:, None].repeat(1, d)
        q = quantize(x, bits, gen(7))
        assert (q.scale == 0).all() and (q.codes == 0).all()
        y = dequantize(q)
        assert torch.equal(y.view(torch.int32), x.view(torch.int32)), d
    # float64 constant rows round-trip to their float32 value.
    x64 = torch.full((3, 5), 0.1, dtype=torch.float64)
    y64 = dequantize(quantize(x64, bits, gen(8)))
    assert y64.dtype == torch.float64
    assert torch.equal(y64, x64.float().double())


# --------------------------------------------------------------------------- 3


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


@pytest.mark.parametrize("bits", LOW_BITS)
@pytest.mark.parametrize("d", [1, 3, 7, 9, 37, 257])
def test_codes_in_range_and_padding_zero(impl, bits, d):
    x = adversarial_rows(d)
    L = 2**bits - 1
    for seed in range(3):
        q = quantize(x, bits, gen(seed))
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


@pytest.mark.parametrize("bits", LOW_BITS)
def test_metadata_precision(impl, bits):
    x = structured(200, 37, seed=11)
    x[:50] += 1e4  # rows with |min| >> range
    q = quantize(x, bits, gen(0))
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


def test_record_bytes_exact():
    # Row [1, 3], 1 bit: z = 1.0, s = 2.0 (e = 128, m = 0); x=1 -> code 0, x=3 -> code 1.
    q = quantize(torch.tensor([[1.0, 3.0]]), 1, gen(0))
    assert q.data[0].tolist() == [0b10, 0x00, 0x00, 0x80, 0x3F, 0x80]
    # Constant row: e = 0, m0..m3 = little-endian float32 bits of the value.
    q = quantize(torch.tensor([[-7.3] * 3]), 4, gen(0))
    assert q.data[0, 2:].tolist() == list(struct.pack("<f", -7.3)) + [0]
    assert q.data[0, :2].tolist() == [0, 0]
    # Negative min with non-zero low mantissa byte rounds away from zero.
    q = quantize(torch.tensor([[-1.1, 2.0]]), 8, gen(0))
    zbits = struct.unpack("<I", struct.pack("<f", -1.1))[0]
    expect = ((zbits & ~0xFF) + 0x100) & 0xFFFFFFFF
    assert q.zero.view(torch.int32).item() & 0xFFFFFFFF == expect


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


# --------------------------------------------------------------------------- 4


TRIALS = 4000
COPIES = 500  # rows stacked per call; TRIALS // COPIES calls with different seeds


def sample_dequant(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, QuantizedRows]:
    """TRIALS independent dequantized copies of x: [TRIALS, n, d] float64."""
    n, d = x.shape
    outs, q = [], None
    stacked = x.repeat(COPIES, 1)  # distinct rows -> distinct counters
    for call in range(TRIALS // COPIES):
        q = quantize(stacked, bits, gen(1000 + call))
        outs.append(dequantize(q).double().view(COPIES, n, d))
    return torch.cat(outs), QuantizedRows(q.data[:n], bits, d, x.dtype)


def max_z_score(samples: torch.Tensor, x: torch.Tensor, sd_bound: torch.Tensor) -> float:
    """Largest |mean - x| / (sd_bound / sqrt(T)), with a small float32 slack."""
    err = (samples.mean(0) - x.double()).abs() - 1e-6 * x.double().abs()
    return float((err.clamp(min=0) / (sd_bound / math.sqrt(samples.shape[0]))).max())


K_SIGMA = 6.0


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


# --------------------------------------------------------------------------- 5


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


# --------------------------------------------------------------------------- 6


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
    monkeypatch.setattr(codec, "_numba_mod", None)
    monkeypatch.setattr(codec, "_numba_failed", True)
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


# --------------------------------------------------------------------------- 7


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


# --------------------------------------------------------------------------- 8


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_from_buffer_and_row_slices(impl, bits, dtype):
    n, d = 40, 37
    x = structured(n, d, dtype=dtype)
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
    big = torch.zeros(n * r + 1, dtype=torch.uint8)
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


def test_torch_path_traceable_by_dynamo():
    # The CUDA path compiles these chunk functions; make sure dynamo traces them
    # without graph breaks (aot_eager: no C++/CUDA toolchain needed).
    x = structured(16, 37)
    z, inv, _, _ = codec._per_row_meta(x, 4)
    base = torch.tensor(123)
    fn = torch.compile(codec._codes_chunk, backend="aot_eager", dynamic=True, fullgraph=True)
    assert torch.equal(fn(x, z, inv, base, 4), codec._codes_chunk(x, z, inv, base, 4))
    fn16 = torch.compile(codec._bf16_chunk, backend="aot_eager", dynamic=True, fullgraph=True)
    assert torch.equal(fn16(x, base), codec._bf16_chunk(x, base))
    q = quantize(x, 4, gen(0))
    z, s = codec._decode_meta(q.data, 37, 4)
    fdq = torch.compile(codec._dequant_fn(37, 4), backend="aot_eager", dynamic=True, fullgraph=True)
    assert torch.equal(fdq(q.data, z, s), dequantize(q))
