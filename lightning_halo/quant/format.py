"""Wire format of the halo row codec: what every byte of a row record means.

Only the wire is quantized: rows that another rank needs are encoded into a
sequence of fixed-size *row records* (``row_nbytes(d, bits, dtype)`` bytes
each), so the send buffer for all peers is built at once and split into
contiguous per-peer byte ranges for a single ``all_to_all_single``; the
receiver decodes any contiguous byte range on its own. Every size is a
function of ``(n, d, bits, dtype)``: no size handshake.

Record layout for ``bits`` in :data:`PACKED_BITS` (``cb = code_nbytes(d, bits)``)::

    [cb code bytes][m0 m1 m2 m3][e]

* codes: ``c_j = clamp(floor((x_j - z) / s + u_j), 0, 2**bits - 1)`` with
  ``u_j ~ U[0, 1)``, packed ``8 // bits`` per byte, little end first
  (column ``j`` -> byte ``j // per``, bit offset ``(j % per) * bits``),
  padding codes are 0.
* ``e != 0``: ``s = 2**(e-127) * (1 + m0 / 256)`` (8-bit-mantissa float32) and
  ``z`` = float32 with little-endian bytes ``(0, m1, m2, m3)`` (24-bit float).
* ``e == 0``: constant row; ``m0..m3`` is its exact float32 value, ``s = 0``.

The zero-point is the row min rounded toward -inf and the scale is rounded
up, so the grid ``z + c * s`` still covers ``[min, max]``: stochastic rounding
stays unbiased and the per-element variance is ``s**2 f (1 - f) <= s**2 / 4``
with ``s`` the transmitted scale (at most ``2**-8`` relative above
``(max - min) / L``).

``bits=16`` records are bfloat16 (little-endian, stochastically rounded);
``bits=32`` records are the raw rows in their own dtype. See
``docs/quantization.md``.

This module holds the sizes, the checks and the packing of the per-row header
(zero-point and scale) in torch; the per-element work lives in the kernels
(:mod:`._torch`, :mod:`._numba`), which produce identical records.
"""

from __future__ import annotations

import torch
from torch import Tensor

SUPPORTED_BITS = (1, 2, 4, 8, 16, 32)
"""Bit widths accepted by :func:`~lightning_halo.quant.quantize` (32 = raw rows, exact)."""

PACKED_BITS = (1, 2, 4, 8)
"""Bit widths whose records are packed codes plus a :data:`META_NBYTES` header."""

META_NBYTES = 5
"""Metadata bytes per row record for ``bits <= 8`` (zero-point + scale)."""

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""Row dtypes the codec accepts."""

FLT_MAX = 3.4028234663852886e38
MASK32 = 0xFFFFFFFF


def check_bits(bits: int, name: str = "bits") -> int:
    """``bits`` if it is one of :data:`SUPPORTED_BITS`, else a ``ValueError`` naming ``name`` and listing them.

    Args:
        bits (int): the bit width to check (a ``bool`` is refused, though Python counts it as an int).
        name (str, optional): the argument's name in the message. (default: ``"bits"``)

    Example:
        >>> check_bits(4)
        4
        >>> check_bits(3, "grad_bits")
        Traceback (most recent call last):
        ...
        ValueError: grad_bits=3 is not supported; choose one of (1, 2, 4, 8, 16, 32) (32 = exact float rows).
    """
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in SUPPORTED_BITS:
        raise ValueError(f"{name}={bits!r} is not supported; choose one of {SUPPORTED_BITS} (32 = exact float rows).")
    return bits


def check_dtype(dtype: torch.dtype) -> torch.dtype:
    """``dtype`` if it is one of :data:`FLOAT_DTYPES`, else a ``ValueError`` listing them."""
    if dtype not in FLOAT_DTYPES:
        names = ", ".join(str(t) for t in FLOAT_DTYPES)
        raise ValueError(f"rows must have a floating dtype ({names}), got {dtype}")
    return dtype


def code_nbytes(d: int, bits: int) -> int:
    """Bytes of packed codes at the start of a record (``ceil(d * bits / 8)``, bits <= 8)."""
    return (d * bits + 7) // 8


def row_nbytes(d: int, bits: int, dtype: torch.dtype = torch.float32) -> int:
    """Size in bytes of one row record on the wire.

    Args:
        d: Row width (number of features), ``d >= 0``.
        bits: Bits per element, one of :data:`SUPPORTED_BITS`.
        dtype: Dtype of the original rows; only matters for ``bits=32``,
            where rows are sent raw in their own dtype.

    Returns:
        ``ceil(d * bits / 8) + 5`` for bits 1/2/4/8, ``2 * d`` for 16 and
        ``d * dtype.itemsize`` for 32.

    Example:
        >>> row_nbytes(256, 1)
        37
        >>> row_nbytes(256, 32, torch.float64)
        2048
    """
    check_bits(bits)
    check_dtype(dtype)
    if isinstance(d, bool) or not isinstance(d, int) or d < 0:
        raise ValueError(f"d must be a non-negative int, got {d!r}")
    if bits <= 8:
        return code_nbytes(d, bits) + META_NBYTES
    if bits == 16:
        return 2 * d
    return d * dtype.itemsize


# --------------------------------------------------------------------------- #
# Bit helpers (int64 emulation of uint32; no int64 overflow anywhere)
# --------------------------------------------------------------------------- #


def f32_to_bits(t: Tensor) -> Tensor:
    """float32 -> signed int64 holding the int32 bit pattern."""
    return t.contiguous().view(torch.int32).to(torch.int64)


def bits_to_f32(b: Tensor) -> Tensor:
    """int64 bit pattern (signed int32 range, or unsigned 32-bit) -> float32."""
    b = torch.where(b >= 2**31, b - 2**32, b)
    return b.to(torch.int32).view(torch.float32)


# --------------------------------------------------------------------------- #
# Per-row header: zero-point and scale in 5 bytes
# --------------------------------------------------------------------------- #


def encode_meta(x32: Tensor, bits: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-row zero-point/scale in float32 and the 5 metadata bytes.

    Args:
        x32: float32 rows ``[n, d]``, ``d >= 1``.
        bits: One of :data:`PACKED_BITS`.

    Returns:
        ``(z, inv, meta, bad)``: float32 ``[n]`` zero-points and inverse scales
        (0 for constant rows), uint8 ``[n, 5]`` metadata bytes and a bool
        ``[n]`` mask of rows that cannot be encoded (non-finite or overflow).
    """
    L = (1 << bits) - 1
    b = x32.view(torch.int32)
    # Order-preserving integer keys: exact min/max incl. -0.0 < +0.0; NaN/Inf
    # land at or beyond key(+inf)/key(-inf), so the finiteness check is free.
    key = b ^ ((b >> 31) & 0x7FFFFFFF)
    kmin = key.amin(1).to(torch.int64)
    kmax = key.amax(1).to(torch.int64)
    bad = (kmax >= 0x7F800000) | (kmin <= -0x7F800001)
    mnb = kmin ^ ((kmin >> 31) & 0x7FFFFFFF)
    mxb = kmax ^ ((kmax >> 31) & 0x7FFFFFFF)
    const = kmin == kmax
    # Zero-point: min rounded toward -inf to a float32 with 8 zero low mantissa bits.
    zb = mnb & ~0xFF
    zb = torch.where((mnb < 0) & ((mnb & 0xFF) != 0), zb + 0x100, zb)
    z_nc = bits_to_f32(zb)
    rng = bits_to_f32(mxb) - z_nc
    # True division by a full tensor (not a scalar) so no reciprocal-multiply shortcut.
    s = torch.div(rng, torch.full_like(rng, float(L)))
    sb = f32_to_bits(s)
    # Scale: rounded up to 8 mantissa bits, at least 2**-126 (so e >= 1).
    sb = torch.where((sb & 0x7FFF) != 0, (sb & ~0x7FFF) + 0x8000, sb).clamp_(min=0x00800000)
    bad |= ~const & (sb >= 0x7F800000)  # (max - z) / L overflowed float32
    sb = torch.where(bad | const, 0x3F800000, sb)  # keep garbage rows harmless
    s_f = bits_to_f32(sb)
    inv = torch.where(const, 0.0, torch.div(torch.ones_like(s_f), s_f))
    z = torch.where(const, bits_to_f32(mnb), z_nc)
    zpat = torch.where(const, mnb, zb) & MASK32
    m0 = torch.where(const, zpat & 0xFF, (sb >> 15) & 0xFF)
    e = torch.where(const, 0, sb >> 23)
    meta = torch.stack([m0, (zpat >> 8) & 0xFF, (zpat >> 16) & 0xFF, zpat >> 24, e], 1)
    return z, inv, meta.to(torch.uint8), bad


def decode_meta(data: Tensor, d: int, bits: int) -> tuple[Tensor, Tensor]:
    """Zero-points and scales, float32 ``[n]`` each, of records ``data`` (uint8 ``[n, R]``).

    Constant rows decode with ``s = -0.0``, so ``z + c * s == z`` bitwise even for
    ``z = -0.0``; take ``.abs()`` for the scale as a number.
    """
    cb = code_nbytes(d, bits)
    m = data[:, cb : cb + META_NBYTES].to(torch.int64)
    m0, m1, m2, m3, e = m.unbind(1)
    hi = (m1 << 8) | (m2 << 16) | (m3 << 24)
    const = e == 0
    z = bits_to_f32(torch.where(const, hi | m0, hi))
    s = bits_to_f32(torch.where(const, -(2**31), (e << 23) | (m0 << 15)))
    return z, s


# --------------------------------------------------------------------------- #
# Code packing
# --------------------------------------------------------------------------- #


def pack_codes(c: Tensor, bits: int) -> Tensor:
    """Codes uint8 ``[m, d]`` (each ``< 2**bits``) -> packed code bytes uint8 ``[m, cb]``."""
    if bits == 8:
        return c
    m, d = c.shape
    per = 8 // bits
    cb = code_nbytes(d, bits)
    if cb * per != d:
        c = torch.nn.functional.pad(c, (0, cb * per - d))
    shifts = torch.arange(per, dtype=torch.uint8, device=c.device) * bits
    # Fields do not overlap, so sum == bitwise or (and fits in uint8).
    return (c.view(m, cb, per) << shifts).sum(-1, dtype=torch.uint8)


def unpack_codes(data: Tensor, d: int, bits: int) -> Tensor:
    """All code slots of records ``data`` incl. padding: uint8 ``[n, cb * (8 // bits)]``."""
    cb = code_nbytes(d, bits)
    raw = data[:, :cb]
    if bits == 8:
        return raw
    per = 8 // bits
    shifts = torch.arange(per, dtype=torch.uint8, device=data.device) * bits
    c = (raw.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return c.reshape(data.shape[0], cb * per)
