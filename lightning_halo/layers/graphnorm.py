r"""PyG's graph-wide normalisations over the nodes of *all* partitions: exact on every backend.

``LayerNorm`` in ``mode="graph"`` (the default, and ``norm="layer_norm"`` in
``torch_geometric.nn.models``), ``GraphNorm``, ``InstanceNorm``, ``PairNorm``,
``MeanSubtractionNorm`` and ``GraphSizeNorm`` normalise with statistics over every node of the
graph they are given. In full-graph training that graph is the whole graph; on a partition it
would be the rank's own nodes. Each statistic here is a sum over the rows of every rank: one
all-reduce of :math:`\sum_i x_i` (and of a sum of squares where the norm divides by a spread),
differentiable (its backward is the all-reduce of the gradient), so forward and backward equal
single-process PyG, the norm's own formula term by term:

.. math::
    \text{LayerNorm:}\quad \frac{x - \mu}{\sigma + \epsilon}\odot\gamma + \beta,\qquad
    \mu = \frac{1}{NC}\sum_{i,c} x_{ic},\quad \sigma^2 = \frac{1}{NC}\sum_{i,c}(x_{ic}-\mu)^2

    \text{GraphNorm:}\quad \gamma\odot\frac{x - \alpha\odot\mu}{\sqrt{\operatorname{Var}(x - \alpha\odot\mu) + \epsilon}}
    + \beta,\qquad \mu = \frac{1}{N}\sum_i x_i

with :math:`N` the node count of the whole graph (the rows of all ranks). ``InstanceNorm``
(one graph: per channel over the nodes) is a batch norm of the node rows and keeps its running
statistics as PyG does. ``PairNorm`` centres with the global mean and scales with the global mean
squared norm (or each row's own, ``scale_individually=True``); ``GraphSizeNorm`` divides by
:math:`\sqrt{N}`.

The rows must each be counted once over the ranks: a partition's inner nodes or a per-node subset
of them. A call on the inner *and* halo rows is refused, as is a ``batch`` vector of several
graphs (a partition of full-graph training holds one). :class:`GraphNormHook` replaces the
module's ``forward`` while a partition is bound (:class:`~lightning_halo.HaloQuantStrategy`
installs it on every such norm of the model).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor
from torch.nn import Module

from lightning_halo.layers.batchnorm import AllSum, NormCall, NormHook, global_batch_norm, global_sum
from lightning_halo.layers.registry import GLOBAL_GRAPH_NORMS, UnsupportedLayerError


def is_global_graph_norm(module: Module) -> bool:
    """Whether ``module`` is one of PyG's graph-wide norms that :class:`GraphNormHook` runs over every rank's rows
    (a ``LayerNorm`` only in ``mode="graph"``; a user's class of the same name is not PyG's).

    Example:
        >>> from torch_geometric.nn import LayerNorm, PairNorm
        >>> is_global_graph_norm(PairNorm()), is_global_graph_norm(LayerNorm(4, mode="node"))
        (True, False)
    """
    cls = type(module)
    if cls.__name__ not in GLOBAL_GRAPH_NORMS or not cls.__module__.startswith("torch_geometric"):
        return False
    return cls.__name__ != "LayerNorm" or getattr(module, "mode", "graph") == "graph"


def global_graph_norm(x: Tensor, module: Module, name: str, all_sum: AllSum) -> Tensor:
    """``module`` (one of :data:`~lightning_halo.layers.registry.GLOBAL_GRAPH_NORMS`, no ``batch``) applied to this rank's rows ``x`` ``[n, C]``
    with the statistics of every rank's rows, as PyG computes it on the whole graph. Every rank must call it
    alike: one or two differentiable all-reduces (the row count rides on the first)."""
    cls = type(module).__name__

    def total(v: Tensor) -> Tensor:
        return global_sum(v, all_sum, name)

    def with_count(v: Tensor) -> tuple[Tensor, float]:
        """``v`` and this rank's row count summed over the ranks in one all-reduce (float64, as HAN's)."""
        count = torch.tensor([float(x.size(0))], dtype=torch.float64, device=x.device)
        summed = total(torch.cat([v.reshape(-1).double(), count]))
        return summed[:-1].to(x.dtype).reshape(v.shape), float(summed[-1])

    if cls == "InstanceNorm":
        return _instance_norm(x, module, NormCall(name, float(module.eps), all_sum))
    if cls == "GraphSizeNorm":
        n = float(all_sum(torch.tensor([float(x.size(0))], dtype=torch.float64, device=x.device), name)[0])
        return x * (n ** -0.5)
    if cls == "LayerNorm":
        s, n = with_count(x.sum().reshape(1))
        count = n * x.size(-1)
        centred = x - s / count
        std = (total(centred.square().sum().reshape(1)) / count).sqrt()
        out = centred / (std + module.eps)
        if module.weight is not None and module.bias is not None:
            out = out * module.weight + module.bias
        return out
    s, n = with_count(x.sum(0, keepdim=True))
    mean = s / n
    if cls == "MeanSubtractionNorm":
        return x - mean
    if cls == "GraphNorm":
        out = x - mean * module.mean_scale
        std = (total(out.square().sum(0, keepdim=True)) / n + module.eps).sqrt()
        return module.weight * out / std + module.bias
    # PairNorm
    centred = x - mean
    if module.scale_individually:
        return module.scale * centred / (module.eps + centred.norm(2, -1, keepdim=True))
    return module.scale * centred / (module.eps + total(centred.square().sum().reshape(1)) / n).sqrt()


def _instance_norm(x: Tensor, module: Module, call: NormCall) -> Tensor:
    """PyG's ``InstanceNorm`` of one graph: a batch norm of the node rows (``[N, C]``), input statistics in training
    or without running statistics; the running statistics updated as ``F.instance_norm`` does (no batch count)."""
    if not (module.training or not module.track_running_stats):
        return type(module).forward(module, x)  # running statistics: per node, no collective
    if module.momentum is None:
        raise UnsupportedLayerError(f"graph norm '{call.name}' (InstanceNorm) has momentum=None, which PyG's own call "
                                    "does not take either; give it a momentum")  # fmt: skip
    tracked = getattr(module, "num_batches_tracked", None)
    saved = None if tracked is None else tracked.clone()
    out = global_batch_norm(x, module, call)
    if tracked is not None:
        tracked.copy_(saved)  # F.instance_norm does not count batches
    return out


class GraphNormHook(NormHook):
    """A :class:`~lightning_halo.layers.batchnorm.NormHook` for one of PyG's graph-wide norms
    (:func:`is_global_graph_norm`): :func:`global_graph_norm`."""

    def _forward(self, x: Tensor, batch: Optional[Tensor] = None, *args: Any, **kwargs: Any) -> Tensor:
        module, bound = self.module, self.rows()
        if bound is None:
            return type(module).forward(module, x, batch, *args, **kwargs)
        cls = type(module).__name__
        if batch is not None and bool((batch != 0).any()):
            raise UnsupportedLayerError(
                f"graph norm '{self.name}' ({cls}) was called with a batch vector of several graphs: a partition of "
                "full-graph training holds one graph, and lightning-halo makes graph norms global over it only. Call "
                "it without batch"
            )
        if x.dim() != 2:
            raise UnsupportedLayerError(f"graph norm '{self.name}' ({cls}) expects node rows [N, C], got {list(x.shape)}")
        bound.check(x.size(0), f"graph norm '{self.name}' ({cls})")
        return global_graph_norm(x, module, self.name, bound.all_sum)


def find_graph_norms(model: Module) -> dict[str, Module]:
    """Every PyG graph-wide norm of ``model`` that :class:`GraphNormHook` makes global, by qualified name."""
    return {name: m for name, m in model.named_modules() if is_global_graph_norm(m)}
