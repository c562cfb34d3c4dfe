"""Pure-torch kernels of the halo row codec: the reference, and what runs on CUDA.

Same entry points as the numba kernels (:mod:`._numba`)::

    quantize_rows(x, out, seed, bits) -> int     # -1, or the first row that cannot be encoded
    dequantize_rows(data, out, bits) -> None

with tensors instead of arrays: ``x`` float32 ``[n, d]`` (contiguous, ``n, d >= 1``),
``out`` the uint8 records ``[n, R]`` for every bit width (the numba kernel takes a uint16
view at 16 bits); ``dequantize_rows`` decodes records of bits 1/2/4/8 into float32 ``out``.
On CPU they produce records bit-identical to the numba kernels (tested).

Rows are processed in chunks so that the int64 temporaries of the counter hash stay
cache-sized on CPU (8 bytes x n x d at once otherwise) and bounded on CUDA. The chunk
functions take only tensors (``bits``/``d`` are closed over) so that ``torch.compile``
sees constants and dynamic shapes; :class:`TorchKernels` is given the wrapper that
compiles them (the backend passes one on CUDA, see :mod:`.backend`).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from .format import MASK32, code_nbytes, decode_meta, encode_meta, f32_to_bits, pack_codes, unpack_codes

__all__ = ["TorchKernels", "quantize_rows", "dequantize_rows"]

# Elements per chunk: keeps the int64 temporaries of the counter hash in cache-sized
# pieces on CPU; bounds them on CUDA.
CHUNK_CPU = 1 << 16
CHUNK_CUDA = 1 << 24

#: ``wrap(key, fn) -> fn'``: how a chunk function is run (identity: eager).
Wrap = Callable[[tuple, Callable], Callable]


# --------------------------------------------------------------------------- #
# Counter-based dither (uint32 emulated in int64; no int64 overflow anywhere)
# --------------------------------------------------------------------------- #


def _mul32_(a: Tensor, c: int) -> Tensor:
    """In place: ``a = (a * c) mod 2**32`` for int64 ``0 <= a < 2**32``.

    ``c`` is split into 16-bit halves so every intermediate stays below 2**49:
    no reliance on (undefined) integer overflow, on CPU or CUDA.
    """
    lo, hi = c & 0xFFFF, c >> 16
    t = a * hi
    t.bitwise_and_(0xFFFF).bitwise_left_shift_(16)
    return a.mul_(lo).add_(t).bitwise_and_(MASK32)


def lowbias32_(k: Tensor) -> Tensor:
    """In place lowbias32 hash of int64 counters in ``[0, 2**32)`` (as the numba kernels)."""
    k ^= k >> 16
    _mul32_(k, 0x7FEB352D)
    k ^= k >> 15
    _mul32_(k, 0x846CA68B)
    k ^= k >> 16
    return k


def counters(base: Tensor, m: int, d: int) -> Tensor:
    """Element (r, j) of a chunk starting at global row i0 gets ``seed + (i0 + r) * d + j``."""
    idx = torch.arange(m * d, dtype=torch.int64, device=base.device)
    return idx.add_(base).bitwise_and_(MASK32).view(m, d)


# --------------------------------------------------------------------------- #
# Chunk functions (what torch.compile sees on CUDA)
# --------------------------------------------------------------------------- #


def codes_chunk(xc: Tensor, z: Tensor, inv: Tensor, base: Tensor, bits: int) -> Tensor:
    """Stochastic codes of a float32 chunk, packed: uint8 ``[m, cb]``."""
    m, d = xc.shape
    L = (1 << bits) - 1
    h = lowbias32_(counters(base, m, d))
    u = h.bitwise_right_shift_(8).to(torch.float32).mul_(2.0**-24)  # exact: < 2**24
    # Separate sub/mul/add roundings (no FMA) to match the numba kernels bit for bit.
    t = (xc - z[:, None]).mul_(inv[:, None]).add_(u)
    c = t.floor_().clamp_(0, L).to(torch.uint8)
    return pack_codes(c, bits)


def bf16_chunk(xc: Tensor, base: Tensor) -> Tensor:
    """bfloat16 stochastic rounding of a float32 chunk: uint8 ``[m, 2d]`` (LE)."""
    m, d = xc.shape
    p = f32_to_bits(xc) & MASK32
    r = lowbias32_(counters(base, m, d)).bitwise_and_(0xFFFF)
    q = (p + r) >> 16
    # Rounding a finite value up to the inf exponent: truncate instead.
    q = torch.where((q & 0x7F80) == 0x7F80, p >> 16, q)
    q = torch.where(q >= 2**15, q - 2**16, q).to(torch.int16)
    return q.view(torch.uint8)


def dequant_chunk(codes: Tensor, z: Tensor, s: Tensor) -> Tensor:
    """``z + c * s`` per row, float32; ``c * s`` is exact (<= 17 significant bits)."""
    return z[:, None] + codes.to(torch.float32) * s[:, None]


# Closures (not functools.partial) so torch.compile sees plain functions with `bits` as a
# constant; shapes and the row width `d` are dynamic (one compilation serves every width).
def codes_fn(bits: int) -> Callable:
    """``fn(xc, z, inv, base)``: :func:`codes_chunk` at a fixed ``bits``."""

    def fn(xc: Tensor, z: Tensor, inv: Tensor, base: Tensor) -> Tensor:
        return codes_chunk(xc, z, inv, base, bits)

    return fn


def dequant_fn(bits: int) -> Callable:
    """``fn(raw, z, s)``: decode code bytes ``raw`` (uint8 ``[n, cb]``) at a fixed ``bits``: float32
    ``[n, cb * 8 // bits]``, the padding slots included (only tensors: no row width to specialise on)."""

    def fn(raw: Tensor, z: Tensor, s: Tensor) -> Tensor:
        return dequant_chunk(unpack_codes(raw, raw.shape[1] * (8 // bits), bits), z, s)

    return fn


def _eager(key: tuple, fn: Callable) -> Callable:
    return fn


# --------------------------------------------------------------------------- #
# Row-level kernels
# --------------------------------------------------------------------------- #


class TorchKernels:
    """The torch codec kernels, running each chunk function through ``wrap``.

    Args:
        wrap: ``wrap(key, fn)`` returns the callable used for chunk function ``fn``
            (``key`` names it, e.g. ``("codes", 4)``); default: eager.

    Example:
        >>> k = TorchKernels()
        >>> out = torch.empty(3, 4 + 5, dtype=torch.uint8)
        >>> k.quantize_rows(torch.randn(3, 8), out, 123, 4)
        -1
    """

    name = "torch"
    dtypes = (torch.float32,)  # input/output dtypes taken directly

    def __init__(self, wrap: Optional[Wrap] = None) -> None:
        self.wrap = wrap or _eager

    @staticmethod
    def _chunk_rows(x: Tensor, d: int) -> int:
        per = CHUNK_CUDA if x.is_cuda else CHUNK_CPU
        return max(1, per // max(d, 1))

    def quantize_rows(self, x: Tensor, out: Tensor, seed: int, bits: int) -> int:
        """Encode float32 rows ``x`` ``[n, d]`` into records ``out`` (uint8 ``[n, R]``).

        Returns:
            -1 on success, else the index of the first row that could not be
            encoded (non-finite value, or max - min overflows float32).
        """
        n, d = x.shape
        step = self._chunk_rows(x, d)
        if bits == 16:
            bad = ~torch.isfinite(x).all(1)
            if bool(bad.any()):
                return int(bad.nonzero()[0])
            fn = self.wrap(("bf16",), bf16_chunk)
            for i0 in range(0, n, step):
                i1 = min(n, i0 + step)
                base = torch.tensor([(seed + i0 * d) & MASK32], device=x.device)  # [1], not 0-dim: dynamo would make a 0-dim CPU tensor a specialised scalar
                out[i0:i1] = fn(x[i0:i1], base)
            return -1
        z, inv, meta, bad = encode_meta(x, bits)
        if bool(bad.any()):
            return int(bad.nonzero()[0])
        cb = code_nbytes(d, bits)
        out[:, cb:] = meta
        fn = self.wrap(("codes", bits), codes_fn(bits))
        for i0 in range(0, n, step):
            i1 = min(n, i0 + step)
            base = torch.tensor([(seed + i0 * d) & MASK32], device=x.device)  # [1], not 0-dim: dynamo would make a 0-dim CPU tensor a specialised scalar
            out[i0:i1, :cb] = fn(x[i0:i1], z[i0:i1], inv[i0:i1], base)
        return -1

    def dequantize_rows(self, data: Tensor, out: Tensor, bits: int) -> None:
        """Decode records ``data`` (uint8 ``[n, R]``, bits <= 8) into float32 ``out`` ``[n, d]``."""
        n, d = out.shape
        z, s = decode_meta(data, d, bits)
        step = self._chunk_rows(data, d)
        cb = code_nbytes(d, bits)
        fn = self.wrap(("dequant", bits), dequant_fn(bits))
        for i0 in range(0, n, step):
            i1 = min(n, i0 + step)
            out[i0:i1] = fn(data[i0:i1, :cb].contiguous(), z[i0:i1], s[i0:i1])[:, :d]


_REFERENCE = TorchKernels()
quantize_rows = _REFERENCE.quantize_rows
dequantize_rows = _REFERENCE.dequantize_rows
