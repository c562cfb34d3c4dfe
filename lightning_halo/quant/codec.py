"""Row codec for halo exchange: stochastic-rounding quantization of feature rows.

Only the wire is quantized: rows that another rank needs are encoded into a
sequence of fixed-size *row records* (``row_nbytes(d, bits, dtype)`` bytes
each), so the send buffer for all peers is built at once and split into
contiguous per-peer byte ranges for a single ``all_to_all_single``; the
receiver decodes any contiguous byte range with :meth:`QuantizedRows.from_buffer`.
Every size is a function of ``(n, d, bits, dtype)``: no size handshake.

Record layout for ``bits`` in {1, 2, 4, 8} (``cb = ceil(d * bits / 8)``)::

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
stays unbiased (``E[dequantize(quantize(x))] = x`` up to float32 rounding) and
the per-element variance is ``s**2 f (1 - f) <= s**2 / 4`` with ``s`` the
transmitted scale (at most ``2**-8`` relative above ``(max - min) / L``).

``bits=16`` sends bfloat16 with unbiased stochastic rounding; ``bits=32`` sends
the raw rows in their own dtype (bitwise exact). See ``docs/quantization.md``.

CPU tensors use fused numba kernels (:mod:`lightning_halo.quant._numba`) when
numba is importable; otherwise, and on CUDA, a pure-torch path with identical
results on CPU is used. Select with :func:`set_impl` or the environment
variable ``LIGHTNING_HALO_NUMBA=0``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import Tensor

__all__ = [
    "SUPPORTED_BITS",
    "META_NBYTES",
    "NonFiniteError",
    "QuantizedRows",
    "row_nbytes",
    "quantize",
    "dequantize",
    "set_impl",
    "get_impl",
    "use_impl",
    "numba_available",
]

SUPPORTED_BITS = (1, 2, 4, 8, 16, 32)
"""Bit widths accepted by :func:`quantize`."""

META_NBYTES = 5
"""Metadata bytes per row record for ``bits <= 8`` (zero-point + scale)."""

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_FLT_MAX = 3.4028234663852886e38
_MASK32 = 0xFFFFFFFF
# Elements per chunk of the CPU torch path: keeps the int64 temporaries of the
# counter hash in cache-sized pieces instead of 8 bytes x n x d at once.
_TORCH_CHUNK_CPU = 1 << 16
_TORCH_CHUNK_CUDA = 1 << 24


class NonFiniteError(ValueError):
    """Raised when rows to be quantized contain NaN or +/-Inf.

    The message names the caller-supplied ``where`` label and the first bad
    row/column, so a diverging run is reported at the exchange that saw it.
    """


# --------------------------------------------------------------------------- #
# Validation and sizes
# --------------------------------------------------------------------------- #


def _check_bits(bits: int) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits!r}")
    return bits


def _check_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype not in _FLOAT_DTYPES:
        names = ", ".join(str(t) for t in _FLOAT_DTYPES)
        raise ValueError(f"rows must have a floating dtype ({names}), got {dtype}")
    return dtype


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
    _check_bits(bits)
    _check_dtype(dtype)
    if isinstance(d, bool) or not isinstance(d, int) or d < 0:
        raise ValueError(f"d must be a non-negative int, got {d!r}")
    if bits <= 8:
        return (d * bits + 7) // 8 + META_NBYTES
    if bits == 16:
        return 2 * d
    return d * dtype.itemsize


# --------------------------------------------------------------------------- #
# Container
# --------------------------------------------------------------------------- #


@dataclass(eq=False)  # tensors inside: identity, not elementwise ==
class QuantizedRows:
    """Encoded rows: ``n`` fixed-size row records, exactly the bytes on the wire.

    Rows ``i..j`` of the input are ``data[i:j]`` (bytes ``i*R .. j*R`` of the
    flattened buffer, ``R = row_nbytes(d, bits, dtype)``), so a slice of rows
    is itself a valid :class:`QuantizedRows`.

    Args:
        data: uint8 tensor ``[n, R]``. For ``bits=32`` it may share memory
            with the quantized input (zero-copy); clone before mutating.
        bits: Bits per element.
        d: Row width.
        dtype: Dtype of the original rows (what :func:`dequantize` returns).

    Example:
        >>> q = quantize(torch.randn(10, 64), bits=4)
        >>> q.data.shape, q.nbytes
        (torch.Size([10, 37]), 370)
        >>> q2 = QuantizedRows.from_buffer(q.data.view(-1), 10, 64, 4, torch.float32)
        >>> torch.equal(dequantize(q2), dequantize(q))
        True
    """

    data: Tensor = field(repr=False)
    bits: int
    d: int
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        _check_bits(self.bits)
        _check_dtype(self.dtype)
        r = row_nbytes(self.d, self.bits, self.dtype)
        if self.data.dtype != torch.uint8 or self.data.dim() != 2 or self.data.shape[1] != r:
            raise ValueError(
                f"data must be uint8 [n, {r}] for d={self.d}, bits={self.bits}, "
                f"dtype={self.dtype}; got {self.data.dtype} {tuple(self.data.shape)}"
            )

    def __repr__(self) -> str:
        return (
            f"QuantizedRows(n={self.n}, d={self.d}, bits={self.bits}, dtype={self.dtype}, "
            f"nbytes={self.nbytes}, device={self.data.device})"
        )

    @property
    def n(self) -> int:
        """Number of rows."""
        return int(self.data.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes on the wire (``n * row_nbytes(d, bits, dtype)``)."""
        return self.data.numel()

    def _need_meta(self, what: str) -> None:
        if self.bits > 8:
            raise ValueError(f"QuantizedRows.{what} exists only for bits <= 8 (bits={self.bits})")

    @property
    def zero(self) -> Tensor:
        """Decoded per-row zero-points, float32 ``[n]`` (bits <= 8 only)."""
        self._need_meta("zero")
        return _decode_meta(self.data, self.d, self.bits)[0]

    @property
    def scale(self) -> Tensor:
        """Decoded per-row scales, float32 ``[n]``; 0 for constant rows (bits <= 8)."""
        self._need_meta("scale")
        return _decode_meta(self.data, self.d, self.bits)[1].abs()

    @property
    def codes(self) -> Tensor:
        """Unpacked codes, uint8 ``[n, d]`` in ``[0, 2**bits - 1]`` (bits <= 8)."""
        self._need_meta("codes")
        return _unpack_codes(self.data, self.d, self.bits)[:, : self.d].contiguous()

    @classmethod
    def from_buffer(
        cls, buf: Tensor, n: int, d: int, bits: int, dtype: torch.dtype = torch.float32
    ) -> "QuantizedRows":
        """Wrap a received byte buffer holding ``n`` row records (no copy if contiguous).

        Args:
            buf: uint8 tensor of any shape with ``n * row_nbytes(d, bits, dtype)``
                elements, e.g. this peer's slice of an ``all_to_all_single``
                receive buffer.
            n: Number of rows in ``buf``.
            d: Row width.
            bits: Bits per element used by the sender.
            dtype: Dtype of the sender's rows.

        Returns:
            The :class:`QuantizedRows` view of ``buf``.

        Example:
            >>> q = quantize(torch.randn(3, 8), bits=8)
            >>> QuantizedRows.from_buffer(q.data.flatten(), 3, 8, 8).n
            3
        """
        r = row_nbytes(d, bits, dtype)
        if buf.dtype != torch.uint8:
            raise ValueError(f"buffer must be uint8, got {buf.dtype}")
        if buf.numel() != n * r:
            raise ValueError(
                f"buffer has {buf.numel()} bytes, expected n*R = {n}*{r} = {n * r} "
                f"(d={d}, bits={bits}, dtype={dtype})"
            )
        return cls(buf.reshape(n, r), bits, d, dtype)


# --------------------------------------------------------------------------- #
# Implementation selection
# --------------------------------------------------------------------------- #

_IMPLS = ("auto", "torch", "numba")
_impl = "auto"
_numba_mod = None
_numba_failed = False
_lock = threading.Lock()


def _load_numba():
    """Import the numba kernels once; ``None`` if numba is unavailable."""
    global _numba_mod, _numba_failed
    if _numba_mod is None and not _numba_failed:
        with _lock:
            if _numba_mod is None and not _numba_failed:
                try:
                    from . import _numba as mod
                except Exception:  # ImportError, or a numba/llvmlite mismatch
                    _numba_failed = True
                else:
                    _numba_mod = mod
    return _numba_mod


def numba_available() -> bool:
    """Whether the fused numba CPU kernels can be used on this machine.

    Returns:
        True if ``lightning_halo.quant._numba`` (and numba) import.

    Example:
        >>> numba_available()
        True
    """
    return _load_numba() is not None


def set_impl(impl: str) -> None:
    """Choose the CPU implementation process-wide.

    ``"auto"`` (default) uses numba when importable and the environment
    variable ``LIGHTNING_HALO_NUMBA`` is not ``"0"``; ``"torch"`` forces the
    pure-torch path; ``"numba"`` forces the kernels (error if unavailable).
    CUDA tensors always use the torch path.

    Args:
        impl: ``"auto"``, ``"torch"`` or ``"numba"``.

    Example:
        >>> set_impl("torch"); set_impl("auto")
    """
    global _impl
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {_IMPLS}, got {impl!r}")
    if impl == "numba" and not numba_available():
        raise RuntimeError("impl='numba' requested but numba kernels cannot be imported")
    _impl = impl


def get_impl() -> str:
    """The implementation CPU tensors currently use.

    Returns:
        ``"numba"`` or ``"torch"`` (``"auto"`` resolved).

    Example:
        >>> with use_impl("torch"):
        ...     get_impl()
        'torch'
    """
    return "numba" if _use_numba_cpu() else "torch"


@contextlib.contextmanager
def use_impl(impl: str) -> Iterator[None]:
    """Context manager form of :func:`set_impl` (restores the previous choice).

    Args:
        impl: ``"auto"``, ``"torch"`` or ``"numba"``.

    Example:
        >>> with use_impl("torch"):
        ...     q = quantize(torch.randn(4, 4), bits=8)
    """
    prev = _impl
    set_impl(impl)
    try:
        yield
    finally:
        set_impl(prev)


def _use_numba_cpu() -> bool:
    if _impl == "torch":
        return False
    if _impl == "auto" and os.environ.get("LIGHTNING_HALO_NUMBA", "1") == "0":
        return False
    return _load_numba() is not None


# --------------------------------------------------------------------------- #
# Bit helpers (int64 emulation of uint32; no int64 overflow anywhere)
# --------------------------------------------------------------------------- #


def _f32_to_bits(t: Tensor) -> Tensor:
    """float32 -> signed int64 holding the int32 bit pattern."""
    return t.contiguous().view(torch.int32).to(torch.int64)


def _bits_to_f32(b: Tensor) -> Tensor:
    """int64 bit pattern (signed int32 range, or unsigned 32-bit) -> float32."""
    b = torch.where(b >= 2**31, b - 2**32, b)
    return b.to(torch.int32).view(torch.float32)


def _mul32_(a: Tensor, c: int) -> Tensor:
    """In place: ``a = (a * c) mod 2**32`` for int64 ``0 <= a < 2**32``.

    ``c`` is split into 16-bit halves so every intermediate stays below 2**49:
    no reliance on (undefined) integer overflow, on CPU or CUDA.
    """
    lo, hi = c & 0xFFFF, c >> 16
    t = a * hi
    t.bitwise_and_(0xFFFF).bitwise_left_shift_(16)
    return a.mul_(lo).add_(t).bitwise_and_(_MASK32)


def _lowbias32_(k: Tensor) -> Tensor:
    """In place lowbias32 hash of int64 counters in ``[0, 2**32)`` (as the numba kernels)."""
    k ^= k >> 16
    _mul32_(k, 0x7FEB352D)
    k ^= k >> 15
    _mul32_(k, 0x846CA68B)
    k ^= k >> 16
    return k


def _counters(base: Tensor, m: int, d: int) -> Tensor:
    # Element (r, j) of a chunk starting at global row i0 gets seed + (i0 + r) * d + j.
    idx = torch.arange(m * d, dtype=torch.int64, device=base.device)
    return idx.add_(base).bitwise_and_(_MASK32).view(m, d)


# --------------------------------------------------------------------------- #
# Pure-torch kernels (chunk level; also what torch.compile sees on CUDA)
# --------------------------------------------------------------------------- #


def _codes_chunk(xc: Tensor, z: Tensor, inv: Tensor, base: Tensor, bits: int) -> Tensor:
    """Stochastic codes of a float32 chunk, packed: uint8 ``[m, cb]``."""
    m, d = xc.shape
    L = (1 << bits) - 1
    h = _lowbias32_(_counters(base, m, d))
    u = h.bitwise_right_shift_(8).to(torch.float32).mul_(2.0**-24)  # exact: < 2**24
    # Separate sub/mul/add roundings (no FMA) to match the numba kernels bit for bit.
    t = (xc - z[:, None]).mul_(inv[:, None]).add_(u)
    c = t.floor_().clamp_(0, L).to(torch.uint8)
    if bits == 8:
        return c
    per = 8 // bits
    cb = (d + per - 1) // per
    if cb * per != d:
        c = torch.nn.functional.pad(c, (0, cb * per - d))
    shifts = torch.arange(per, dtype=torch.uint8, device=c.device) * bits
    # Fields do not overlap, so sum == bitwise or (and fits in uint8).
    return (c.view(m, cb, per) << shifts).sum(-1, dtype=torch.uint8)


def _bf16_chunk(xc: Tensor, base: Tensor) -> Tensor:
    """bfloat16 stochastic rounding of a float32 chunk: uint8 ``[m, 2d]`` (LE)."""
    m, d = xc.shape
    p = _f32_to_bits(xc) & _MASK32
    r = _lowbias32_(_counters(base, m, d)).bitwise_and_(0xFFFF)
    q = (p + r) >> 16
    # Rounding a finite value up to the inf exponent: truncate instead.
    q = torch.where((q & 0x7F80) == 0x7F80, p >> 16, q)
    q = torch.where(q >= 2**15, q - 2**16, q).to(torch.int16)
    return q.view(torch.uint8)


def _dequant_chunk(codes: Tensor, z: Tensor, s: Tensor) -> Tensor:
    # c * s is exact (<= 17 significant bits); one rounding in the add.
    return z[:, None] + codes.to(torch.float32) * s[:, None]


_compiled: dict = {}


def _cuda_fn(key: tuple, fn: Callable) -> Callable:
    """``torch.compile`` a chunk function once per key; eager fallback on failure."""
    got = _compiled.get(key)
    if got is None:
        got = fn
        if hasattr(torch, "compile") and os.environ.get("LIGHTNING_HALO_COMPILE", "1") != "0":
            try:
                compiled = torch.compile(fn, dynamic=True)
            except Exception:  # pragma: no cover - depends on the install
                compiled = None
            if compiled is not None:

                state = {"ok": True}

                def got(*args, _c=compiled, _f=fn, _state=state):
                    if _state["ok"]:
                        try:
                            return _c(*args)
                        except Exception as exc:  # pragma: no cover - CUDA only
                            warnings.warn(f"torch.compile of halo codec failed ({exc!r}); using eager")
                            _state["ok"] = False
                            _compiled[key] = _f
                    return _f(*args)

        _compiled[key] = got
    return got


def _chunk_rows(x: Tensor, d: int) -> int:
    per = _TORCH_CHUNK_CUDA if x.is_cuda else _TORCH_CHUNK_CPU
    return max(1, per // max(d, 1))


def _per_row_meta(x32: Tensor, bits: int):
    """Per-row zero-point/scale in float32 and the 5 metadata bytes.

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
    z_nc = _bits_to_f32(zb)
    rng = _bits_to_f32(mxb) - z_nc
    # True division by a full tensor (not a scalar) so no reciprocal-multiply shortcut.
    s = torch.div(rng, torch.full_like(rng, float(L)))
    sb = _f32_to_bits(s)
    # Scale: rounded up to 8 mantissa bits, at least 2**-126 (so e >= 1).
    sb = torch.where((sb & 0x7FFF) != 0, (sb & ~0x7FFF) + 0x8000, sb).clamp_(min=0x00800000)
    bad |= ~const & (sb >= 0x7F800000)  # (max - z) / L overflowed float32
    sb = torch.where(bad | const, 0x3F800000, sb)  # keep garbage rows harmless
    s_f = _bits_to_f32(sb)
    inv = torch.where(const, 0.0, torch.div(torch.ones_like(s_f), s_f))
    z = torch.where(const, _bits_to_f32(mnb), z_nc)
    zpat = torch.where(const, mnb, zb) & _MASK32
    m0 = torch.where(const, zpat & 0xFF, (sb >> 15) & 0xFF)
    e = torch.where(const, 0, sb >> 23)
    meta = torch.stack([m0, (zpat >> 8) & 0xFF, (zpat >> 16) & 0xFF, zpat >> 24, e], 1)
    return z, inv, meta.to(torch.uint8), bad


def _decode_meta(data: Tensor, d: int, bits: int) -> tuple[Tensor, Tensor]:
    cb = (d * bits + 7) // 8
    m = data[:, cb : cb + META_NBYTES].to(torch.int64)
    m0, m1, m2, m3, e = m.unbind(1)
    hi = (m1 << 8) | (m2 << 16) | (m3 << 24)
    const = e == 0
    z = _bits_to_f32(torch.where(const, hi | m0, hi))
    # Constant rows decode with s = -0.0: z + c * (-0.0) == z bitwise, even for z = -0.0.
    s = _bits_to_f32(torch.where(const, -(2**31), (e << 23) | (m0 << 15)))
    return z, s


def _unpack_codes(data: Tensor, d: int, bits: int) -> Tensor:
    """All code slots incl. padding: uint8 ``[n, cb * (8 // bits)]``."""
    cb = (d * bits + 7) // 8
    raw = data[:, :cb]
    if bits == 8:
        return raw
    per = 8 // bits
    shifts = torch.arange(per, dtype=torch.uint8, device=data.device) * bits
    c = (raw.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return c.reshape(data.shape[0], cb * per)


def _quantize_torch_rows(x32: Tensor, bits: int, seed: int, out: Tensor) -> int:
    """Torch path into ``out`` (uint8 [n, R]); returns first bad row or -1."""
    n, d = x32.shape
    step = _chunk_rows(x32, d)
    cuda = x32.is_cuda
    if bits == 16:
        bad = ~torch.isfinite(x32).all(1)
        if bool(bad.any()):
            return int(bad.nonzero()[0])
        fn = _cuda_fn(("bf16",), _bf16_chunk) if cuda else _bf16_chunk
        for i0 in range(0, n, step):
            i1 = min(n, i0 + step)
            base = torch.tensor((seed + i0 * d) & _MASK32, device=x32.device)
            out[i0:i1] = fn(x32[i0:i1], base)
        return -1
    z, inv, meta, bad = _per_row_meta(x32, bits)
    if bool(bad.any()):
        return int(bad.nonzero()[0])
    cb = (d * bits + 7) // 8
    out[:, cb:] = meta
    fn = _cuda_fn(("codes", bits), _codes_fn(bits)) if cuda else None
    for i0 in range(0, n, step):
        i1 = min(n, i0 + step)
        base = torch.tensor((seed + i0 * d) & _MASK32, device=x32.device)
        if fn is None:
            out[i0:i1, :cb] = _codes_chunk(x32[i0:i1], z[i0:i1], inv[i0:i1], base, bits)
        else:
            out[i0:i1, :cb] = fn(x32[i0:i1], z[i0:i1], inv[i0:i1], base)
    return -1


def _dequant_packed_chunk(data: Tensor, z: Tensor, s: Tensor, d: int, bits: int) -> Tensor:
    return _dequant_chunk(_unpack_codes(data, d, bits)[:, :d], z, s)


# Closures (not functools.partial) so torch.compile sees plain functions with
# `bits`/`d` as constants and only tensors as (dynamic-shape) arguments.
def _codes_fn(bits: int) -> Callable:
    def fn(xc: Tensor, z: Tensor, inv: Tensor, base: Tensor) -> Tensor:
        return _codes_chunk(xc, z, inv, base, bits)

    return fn


def _dequant_fn(d: int, bits: int) -> Callable:
    def fn(data: Tensor, z: Tensor, s: Tensor) -> Tensor:
        return _dequant_packed_chunk(data, z, s, d, bits)

    return fn


def _dequantize_torch_rows(data: Tensor, d: int, bits: int, out: Tensor) -> None:
    """Torch path: decode records ``data`` (bits <= 8) into float32 ``out``."""
    n = data.shape[0]
    z, s = _decode_meta(data, d, bits)
    step = _chunk_rows(data, d)
    fn = _dequant_fn(d, bits)
    if data.is_cuda:
        fn = _cuda_fn(("dequant", d, bits), fn)
    for i0 in range(0, n, step):
        i1 = min(n, i0 + step)
        out[i0:i1] = fn(data[i0:i1], z[i0:i1], s[i0:i1])


# --------------------------------------------------------------------------- #
# Output allocation
# --------------------------------------------------------------------------- #

def _empty(shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> Tensor:
    """A fresh output. Its first-touch page faults can cost as much as the kernel itself on
    large buffers: pass ``out=`` to reuse one, or run with PyTorch's ``THP_MEM_ALLOC_ENABLE=1``
    for transparent huge pages."""
    return torch.empty(shape, dtype=dtype, device=device)


# --------------------------------------------------------------------------- #
# Public API
# --------------------------------------------------------------------------- #


def _draw_seed(generator: torch.Generator | None) -> int:
    if generator is None:
        return int(torch.randint(0, 2**32, (1,)))
    return int(torch.randint(0, 2**32, (1,), generator=generator, device=generator.device))


def _raise_row_error(x: Tensor, row: int, where: str) -> None:
    label = where or "input rows"
    r = x[row]
    finite = torch.isfinite(r)
    if not bool(finite.all()):
        col = int((~finite).nonzero()[0])
        raise NonFiniteError(
            f"non-finite value in {label} (row {row}, column {col}: {float(r[col])}) — "
            "NaN/Inf cannot be quantized; check for diverging activations/gradients "
            "(e.g. lower the learning rate or enable gradient clipping)"
        )
    if r.dtype == torch.float64 and bool((r.abs() > _FLT_MAX).any()):
        col = int((r.abs() > _FLT_MAX).nonzero()[0])
        raise ValueError(
            f"value out of float32 range in {label} (row {row}, column {col}: {float(r[col])}) "
            "— quantization works in float32; use bits=32 to send float64 rows raw"
        )
    raise ValueError(
        f"cannot quantize {label} (row {row}): range max - min = "
        f"{float(r.max()) - float(r.min()):.6g} overflows float32 — use bits=16 or 32"
    )


def quantize(
    x: Tensor,
    bits: int,
    generator: torch.Generator | None = None,
    *,
    where: str = "",
    out: Tensor | None = None,
) -> QuantizedRows:
    """Encode rows ``x`` ``[n, d]`` into row records with stochastic rounding.

    Bits 1/2/4/8: per-row min/max affine grid, unbiased stochastic rounding,
    5 metadata bytes per row. 16: bfloat16 with stochastic rounding. 32: raw
    rows in ``x.dtype`` (bitwise exact). Arithmetic is float32 for bits <= 16
    (float64/float16/bfloat16 inputs are converted first). No autograd.

    Args:
        x: 2-D floating tensor (float16, bfloat16, float32 or float64), CPU or CUDA.
        bits: One of :data:`SUPPORTED_BITS`.
        generator: Source of the per-call 32-bit seed (``None``: torch's
            default generator). The same generator state gives identical bytes.
        where: Label used in error messages (e.g. ``"layer 2 halo, peer 3"``).
        out: Optional uint8 destination with ``n * row_nbytes(d, bits, x.dtype)``
            contiguous elements (e.g. a slice of the send buffer); the records
            are written into it and ``data`` is a view of it.

    Returns:
        :class:`QuantizedRows` with ``data`` of shape ``[n, row_nbytes(...)]``.

    Raises:
        ValueError: Unsupported ``bits``, non-2-D or non-float ``x``, bad
            ``out``, or a row whose float32 range ``max - min`` overflows.
        NonFiniteError: ``x`` contains NaN/Inf (message names ``where`` and
            the first bad row).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> q = quantize(torch.randn(1000, 256), bits=1, generator=g, where="h1")
        >>> q.data.shape      # 32 code bytes + 5 metadata bytes per row
        torch.Size([1000, 37])
        >>> dequantize(q).shape
        torch.Size([1000, 256])
    """
    _check_bits(bits)
    if not isinstance(x, Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [n, d], got shape {tuple(x.shape)}")
    _check_dtype(x.dtype)
    x = x.detach()
    n, d = x.shape
    r = row_nbytes(d, bits, x.dtype)
    if out is not None:
        if out.dtype != torch.uint8 or out.numel() != n * r or not out.is_contiguous():
            raise ValueError(
                f"out must be a contiguous uint8 tensor with n*R = {n * r} elements, "
                f"got {out.dtype} {tuple(out.shape)}"
            )
        if out.device != x.device:
            raise ValueError(f"out is on {out.device}, x on {x.device}")
        out = out.view(n, r)

    if bits == 32:
        # Raw rows; the finiteness check is still required behaviour.
        fin = torch.isfinite(x).all(1)
        if not bool(fin.all()):
            _raise_row_error(x, int((~fin).nonzero()[0]), where)
        raw = x.contiguous().view(torch.uint8).view(n, r)
        if out is None:
            return QuantizedRows(raw, bits, d, x.dtype)
        out.copy_(raw)
        return QuantizedRows(out, bits, d, x.dtype)

    seed = _draw_seed(generator)  # drawn even for empty input: RNG use is shape-independent
    data = out if out is not None else _empty((n, r), torch.uint8, x.device)
    if n == 0:
        return QuantizedRows(data, bits, d, x.dtype)
    if d == 0:
        data.zero_()  # constant "rows" of value 0.0: e = 0, m = 0
        return QuantizedRows(data, bits, d, x.dtype)

    bad = -1
    if x.device.type == "cpu" and _use_numba_cpu():
        kern = _load_numba()
        # float64 is converted per element inside the kernel (no extra pass).
        xk = x.contiguous() if x.dtype in (torch.float32, torch.float64) else x.float()
        xn = xk.numpy()
        if bits == 16 and data.data_ptr() % 2 == 0:
            bad = kern.quantize_rows(xn, data.numpy().view("<u2"), seed, bits)
        elif bits == 16:  # misaligned user `out`: encode aside, then copy
            tmp = torch.empty((n, r), dtype=torch.uint8)
            bad = kern.quantize_rows(xn, tmp.numpy().view("<u2"), seed, bits)
            data.copy_(tmp)
        else:
            bad = kern.quantize_rows(xn, data.numpy(), seed, bits)
    else:
        x32 = x.to(torch.float32).contiguous()
        bad = _quantize_torch_rows(x32, bits, seed, data)
    if bad >= 0:
        _raise_row_error(x, bad, where)
    return QuantizedRows(data, bits, d, x.dtype)


def dequantize(
    q: QuantizedRows, dtype: torch.dtype | None = None, *, out: Tensor | None = None
) -> Tensor:
    """Decode row records back to a dense ``[n, d]`` tensor.

    Values are ``z + c * s`` computed in float32 (bits <= 8), exact
    bfloat16 -> float32 (bits 16) or the raw rows (bits 32), then cast.

    Args:
        q: Encoded rows (e.g. from :meth:`QuantizedRows.from_buffer`).
        dtype: Output dtype; defaults to ``q.dtype`` (the sender's dtype).
        out: Optional destination ``[n, d]`` of ``dtype`` (e.g. the rows of a
            halo feature buffer); avoids allocating, returned as the result.

    Returns:
        Tensor ``[n, d]`` on ``q.data.device``.

    Example:
        >>> x = torch.randn(5, 16)
        >>> torch.equal(dequantize(quantize(x, bits=32)), x)
        True
    """
    dtype = _check_dtype(q.dtype if dtype is None else dtype)
    n, d, bits, data = q.n, q.d, q.bits, q.data
    if out is None:
        out = _empty((n, d), dtype, data.device)
    elif out.shape != (n, d) or out.dtype != dtype or out.device != data.device:
        raise ValueError(
            f"out must be {dtype} [{n}, {d}] on {data.device}, "
            f"got {out.dtype} {tuple(out.shape)} on {out.device}"
        )
    if n == 0 or d == 0:
        return out
    if bits == 32:
        out.copy_(_view_dtype(data, q.dtype).view(n, d))
        return out
    if bits == 16:
        out.copy_(_view_dtype(data, torch.bfloat16).view(n, d))
        return out
    if data.device.type == "cpu" and _use_numba_cpu():
        direct = out.is_contiguous() and dtype in (torch.float32, torch.float64)
        dst = out if direct else torch.empty((n, d), dtype=torch.float32)
        _load_numba().dequantize_rows(data.contiguous().numpy(), dst.numpy(), bits)
        if not direct:
            out.copy_(dst)
        return out
    if dtype == torch.float32 and out.is_contiguous():
        _dequantize_torch_rows(data, d, bits, out)
    else:
        tmp = torch.empty((n, d), dtype=torch.float32, device=data.device)
        _dequantize_torch_rows(data, d, bits, tmp)
        out.copy_(tmp)
    return out


def _view_dtype(data: Tensor, dtype: torch.dtype) -> Tensor:
    # A received slice may start at an offset not aligned to dtype: copy then.
    try:
        return data.contiguous().view(dtype)
    except RuntimeError:
        return data.clone().view(dtype)
