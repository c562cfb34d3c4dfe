"""Sorting ``int64`` ids fast on the CPU: NumPy's vectorised sort, ties broken by position.

Building CSR matrices in the partition step is mostly sorting ``int64`` keys. On this kind of
machine NumPy's ``np.sort`` (SIMD quicksort) sorts 4M ``int64`` about fifteen times faster than
``torch.sort`` and ``torch.unique`` (measured: 0.06 s against 1.0 s), while both libraries'
*argsorts* are slow. A stable argsort of non-negative keys below ``bound`` is therefore computed
as one ``np.sort`` of ``key * 2^b + position``, whose low ``b`` bits are the permutation.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def sorted_unique(keys: Tensor) -> Tensor:
    """``torch.unique(keys)`` (sorted) for a 1-D integer CPU tensor, by ``np.sort``.

    Example:
        >>> sorted_unique(torch.tensor([5, 1, 5, 3, 1])).tolist()
        [1, 3, 5]
    """
    if keys.numel() == 0:
        return keys.clone()
    s = np.sort(keys.numpy())
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return torch.from_numpy(s[keep])


def stable_argsort(keys: Tensor, bound: int) -> Tensor:
    """``torch.argsort(keys, stable=True)`` for non-negative integer keys below ``bound``.

    Packs each key with its position into one ``int64`` when they fit (else falls back to a
    stable ``np.argsort``).

    Example:
        >>> stable_argsort(torch.tensor([2, 0, 2, 1, 0]), 3).tolist()
        [1, 4, 3, 0, 2]
    """
    n = keys.numel()
    if n == 0:
        return torch.empty(0, dtype=torch.long)
    bits = max(1, (n - 1).bit_length())
    if max(1, int(bound)).bit_length() + bits > 62:
        return torch.from_numpy(np.argsort(keys.numpy(), kind="stable"))
    packed = (keys.numpy().astype(np.int64) << bits) | np.arange(n, dtype=np.int64)
    packed.sort()
    return torch.from_numpy(packed & ((1 << bits) - 1))
