"""What lightning-halo remembers between calls: values computed from tensors, and warnings it gave.

A partition's normalised edge weights, its fused adjacency or the halo of its input features
are computed once and reused while the tensors they were computed from are *the same objects,
unchanged*: :class:`TensorMemo` checks both (identity through a weak reference, so a freed
tensor whose id is reused never matches; in-place changes through torch's version counter).
"""

from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict
from typing import Any, Callable, Hashable, Optional, TypeVar

from torch import Tensor

from lightning_halo._compat.torch import tensor_version

T = TypeVar("T")


class TensorMemo:
    r"""A bounded memo of values keyed by a hashable key and the tensors they were computed from.

    A hit requires every tensor to be the same object as when the value was stored, with no
    in-place change since (``None`` stands for an absent tensor). The oldest entry goes first
    when ``limit`` is reached, so a new tensor every step (e.g. learned edge weights) cannot
    grow memory.

    Args:
        limit (int, optional): entries kept. (default: ``32``)

    Example:
        >>> memo = TensorMemo()
        >>> w = torch.ones(3)
        >>> memo.get_or_build("norm", (w,), lambda: w / 3) is memo.get("norm", (w,))
        True
        >>> _ = w.mul_(2); memo.get("norm", (w,)) is None  # changed in place: no longer valid
        True
    """

    def __init__(self, limit: int = 32) -> None:
        self.limit = limit
        self._entries: OrderedDict[Hashable, tuple[tuple[Any, ...], tuple[int, ...], Any]] = OrderedDict()

    @staticmethod
    def _slot(key: Hashable, tensors: tuple[Optional[Tensor], ...]) -> Hashable:
        return (key, tuple([None if t is None else id(t) for t in tensors]))

    def get(self, key: Hashable, tensors: tuple[Optional[Tensor], ...] = ()) -> Any:
        """The value stored for ``key`` and exactly these, unchanged, tensors; else ``None``."""
        entry = self._entries.get(self._slot(key, tensors))
        if entry is None:
            return None
        refs, versions, value = entry
        for ref, version, t in zip(refs, versions, tensors):
            if t is None:
                continue
            if ref() is not t or version != tensor_version(t):
                return None
        return value

    def put(self, key: Hashable, tensors: tuple[Optional[Tensor], ...], value: T) -> T:
        """Store ``value`` for ``key`` and ``tensors`` (as they are now); returns ``value``."""
        slot = self._slot(key, tensors)
        self._entries.pop(slot, None)
        while len(self._entries) >= self.limit:
            self._entries.popitem(last=False)
        refs = tuple(None if t is None else weakref.ref(t) for t in tensors)
        versions = tuple(-1 if t is None else tensor_version(t) for t in tensors)
        self._entries[slot] = (refs, versions, value)
        return value

    def get_or_build(self, key: Hashable, tensors: tuple[Optional[Tensor], ...], build: Callable[[], T]) -> T:
        """The stored value, or ``build()`` stored and returned."""
        hit = self.get(key, tensors)
        return hit if hit is not None else self.put(key, tensors, build())

    def clear(self) -> None:
        self._entries.clear()


class WarnOnce:
    """Gives each warning once per key: once per process for a module-level instance, once per
    run for one held by a run's object.

    Example:
        >>> warn_once = WarnOnce()
        >>> warn_once(("spmm", "bfloat16"), "said once")  # doctest: +SKIP
    """

    def __init__(self) -> None:
        self._said: set[Hashable] = set()

    def __call__(self, key: Hashable, message: str, stacklevel: int = 3) -> None:
        if key in self._said:
            return
        self._said.add(key)
        warnings.warn(message, stacklevel=stacklevel)
