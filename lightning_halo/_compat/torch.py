"""torch internals lightning-halo relies on (pinned by ``tests/_compat/test_torch.py``)."""

from __future__ import annotations

from typing import Any, Callable, ContextManager

import torch
from torch import Tensor


def tensor_version(t: Tensor) -> int:
    """torch's counter of in-place changes of ``t`` (``Tensor._version``; views share their base's).

    Example:
        >>> t = torch.zeros(2); v = tensor_version(t); _ = t.add_(1); tensor_version(t) > v
        True
    """
    return t._version


def make_subclass(cls: type, t: Tensor) -> Tensor:
    """``t`` viewed as the tensor subclass ``cls`` (no copy; ``Tensor._make_subclass``)."""
    return Tensor._make_subclass(cls, t)


#: ``with plain_dispatch():`` tensor subclasses dispatch as plain tensors inside
#: (``torch._C.DisableTorchFunctionSubclass``; the class itself: it is entered on every product).
plain_dispatch: Callable[[], ContextManager[Any]] = torch._C.DisableTorchFunctionSubclass


def sparse_mm_functions() -> set[Any]:
    """Every function a sparse-dense product reaches ``__torch_function__`` through (``torch._sparse_mm`` included)."""
    funcs: set[Any] = {torch.sparse.mm, torch.mm, torch.matmul, Tensor.matmul, Tensor.__matmul__, Tensor.mm}
    if hasattr(torch, "_sparse_mm"):
        funcs.add(torch._sparse_mm)
    return funcs


def compiled_function(fn: Any) -> bool:
    """Whether ``fn`` (a function or bound method) is ``torch.compile``'s wrapper of another
    (torch's wrappers carry the original as ``_torchdynamo_orig_callable``)."""
    return getattr(getattr(fn, "__func__", fn), "_torchdynamo_orig_callable", None) is not None


def compiled_original(module: torch.nn.Module) -> "torch.nn.Module | None":
    """The module ``torch.compile`` wrapped, if ``module`` is its wrapper (``OptimizedModule._orig_mod``), else ``None``."""
    from torch._dynamo.eval_frame import OptimizedModule

    return module._orig_mod if isinstance(module, OptimizedModule) else None


#: The base class of every batch norm (``BatchNorm1d/2d/3d``, their lazy and sync versions).
BATCH_NORM_BASE: type = torch.nn.modules.batchnorm._BatchNorm
