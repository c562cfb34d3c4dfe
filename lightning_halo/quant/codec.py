"""The halo row codec: stochastic-rounding quantization of feature rows to row records.

``quantize`` encodes rows ``[n, d]`` into ``n`` fixed-size records of
``row_nbytes(d, bits, dtype)`` bytes (the wire format: :mod:`.format`);
``QuantizedRows.from_buffer`` wraps any contiguous byte range of records received
from a peer, and ``dequantize`` decodes it. Bits 1/2/4/8: unbiased stochastic
rounding on a per-row affine grid; 16: bfloat16 with stochastic rounding; 32: the
raw rows (bitwise exact). See ``docs/quantization.md``.

The kernels that do the work are chosen per device by :mod:`.backend` (numba on
CPU, ``torch.compile``'d torch kernels on CUDA, the torch reference otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from .backend import get_impl, kernels_for, numba_available, set_impl, use_impl
from .format import (
    FLT_MAX,
    META_NBYTES,
    SUPPORTED_BITS,
    check_bits,
    check_dtype,
    decode_meta,
    row_nbytes,
    unpack_codes,
)

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


class NonFiniteError(ValueError):
    """Raised when rows to be quantized contain NaN or +/-Inf.

    The message names the caller-supplied ``where`` label and the first bad
    row/column, so a diverging run is reported at the exchange that saw it.
    """


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
        check_bits(self.bits)
        check_dtype(self.dtype)
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
        return decode_meta(self.data, self.d, self.bits)[0]

    @property
    def scale(self) -> Tensor:
        """Decoded per-row scales, float32 ``[n]``; 0 for constant rows (bits <= 8)."""
        self._need_meta("scale")
        return decode_meta(self.data, self.d, self.bits)[1].abs()

    @property
    def codes(self) -> Tensor:
        """Unpacked codes, uint8 ``[n, d]`` in ``[0, 2**bits - 1]`` (bits <= 8)."""
        self._need_meta("codes")
        return unpack_codes(self.data, self.d, self.bits)[:, : self.d].contiguous()

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
    if r.dtype == torch.float64 and bool((r.abs() > FLT_MAX).any()):
        col = int((r.abs() > FLT_MAX).nonzero()[0])
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
    check_bits(bits)
    if not isinstance(x, Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [n, d], got shape {tuple(x.shape)}")
    check_dtype(x.dtype)
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

    kern = kernels_for(x.device)
    # Arithmetic is float32; numba converts float64 per element inside the kernel (no extra pass).
    xk = (x if x.dtype in kern.dtypes else x.to(torch.float32)).contiguous()
    bad = kern.quantize_rows(xk, data, seed, bits)
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
    dtype = check_dtype(q.dtype if dtype is None else dtype)
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
    kern = kernels_for(data.device)
    direct = out.is_contiguous() and dtype in kern.dtypes
    dst = out if direct else torch.empty((n, d), dtype=torch.float32, device=data.device)
    kern.dequantize_rows(data.contiguous(), dst, bits)
    if not direct:
        out.copy_(dst)
    return out


def _view_dtype(data: Tensor, dtype: torch.dtype) -> Tensor:
    # A received slice may start at an offset not aligned to dtype: copy then.
    try:
        return data.contiguous().view(dtype)
    except RuntimeError:
        return data.clone().view(dtype)
