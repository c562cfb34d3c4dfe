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

The first compilation of the numba kernels of a bit width is logged once, on rank 0, at
INFO on the ``lightning_halo.quant`` logger (printed to stderr unless logging is
configured), with its duration and the cache directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import types
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Protocol

import torch
from torch import Tensor

from lightning_halo._compat.torch import mark_sizes_dynamic

from ._torch import TorchKernels
from .format import row_nbytes
from .kernel_cache import choose_numba_cache_dir, numba_cache_dir

__all__ = ["Kernels", "get_impl", "kernels_for", "numba_available", "set_impl", "use_impl"]

log = logging.getLogger("lightning_halo.quant")

IMPLS = ("auto", "torch", "numba")


class Kernels(Protocol):
    """What a backend offers (see :mod:`._torch` for the contract)."""

    name: str
    dtypes: tuple[torch.dtype, ...]

    def quantize_rows(self, x: Tensor, out: Tensor, seed: int, bits: int) -> int: ...

    def dequantize_rows(self, data: Tensor, out: Tensor, bits: int) -> None: ...


# --------------------------------------------------------------------------- #
# Logging (rank 0 only; this package must not import Lightning)
# --------------------------------------------------------------------------- #


def _global_rank() -> int:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    for var in ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _info(msg: str, *args: Any) -> None:
    """INFO on rank 0, visible without any logging configuration (like Lightning's own logger)."""
    if _global_rank() != 0:
        return
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    if not log.hasHandlers():
        log.addHandler(logging.StreamHandler())
    log.info(msg, *args)


# --------------------------------------------------------------------------- #
# numba (CPU)
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Prepared:
    """The outcome of :meth:`NumbaKernels.prepare`: seconds spent, whether it compiled, where the cache is."""

    bits: int
    seconds: float
    compiled: bool
    cache_dir: str


class NumbaKernels:
    """Tensor adapter of :mod:`._numba`: zero-copy numpy views, one-time compile per bit width."""

    name = "numba"
    dtypes = (torch.float32, torch.float64)

    def __init__(self, mod: Any) -> None:
        self.mod = mod
        self._ready: set[int] = set()
        self._lock = threading.Lock()

    def prepare(self, bits: int) -> Optional[Prepared]:
        """Compile (or load from the cache) the float32 encoder and decoder of ``bits``, once.

        Logs the first compilation of each bit width (INFO, rank 0).

        Returns:
            What happened, or ``None`` if ``bits`` was already prepared in this process.
        """
        if bits in self._ready:
            return None
        with self._lock:
            if bits in self._ready:
                return None
            import numpy as np

            disps = self.mod.dispatchers(bits)
            misses = sum(sum(d.stats.cache_misses.values()) for d in disps)
            t0 = time.perf_counter()
            x = np.zeros((1, 8), dtype=np.float32)
            if bits == 16:
                self.mod.quantize_rows(x, np.zeros((1, 8), dtype=np.uint16), 0, 16)
            else:
                rec = np.zeros((1, row_nbytes(8, bits)), dtype=np.uint8)
                self.mod.quantize_rows(x, rec, 0, bits)
                self.mod.dequantize_rows(rec, x, bits)
            took = time.perf_counter() - t0
            compiled = sum(sum(d.stats.cache_misses.values()) for d in disps) > misses
            self._ready.add(bits)
        done = Prepared(bits, took, compiled, str(disps[0].stats.cache_path))
        if compiled:
            _info(
                "lightning-halo: compiled the numba codec kernels for bits=%d in %.1f s (first use with this "
                "kernel cache); cached in %s, so later runs load them in well under a second",
                bits, took, done.cache_dir,
            )  # fmt: skip
        else:
            log.debug("lightning-halo: loaded the numba codec kernels for bits=%d from %s in %.3f s", bits, done.cache_dir, took)
        return done

    def quantize_rows(self, x: Tensor, out: Tensor, seed: int, bits: int) -> int:
        self.prepare(bits)
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
        self.prepare(bits)
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
                    with numba_cache_dir(choose_numba_cache_dir()):
                        from . import _numba as mod
                except ImportError:  # numba not installed: the documented torch fallback
                    _numba_failed = True
                except Exception as exc:  # a numba/llvmlite mismatch, no usable cache directory, ...
                    _numba_failed = True
                    warnings.warn(
                        f"lightning-halo: the numba codec kernels cannot be loaded ({exc!r}); using the slower "
                        "torch path. If the error is about caching, set NUMBA_CACHE_DIR to a writable directory.",
                        RuntimeWarning,
                        stacklevel=3,
                    )
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
        >>> from lightning_halo.quant import quantize
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
_compile_logged = False


def compile_enabled() -> bool:
    """Whether CUDA chunk functions run under ``torch.compile`` (``LIGHTNING_HALO_COMPILE`` != ``"0"``)."""
    return hasattr(torch, "compile") and os.environ.get("LIGHTNING_HALO_COMPILE", "1") != "0"


def _own_code(fn: Callable, key: tuple) -> Callable:
    """``fn`` with a code object of its own, named after ``key``.

    Dynamo keeps its compiled entries on the code object: the closures of one code object (one
    per bit width) would share them, and a closed-over constant that changes between calls is made
    a symbol (automatic dynamic). With its own code object each bit width is compiled as a constant.
    """
    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{'_'.join(map(str, key))}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def compile_chunk(key: tuple, fn: Callable, backend: Any = "inductor") -> Callable:
    """``torch.compile`` chunk function ``fn`` (named by ``key``): its closed-over ``bits`` a constant,
    the sizes of its tensor arguments symbols, so one graph serves every shape.

    Only the tensors' sizes are marked dynamic: with ``dynamic=True`` the closed-over ``bits`` became
    a symbol too, and torch 2.11 failed to trace ``1 << bits`` on it (found on the GPU check).
    """
    compiled = torch.compile(_own_code(fn, key), dynamic=False, backend=backend)

    def run(*args: Tensor) -> Tensor:
        for a in args:
            mark_sizes_dynamic(a)
        return compiled(*args)

    return run


def _compile_wrap(key: tuple, fn: Callable) -> Callable:
    """``torch.compile`` a chunk function once per key; eager fallback on failure.

    Keys name a kernel and its bit width (a constant of the compiled code); the tensors' sizes
    (rows, row width) are dynamic: one compilation serves every shape.
    """
    if not compile_enabled():
        return fn
    got = _compiled.get(key)
    if got is not None:
        return got
    try:
        compiled = compile_chunk(key, fn)
    except Exception:  # pragma: no cover - depends on the install
        _compiled[key] = fn
        return fn
    state = {"ok": True, "first": True}

    def got(*args: Tensor) -> Tensor:
        global _compile_logged
        if state["ok"]:
            try:
                if not state["first"]:
                    return compiled(*args)
                t0 = time.perf_counter()
                out = compiled(*args)
                state["first"] = False
                took = time.perf_counter() - t0
                if not _compile_logged:
                    _compile_logged = True
                    _info("lightning-halo: torch.compile of the CUDA codec kernel %s took %.1f s "
                          "(once per kernel and process)", key, took)  # fmt: skip
                else:
                    log.debug("lightning-halo: torch.compile of the CUDA codec kernel %s took %.1f s", key, took)
                return out
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
