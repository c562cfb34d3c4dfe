r"""What a rank's loss means, and a helper to make any node-level loss exactly global.

DDP averages the ranks' gradients. For the result to be the gradient of the *whole graph's*
objective, :class:`~lightning_halo.HaloQuantStrategy` multiplies the loss a rank's
``training_step`` returns by a factor that depends on what that loss is
(``scale_loss``):

* ``"train_mean"`` (default): the mean over the partition's train nodes, e.g.
  ``F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])``. Factor
  :math:`P\,n_r/N_{train}`: :math:`\frac{1}{P}\sum_r \nabla (P\,n_r/N) L_r = \nabla
  \frac{1}{N}\sum_i \ell_i`. Any other loss under this setting is scaled wrongly.
* ``"share"``: this rank's share of the global objective, i.e. the ranks' losses *sum* to
  it: a sum over the rank's nodes (``reduction="sum"``), a sum divided by a global count, or
  :func:`global_mean` of any per-node loss and mask (a subset of the train nodes, UniMP's
  label trick, class weights, ...). Factor :math:`P`.
* ``"none"``: the loss as returned; DDP averages the ranks' gradients.

Example:
    >>> per_node = F.cross_entropy(out, batch.y, reduction="none")  # doctest: +SKIP
    >>> loss = global_mean(per_node, batch.train_mask & subset)  # with scale_loss="share"  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union, get_args

import torch
import torch.distributed as dist
from torch import Tensor

LossScaling = Literal["train_mean", "share", "none"]
LOSS_SCALINGS: tuple[LossScaling, ...] = get_args(LossScaling)


def check_scale_loss(value: Union[bool, str]) -> LossScaling:
    """``scale_loss`` as one of :data:`LOSS_SCALINGS` (``True`` is ``"train_mean"``, ``False`` is ``"none"``).

    Example:
        >>> check_scale_loss(True)
        'train_mean'
    """
    if value is True:
        return "train_mean"
    if value is False:
        return "none"
    if value not in LOSS_SCALINGS:
        raise ValueError(
            f"scale_loss={value!r} is not supported; choose 'train_mean' (the loss is a mean over the partition's "
            "train nodes), 'share' (the ranks' losses sum to the global objective, e.g. lightning_halo.global_mean) "
            "or 'none' (as returned)."
        )
    return value  # type: ignore[return-value]


def scaled_loss(loss: Tensor, scale_loss: LossScaling, world_size: int, part: Optional[Any]) -> Tensor:
    r"""What rank :math:`r` back-propagates for the loss its ``training_step`` returned (see the module docstring).

    ``part`` is the rank's partition (its train nodes :math:`n_r` and the graph's
    :math:`N_{train}`); a rank without train nodes returns a NaN mean, which is weighted 0 but
    keeps its graph (every collective of backward must still run).

    Example:
        >>> float(scaled_loss(torch.tensor(2.0), "share", world_size=3, part=None))
        6.0
    """
    if scale_loss == "share":
        return loss * world_size
    if scale_loss != "train_mean" or part is None:
        return loss
    total = int(part.num_train_global)
    if total == 0:
        raise ValueError("the graph has no train node (train_mask is all False); nothing to train on.")
    if hasattr(part, "train_count"):  # a heterogeneous partition: the labelled type's train nodes
        n_r = part.train_count()
    else:
        n_r = int(part.train_mask.sum()) if "train_mask" in part else 0
    if n_r == 0:
        # The mean over zero nodes is NaN; keep the graph (every collective must run) but weigh it 0.
        return torch.where(torch.isfinite(loss), loss, torch.zeros_like(loss)) * 0.0
    return loss * (world_size * n_r / total)


def global_mean(values: Tensor, mask: Optional[Tensor] = None, weight: Optional[Tensor] = None) -> Tensor:
    r"""This rank's share of the (weighted) mean of ``values`` over the selected nodes of *all* ranks.

    .. math::
        \text{share}_r = \frac{\sum_{i \in V_r,\, m_i} w_i\, v_i}{\sum_{q} \sum_{i \in V_q,\, m_i} w_i}

    The denominator is summed over the ranks with one all-reduce (every rank must call this
    at the same point of its step; a rank with no selected node contributes 0 and still
    calls it). The shares of all ranks sum to the whole graph's mean, so train with
    ``HaloQuantStrategy(scale_loss="share")``. On one process (or outside a distributed run)
    it is the plain mean.

    Args:
        values (Tensor): per-node values ``[n]`` (e.g. ``F.cross_entropy(..., reduction="none")``).
        mask (Tensor, optional): bool ``[n]``, the nodes that count. (default: all)
        weight (Tensor, optional): per-node weights ``[n]`` (e.g. class weights ``w[y]``, as
            ``F.cross_entropy(weight=w)`` averages). (default: 1)

    Returns:
        A 0-d tensor, differentiable in ``values``.

    Example:
        >>> global_mean(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([True, False, True]))
        tensor(2.)
    """
    if values.dim() != 1:
        values = values.reshape(values.size(0), -1).sum(1) if values.dim() > 1 else values.reshape(1)
    w = torch.ones_like(values) if weight is None else weight.to(values.dtype)
    if mask is not None:
        if mask.dtype != torch.bool or mask.shape != values.shape:
            raise ValueError(f"mask must be a bool tensor of shape {tuple(values.shape)}, got {mask.dtype} {tuple(mask.shape)}")
        w = w * mask.to(values.dtype)
    total = w.detach().sum().to(torch.float64).reshape(1)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        total = total.to(values.device)
        dist.all_reduce(total)
    denom = total.to(values.dtype).reshape(())
    local = (torch.where(w != 0, values, torch.zeros_like(values)) * w).sum()
    if float(denom) == 0.0:
        return local * 0.0  # nothing selected anywhere: a zero that keeps the graph (every collective runs)
    return local / denom
