"""HitsAtK equals OGB's definition; over ranks (torchmetrics' sync) it counts each pair once."""

from __future__ import annotations

import pytest
import torch

from lightning_halo.link.metrics import HitsAtK


def _ogb_hits(pos: torch.Tensor, neg: torch.Tensor, k: int) -> float:
    """OGB's ogb.linkproppred.Evaluator._eval_hits, written out."""
    if neg.numel() < k:
        return 1.0
    kth = torch.topk(neg, k)[0][-1]
    return float((pos > kth).float().cpu().mean())


@pytest.mark.parametrize("k", [1, 10, 50])
def test_equals_ogb(k: int) -> None:
    g = torch.Generator().manual_seed(k)
    pos, neg = torch.randn(200, generator=g) + 1, torch.randn(300, generator=g)
    m = HitsAtK(k)
    perm = torch.randperm(500, generator=g)  # any order, in pieces
    preds, target = torch.cat([pos, neg])[perm], torch.cat([torch.ones(200), torch.zeros(300)])[perm]
    for chunk in torch.split(torch.arange(500), 170):
        m.update(preds[chunk], target[chunk])
    assert float(m.compute()) == pytest.approx(_ogb_hits(pos, neg, k))


def test_fewer_negatives_than_k_and_errors() -> None:
    m = HitsAtK(5)
    m.update(torch.tensor([0.1, 0.2]), torch.tensor([1, 0]))
    assert float(m.compute()) == 1.0
    with pytest.raises(ValueError, match="positive integer"):
        HitsAtK(0)
    with pytest.raises(ValueError, match="no positive"):
        e = HitsAtK(1)
        e.update(torch.tensor([0.1]), torch.tensor([0]))
        e.compute()
