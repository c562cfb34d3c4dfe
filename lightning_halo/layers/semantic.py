r"""HANConv's semantic attention over the nodes of *all* partitions: exact on every backend.

:class:`~torch_geometric.nn.conv.HANConv` (`Wang et al. <https://arxiv.org/abs/1903.07293>`_)
weighs the outputs :math:`\mathbf{Z}_\Phi` of its metapaths :math:`\Phi` for each target type by

.. math::
    \beta_\Phi = \operatorname{softmax}_\Phi\Big(\mathbf{q}^\top \frac{1}{|\mathcal{V}|}
    \sum_{i \in \mathcal{V}} \tanh(\mathbf{W} \mathbf{z}_i^\Phi + \mathbf{b})\Big),

a mean over *every* node of the type: global attention, which a partition does not hold. Here
each rank sums :math:`\tanh(\mathbf{W}\mathbf{z}_i^\Phi + \mathbf{b})` over its inner rows
only (its halo rows are other ranks' nodes, and their outputs are incomplete), one all-reduce
adds the sums and the node counts, and the mean is the whole graph's. Its backward all-reduces
the gradient of the sums (every rank's loss reads the same mean), so parameters and inputs get
the single-process gradient.

PyG computes this in ``torch_geometric.nn.conv.han_conv.group``, a module-level function that
``HANConv.forward`` calls once per node type, in the order of ``x_dict``.
:func:`install_group` (at the first :meth:`SemanticCall.open`) replaces it once per process with a dispatcher that runs the exact
version while a :class:`SemanticCall` is active *on the calling thread* (ranks may be threads)
and PyG's own otherwise; :meth:`SemanticCall.close` refuses the call if the dispatcher did not
see one call per node type (a PyG whose ``HANConv`` no longer calls ``group`` would otherwise be
silently inexact).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Module

from lightning_halo.layers.batchnorm import AllSum, global_sum
from lightning_halo.layers.registry import UnsupportedLayerError

_local = threading.local()
_lock = threading.Lock()
_original: Optional[Callable[..., Any]] = None


def global_semantic_attention(
    xs: list[Tensor], q: Tensor, k_lin: Module, n_inner: int, all_sum: AllSum, name: str
) -> tuple[Optional[Tensor], Optional[Tensor]]:
    r"""PyG's ``han_conv.group`` with the mean over the target type's nodes of every rank.

    Every rank must call it alike (one collective forward, one backward), also with no rows.

    Args:
        xs (list[Tensor]): each metapath's output for the type, ``[n_local, C]`` (inner rows first).
        q (Tensor): the semantic attention vector, ``[1, C]``.
        k_lin (Module): the semantic attention's linear map.
        n_inner (int): how many of the rows are the rank's own nodes.
        all_sum (callable): the sum over all ranks.
        name (str): the layer (for traffic and errors).

    Returns:
        the weighted sum ``[n_local, C]`` and the weights ``[len(xs), C]``, as PyG's ``group``.
    """
    if len(xs) == 0:
        return None, None
    out = torch.stack(xs)  # [E, n_local, C]
    keys = torch.tanh(k_lin(out[:, :n_inner])).sum(1)  # [E, C]: this rank's nodes only
    # float64 on the wire: the node count stays exact past 2^24 nodes, and the sums lose nothing
    count = torch.full((1,), float(n_inner), dtype=torch.float64, device=keys.device)
    summed = global_sum(torch.cat([keys.reshape(-1).double(), count]), all_sum, name)
    n = float(summed[-1].detach())
    if n == 0:  # no node of the type anywhere: PyG returns the empty stack's view and no weights
        return out.view(0, out.size(-1)), None
    mean = (summed[:-1].view(keys.shape) / n).to(keys.dtype)
    attn = F.softmax((q * mean).sum(-1), dim=0)
    return torch.sum(attn.view(len(xs), 1, -1) * out, dim=0), attn


class SemanticCall:
    """One running ``HANConv`` call on a partition: its node types (in ``x_dict`` order), their inner
    row counts and the all-reduce; active on the calling thread until :meth:`close`."""

    def __init__(self, layer: str, cls: str, types: list[str], n_inner: dict[str, int], all_sum: AllSum) -> None:
        self.layer, self.cls, self.types, self.n_inner, self.all_sum = layer, cls, types, n_inner, all_sum
        self.calls = 0

    def group(self, xs: list[Tensor], q: Tensor, k_lin: Module) -> tuple[Optional[Tensor], Optional[Tensor]]:
        if self.calls >= len(self.types):
            raise UnsupportedLayerError(self._unexpected(f"more than {len(self.types)}"))
        node_type = self.types[self.calls]
        self.calls += 1
        n_inner = self.n_inner[node_type]
        if xs and xs[0].size(0) < n_inner:
            raise UnsupportedLayerError(
                f"layer '{self.layer}' ({self.cls}): the semantic attention of node type {node_type!r} got "
                f"{xs[0].size(0)} rows, fewer than the type's {n_inner} inner nodes; {self._why}"
            )
        return global_semantic_attention(xs, q, k_lin, n_inner, self.all_sum, f"{self.layer}[{node_type}]")

    def open(self) -> SemanticCall:
        install_group()
        stack = getattr(_local, "calls", None)
        if stack is None:
            stack = _local.calls = []
        stack.append(self)
        return self

    def close(self, failed: bool) -> None:
        """Leave the call; refuse it if PyG's forward did not reach the semantic attention once per node type."""
        stack = _local.calls
        assert stack and stack[-1] is self
        stack.pop()
        if not failed and self.calls != len(self.types):
            raise UnsupportedLayerError(self._unexpected(str(self.calls)))

    _why = "this PyG version's HANConv does not compute it as lightning-halo expects, so it cannot be made exact"

    def _unexpected(self, seen: str) -> str:
        return (
            f"layer '{self.layer}' ({self.cls}) computed its semantic attention {seen} time(s) for "
            f"{len(self.types)} node types; {self._why}"
        )


def _dispatch(xs: list[Tensor], q: Tensor, k_lin: Module) -> tuple[Optional[Tensor], Optional[Tensor]]:
    stack = getattr(_local, "calls", None)
    if stack:
        return stack[-1].group(xs, q, k_lin)
    assert _original is not None
    return _original(xs, q, k_lin)


def install_group() -> None:
    """Route PyG's ``han_conv.group`` through :func:`_dispatch` (once per process; PyG's own runs
    wherever no :class:`SemanticCall` is active on the thread)."""
    global _original
    from torch_geometric.nn.conv import han_conv

    with _lock:
        if han_conv.group is not _dispatch:
            _original = han_conv.group
            han_conv.group = _dispatch


def uses_semantic_attention(module: Module) -> bool:
    """Whether ``module`` is a ``HANConv``, whose semantic attention is made global (:class:`SemanticCall`)."""
    from torch_geometric.nn.conv import HANConv

    return isinstance(module, HANConv)
