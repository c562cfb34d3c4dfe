"""Fused single-pass CPU kernels (numba) for the halo row codec.

This module is imported lazily by :mod:`lightning_halo.quant.backend` the first
time a CPU tensor is (de)quantized; if numba is missing the import fails and
the codec uses its pure-torch path (:mod:`lightning_halo.quant._torch`). Both
paths produce bit-identical buffers (tested), so the choice is purely a speed
one. Where the compiled kernels are cached: :mod:`lightning_halo.quant.kernel_cache`.

Design notes (why the kernels look the way they do):

* One kernel per ``bits`` value. A shared body is inlined at numba-IR level
  (``inline="always"``) into thin wrappers that pass ``bits`` as a literal, so
  LLVM sees compile-time constants (``L``, codes per byte) and folds the
  ``if BITS == ...`` branches away.
* The per-element work lives in small LLVM intrinsics that operate on ``i32``.
  numba's typing widens every ``uint32`` expression to 64 bits, and LLVM then
  vectorises the hash with 64-bit lanes (``vpmullq``), which halved throughput.
* The row min/max is taken over order-preserving integer keys of the float32
  bit patterns: an integer reduction vectorises without fast-math flags, has
  well-defined results for ``-0.0``/``+0.0``, and NaN/Inf show up as keys
  beyond those of +/-inf, so the non-finite check is exact and free.
* No fast-math: ``(x - z) * inv + u`` must not be contracted into an FMA or the
  codes would differ from the torch path in the last bit.
* Codes are first written one per byte into an L1-resident scratch row, then
  packed with SWAR tricks on 16/32/64-bit words (one word load per output
  byte), which keeps both loops contiguous and vectorisable.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["quantize_rows", "dequantize_rows", "dispatchers"]

# error_model="numpy": no ZeroDivisionError branch in the float divisions
# (the divisors are provably non-zero); cache=True pays the JIT once per machine.
_JIT = dict(nogil=True, boundscheck=False, cache=True, error_model="numpy")

_I32 = ir.IntType(32)
_F32 = ir.FloatType()


def _as_i32(builder: ir.IRBuilder, val: ir.Value, ty: types.Integer) -> ir.Value:
    if ty.bitwidth > 32:
        return builder.trunc(val, _I32)
    if ty.bitwidth < 32:
        return builder.sext(val, _I32) if ty.signed else builder.zext(val, _I32)
    return val


def _lowbias32_ir(builder: ir.IRBuilder, k: ir.Value) -> ir.Value:
    # lowbias32 integer hash (Chris Wellons), all ops on i32 (wrapping).
    c = lambda v: ir.Constant(_I32, v)  # noqa: E731
    h = builder.xor(k, builder.lshr(k, c(16)))
    h = builder.mul(h, c(0x7FEB352D))
    h = builder.xor(h, builder.lshr(h, c(15)))
    h = builder.mul(h, c(0x846CA68B))
    return builder.xor(h, builder.lshr(h, c(16)))


@intrinsic
def _f32_bits(typingctx, v):
    """float32 -> int32 bit pattern (bitcast)."""
    if v != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _I32)

    return types.int32(v), codegen


@intrinsic
def _bits_f32(typingctx, v):
    """Integer (low 32 bits) -> float32 with that bit pattern (bitcast)."""
    if not isinstance(v, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(_as_i32(builder, args[0], v), _F32)

    return types.float32(v), codegen


@intrinsic
def _sr_uniform(typingctx, k):
    """Counter (low 32 bits used) -> u = (lowbias32(k) >> 8) * 2**-24 in [0, 1)."""
    if not isinstance(k, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        h = _lowbias32_ir(builder, _as_i32(builder, args[0], k))
        h = builder.lshr(h, ir.Constant(_I32, 8))
        # h < 2**24: signed conversion is exact and maps to one vcvtdq2ps.
        f = builder.sitofp(h, _F32)
        return builder.fmul(f, ir.Constant(_F32, 2.0**-24))

    return types.float32(k), codegen


@intrinsic
def _bf16_sr(typingctx, x, k):
    """Stochastically round float32 ``x`` to bfloat16 bits with counter ``k``."""
    if x != types.float32 or not isinstance(k, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        c = lambda v: ir.Constant(_I32, v)  # noqa: E731
        p = builder.bitcast(args[0], _I32)
        r = builder.and_(_lowbias32_ir(builder, _as_i32(builder, args[1], k)), c(0xFFFF))
        q = builder.lshr(builder.add(p, r), c(16))
        # Rounding a finite value up into the inf/NaN exponent: truncate instead.
        to_inf = builder.icmp_unsigned("==", builder.and_(q, c(0x7F80)), c(0x7F80))
        q = builder.select(to_inf, builder.lshr(p, c(16)), q)
        return builder.trunc(q, ir.IntType(16))

    return types.uint16(x, k), codegen


@njit(inline="always")
def _quant_body(x, out, scratch, seed, BITS):
    n, d = x.shape
    L = (1 << BITS) - 1
    cb = (d * BITS + 7) // 8
    s64 = scratch.view(np.uint64)
    s32 = scratch.view(np.uint32)
    s16 = scratch.view(np.uint16)
    fL = np.float32(L)
    for i in range(n):
        row = x[i]
        orow = out[i]
        # Pass 1: min/max over order-preserving int keys of the float32 bits.
        kmin = np.int32(0x7FFFFFFF)
        kmax = np.int32(-0x80000000)
        for j in range(d):
            b = _f32_bits(np.float32(row[j]))
            k = np.int32(b ^ ((b >> np.int32(31)) & np.int32(0x7FFFFFFF)))
            kmin = min(kmin, k)
            kmax = max(kmax, k)
        # key(+inf) = 0x7F800000, key(-inf) = -0x7F800001; NaNs lie beyond.
        if kmax >= np.int32(0x7F800000) or kmin <= np.int32(-0x7F800001):
            return i
        mnb = np.int32(kmin ^ ((kmin >> np.int32(31)) & np.int32(0x7FFFFFFF)))
        mxb = np.int32(kmax ^ ((kmax >> np.int32(31)) & np.int32(0x7FFFFFFF)))
        if kmin == kmax:
            # Constant row: exact value in m0..m3, e = 0, all codes 0.
            zb = mnb
            m0 = np.int32(zb & np.int32(0xFF))
            e = np.int32(0)
            z = _bits_f32(mnb)
            inv = np.float32(0.0)
        else:
            # Zero-point: min rounded toward -inf to 8 zero low mantissa bits.
            zb = np.int32(mnb & np.int32(-256))
            if mnb < 0 and (mnb & np.int32(0xFF)) != 0:
                zb = np.int32(zb + np.int32(256))
            z = _bits_f32(zb)
            s = (_bits_f32(mxb) - z) / fL
            sb = _f32_bits(s)
            # Scale: rounded up to 8 mantissa bits, at least 2**-126.
            if (sb & np.int32(0x7FFF)) != 0:
                sb = np.int32((sb & np.int32(-32768)) + np.int32(32768))
            if sb < np.int32(0x00800000):
                sb = np.int32(0x00800000)
            if sb >= np.int32(0x7F800000):  # range overflowed float32
                return i
            inv = np.float32(1.0) / _bits_f32(sb)
            e = np.int32(sb >> np.int32(23))
            m0 = np.int32((sb >> np.int32(15)) & np.int32(0xFF))
        orow[cb] = np.uint8(m0)
        orow[cb + 1] = np.uint8((zb >> np.int32(8)) & np.int32(0xFF))
        orow[cb + 2] = np.uint8((zb >> np.int32(16)) & np.int32(0xFF))
        orow[cb + 3] = np.uint8((zb >> np.int32(24)) & np.int32(0xFF))
        orow[cb + 4] = np.uint8(e)
        # Pass 2: stochastic-rounding codes, one per byte (row is in L1 now).
        base = (seed + i * d) & 0xFFFFFFFF
        dst = orow if BITS == 8 else scratch
        for j in range(d):
            t = (np.float32(row[j]) - z) * inv + _sr_uniform(base + j)
            # t >= 0, so truncation == floor; clamp guards rounding at the top.
            c = min(max(np.int32(t), np.int32(0)), np.int32(L))
            dst[j] = np.uint8(c)
        # Pass 3: SWAR pack (padding slots of scratch are always zero).
        if BITS == 1:
            for b in range(cb):
                orow[b] = np.uint8((s64[b] * np.uint64(0x0102040810204080)) >> np.uint64(56))
        elif BITS == 2:
            for b in range(cb):
                w = s32[b]
                w = w | (w >> np.uint32(6))
                w = w | (w >> np.uint32(12))
                orow[b] = np.uint8(w & np.uint32(0xFF))
        elif BITS == 4:
            for b in range(cb):
                w = s16[b]
                orow[b] = np.uint8((w | (w >> np.uint16(4))) & np.uint16(0xFF))
    return -1


@njit(**_JIT)
def _q1(x, out, scratch, seed):
    return _quant_body(x, out, scratch, seed, 1)


@njit(**_JIT)
def _q2(x, out, scratch, seed):
    return _quant_body(x, out, scratch, seed, 2)


@njit(**_JIT)
def _q4(x, out, scratch, seed):
    return _quant_body(x, out, scratch, seed, 4)


@njit(**_JIT)
def _q8(x, out, scratch, seed):
    return _quant_body(x, out, scratch, seed, 8)


@njit(**_JIT)
def _q16(x, out16, seed):
    n, d = x.shape
    for i in range(n):
        row = x[i]
        orow = out16[i]
        base = (seed + i * d) & 0xFFFFFFFF
        amax = np.int32(0)
        for j in range(d):
            xv = np.float32(row[j])
            amax = max(amax, np.int32(_f32_bits(xv) & np.int32(0x7FFFFFFF)))
            orow[j] = _bf16_sr(xv, base + j)
        if amax >= np.int32(0x7F800000):
            return i
    return -1


@njit(inline="always")
def _dequant_body(data, out, scratch, BITS):
    n, d = out.shape
    cb = (d * BITS + 7) // 8
    s64 = scratch.view(np.uint64)
    s32 = scratch.view(np.uint32)
    s16 = scratch.view(np.uint16)
    for i in range(n):
        rec = data[i]
        orow = out[i]
        m0 = np.int32(rec[cb])
        e = np.int32(rec[cb + 4])
        hi = np.int32(
            (np.int32(rec[cb + 1]) << np.int32(8))
            | (np.int32(rec[cb + 2]) << np.int32(16))
            | (np.int32(rec[cb + 3]) << np.int32(24))
        )
        if e == 0:
            # Constant row; s = -0.0 keeps z + c * s == z bitwise, even for z = -0.0.
            z = _bits_f32(hi | m0)
            s = np.float32(-0.0)
        else:
            z = _bits_f32(hi)
            s = _bits_f32((e << np.int32(23)) | (m0 << np.int32(15)))
        if BITS == 8:
            for j in range(d):
                # c * s is exact (<= 17 significant bits), so FMA or not is identical.
                orow[j] = z + np.float32(rec[j]) * s
        else:
            if BITS == 1:
                for b in range(cb):
                    # Spread bit k to byte k: replicate, isolate, then map 2**k -> 0x80.
                    v = np.uint64(rec[b]) * np.uint64(0x0101010101010101)
                    v = (v & np.uint64(0x8040201008040201)) + np.uint64(0x00406070787C7E7F)
                    s64[b] = (v >> np.uint64(7)) & np.uint64(0x0101010101010101)
            elif BITS == 2:
                for b in range(cb):
                    v = np.uint32(rec[b])
                    v = v | (v << np.uint32(6)) | (v << np.uint32(12)) | (v << np.uint32(18))
                    s32[b] = v & np.uint32(0x03030303)
            elif BITS == 4:
                for b in range(cb):
                    v = np.uint16(rec[b])
                    s16[b] = (v | (v << np.uint16(4))) & np.uint16(0x0F0F)
            for j in range(d):
                orow[j] = z + np.float32(scratch[j]) * s


@njit(**_JIT)
def _dq1(data, out, scratch):
    _dequant_body(data, out, scratch, 1)


@njit(**_JIT)
def _dq2(data, out, scratch):
    _dequant_body(data, out, scratch, 2)


@njit(**_JIT)
def _dq4(data, out, scratch):
    _dequant_body(data, out, scratch, 4)


@njit(**_JIT)
def _dq8(data, out, scratch):
    _dequant_body(data, out, scratch, 8)


_QUANT = {1: _q1, 2: _q2, 4: _q4, 8: _q8}
_DEQUANT = {1: _dq1, 2: _dq2, 4: _dq4, 8: _dq8}


def _scratch(d: int) -> np.ndarray:
    # One code byte per column, padded to whole 64-bit words; padding stays 0.
    return np.zeros(((d + 7) // 8) * 8 + 8, dtype=np.uint8)


def dispatchers(bits: int) -> tuple:
    """The numba dispatchers :func:`quantize_rows` / :func:`dequantize_rows` use for ``bits``
    (their ``stats`` tell whether a call compiled or loaded from the cache)."""
    if bits == 16:
        return (_q16,)
    return (_QUANT[bits], _DEQUANT[bits])


def quantize_rows(x: np.ndarray, out: np.ndarray, seed: int, bits: int) -> int:
    """Quantize C-contiguous float32/float64 rows ``x`` [n, d] into ``out``.

    Args:
        x: Input rows, float32 or float64, C-contiguous, n >= 1 and d >= 1.
        out: Destination, uint8 [n, R] for bits <= 8, uint16 [n, d] for bits 16.
        seed: Per-call 32-bit counter offset.
        bits: One of 1, 2, 4, 8, 16.

    Returns:
        -1 on success, else the index of the first row that could not be
        encoded (non-finite value, or max - min overflows float32).
    """
    if bits == 16:
        return int(_q16(x, out, seed))
    return int(_QUANT[bits](x, out, _scratch(x.shape[1]), seed))


def dequantize_rows(data: np.ndarray, out: np.ndarray, bits: int) -> None:
    """Decode uint8 row records ``data`` [n, R] (bits <= 8) into ``out`` [n, d].

    Args:
        data: Row records as produced by :func:`quantize_rows`.
        out: C-contiguous float32 or float64 destination.
        bits: One of 1, 2, 4, 8.
    """
    _DEQUANT[bits](data, out, _scratch(out.shape[1]))
