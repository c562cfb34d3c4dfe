"""Which kernels encode and decode a tensor: the one place the codec's backend is chosen.

===========================  ======================================================
tensor                       kernels
===========================  ======================================================
CPU, numba importable        fused numba kernels (:mod:`._numba`), compiled on first
                             use and cached on disk (:mod:`.kernel_cache`)
CPU, no numba / disabled     the pure-torch reference (:mod:`._torch`)
CUDA                         the torch kernels, each chunk function under
                             ``torch.compile`` (eager if compilation fails)
===========================  ======================================================

Every backend has the same interface (``quantize_rows(x, out, seed, bits)``,
``dequantize_rows(data, out, bits)`` on tensors, ``dtypes`` it takes directly) and writes
the same records (bit-identical on CPU; on CUDA a code may differ by one where
``torch.compile`` fuses the dither into an FMA, see ``docs/quantization.md``).

Switches: :func:`set_impl` / :func:`use_impl` (CPU), ``LIGHTNING_HALO_NUMBA=0`` (torch
path under ``"auto"``), ``LIGHTNING_HALO_COMPILE=0`` (eager torch kernels on CUDA).
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from typing import Any, Callable, Iterator, Optional, Protocol

import torch
from torch import Tensor

from ._torch import TorchKernels

__all__ = ["Kernels", "get_impl", "kernels_for", "numba_available", "set_impl", "use_impl"]

IMPLS = ("auto", "torch", "numba")


class Kernels(Protocol):
    """What a backend offers (see :mod:`._torch` for the contract)."""

    name: str
    dtypes: tuple[torch.dtype, ...]

    def quantize_rows(self, x: Tensor, out: Tensor, seed: int, bits: int) -> int: ...

    def dequantize_rows(self, data: Tensor, out: Tensor, bits: int) -> None: ...


# --------------------------------------------------------------------------- #
# numba (CPU)
# --------------------------------------------------------------------------- #


class NumbaKernels:
    """Tensor adapter of :mod:`._numba`: zero-copy numpy views of the tensors."""

    name = "numba"
    dtypes = (torch.float32, torch.float64)

    def __init__(self, mod: Any) -> None:
        self.mod = mod

    def quantize_rows(self, x: Tensor, out: Tensor, seed: int, bits: int) -> int:
        xn = x.numpy()
        if bits != 16:
            return int(self.mod.quantize_rows(xn, out.numpy(), seed, bits))
        if out.data_ptr() % 2 == 0:
            return int(self.mod.quantize_rows(xn, out.numpy().view("<u2"), seed, bits))
        tmp = torch.empty(out.shape, dtype=torch.uint8)  # misaligned user `out`: encode aside
        bad = int(self.mod.quantize_rows(xn, tmp.numpy().view("<u2"), seed, bits))
        out.copy_(tmp)
        return bad

    def dequantize_rows(self, data: Tensor, out: Tensor, bits: int) -> None:
        self.mod.dequantize_rows(data.numpy(), out.numpy(), bits)


_impl = "auto"
_numba_kernels: Optional[NumbaKernels] = None
_numba_failed = False
_lock = threading.Lock()


def _load_numba() -> Optional[NumbaKernels]:
    """Import the numba kernels once; ``None`` if numba is unavailable."""
    global _numba_kernels, _numba_failed
    if _numba_kernels is None and not _numba_failed:
        with _lock:
            if _numba_kernels is None and not _numba_failed:
                try:
                    from . import _numba as mod
                except Exception:  # ImportError, or a numba/llvmlite mismatch
                    _numba_failed = True
                else:
                    _numba_kernels = NumbaKernels(mod)
    return _numba_kernels


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
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
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
# torch.compile (CUDA)
# --------------------------------------------------------------------------- #

_compiled: dict[tuple, Callable] = {}


def compile_enabled() -> bool:
    """Whether CUDA chunk functions run under ``torch.compile`` (``LIGHTNING_HALO_COMPILE`` != ``"0"``)."""
    return hasattr(torch, "compile") and os.environ.get("LIGHTNING_HALO_COMPILE", "1") != "0"


def _compile_wrap(key: tuple, fn: Callable) -> Callable:
    """``torch.compile`` a chunk function once per key; eager fallback on failure."""
    if not compile_enabled():
        return fn
    got = _compiled.get(key)
    if got is not None:
        return got
    try:
        compiled = torch.compile(fn, dynamic=True)
    except Exception:  # pragma: no cover - depends on the install
        _compiled[key] = fn
        return fn
    state = {"ok": True}

    def got(*args: Tensor) -> Tensor:
        if state["ok"]:
            try:
                return compiled(*args)
            except Exception as exc:  # pragma: no cover - CUDA only
                warnings.warn(f"torch.compile of halo codec failed ({exc!r}); using eager", stacklevel=2)
                state["ok"] = False
                _compiled[key] = fn
        return fn(*args)

    _compiled[key] = got
    return got


_TORCH = TorchKernels()
_TORCH_CUDA = TorchKernels(wrap=_compile_wrap)


def kernels_for(device: torch.device) -> Kernels:
    """The kernels that encode and decode tensors on ``device`` (see the table above).

    Example:
        >>> kernels_for(torch.device("cpu")).name in ("numba", "torch")
        True
    """
    if device.type == "cuda":
        return _TORCH_CUDA
    if device.type == "cpu" and _use_numba_cpu():
        return _load_numba()  # type: ignore[return-value]
    return _TORCH
