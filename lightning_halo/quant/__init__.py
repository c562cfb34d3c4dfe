"""Wire codec for halo rows: stochastic-rounding quantization to 1/2/4/8/16/32 bits.

Public API (see :mod:`lightning_halo.quant.codec` and ``docs/quantization.md``)::

    q = quantize(rows, bits=4, generator=g, where="layer 1 halo")
    buf = q.data                      # uint8 [n, row_nbytes(d, 4)]: bytes on the wire
    q2 = QuantizedRows.from_buffer(recv_slice, n, d, 4, torch.float32)
    rows_hat = dequantize(q2)         # unbiased: E[rows_hat] == rows

Modules: ``format`` (the row records: sizes, checks, header packing), ``_torch`` and
``_numba`` (the kernels, one interface), ``backend`` (which kernels a device uses;
the one place that is chosen), ``kernel_cache`` (where compiled numba kernels are
cached), ``codec`` (this public API) and ``warmup`` (``python -m
lightning_halo.quant.warmup`` compiles the kernels ahead of a run).

This package imports only torch (numba lazily), never the rest of
``lightning_halo``.
"""

from .codec import (
    META_NBYTES,
    SUPPORTED_BITS,
    NonFiniteError,
    QuantizedRows,
    check_bits,
    dequantize,
    get_impl,
    numba_available,
    quantize,
    row_nbytes,
    set_impl,
    use_impl,
)

__all__ = [
    "META_NBYTES",
    "SUPPORTED_BITS",
    "NonFiniteError",
    "QuantizedRows",
    "check_bits",
    "dequantize",
    "get_impl",
    "numba_available",
    "quantize",
    "row_nbytes",
    "set_impl",
    "use_impl",
]
