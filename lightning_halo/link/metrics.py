r"""Link-prediction metrics over all ranks: OGB's Hits@K as a torchmetrics Metric (ROC-AUC is torchmetrics' own).

Each rank updates a metric with the pairs it owns (every pair is owned by exactly one rank, see
:class:`~lightning_halo.HaloLinkDataModule`) and logs the Metric object; ``compute()`` gathers
the scores of all ranks, so the value is the whole graph's. For ROC-AUC use
:class:`torchmetrics.classification.BinaryAUROC` (``thresholds=None``: exact) the same way.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat


class HitsAtK(Metric):
    r"""Hits@K as in OGB's link-prediction evaluator: the fraction of positive pairs scored
    above the :math:`K`-th highest negative score (1.0 when there are fewer than :math:`K`
    negatives).

    Args:
        k (int): :math:`K`.
        **kwargs: as for :class:`~torchmetrics.Metric`.

    Shapes:
        - **update:** ``preds`` :math:`(M,)` scores, ``target`` :math:`(M,)` labels (1 positive, 0 negative)
        - **compute:** a 0-d tensor

    Example:
        >>> m = HitsAtK(k=1)
        >>> m.update(torch.tensor([0.9, 0.2, 0.5, 0.1]), torch.tensor([1, 1, 0, 0]))
        >>> m.compute()
        tensor(0.5000)
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, k: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        self.k = k
        self.add_state("pos", default=[], dist_reduce_fx="cat")
        self.add_state("neg", default=[], dist_reduce_fx="cat")

    def update(self, preds: Tensor, target: Tensor) -> None:
        if preds.shape != target.shape or preds.dim() != 1:
            raise ValueError(f"preds and target must be 1-D of one shape, got {tuple(preds.shape)} and {tuple(target.shape)}")
        preds = preds.detach().float()
        positive = target.bool()
        self.pos.append(preds[positive])
        self.neg.append(preds[~positive])

    def compute(self) -> Tensor:
        pos, neg = dim_zero_cat(self.pos), dim_zero_cat(self.neg)
        if pos.numel() == 0:
            raise ValueError("HitsAtK has no positive pair: update it with labelled pairs (label 1) first")
        if neg.numel() < self.k:
            return torch.tensor(1.0, device=pos.device)
        kth = torch.topk(neg, self.k).values[-1]
        return (pos > kth).float().mean()
