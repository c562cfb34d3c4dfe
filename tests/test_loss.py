"""What a rank back-propagates for each loss form (the multi-process parity: tests/strategy/test_rank_loss.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from lightning_halo.loss import scaled_loss


class _Part(dict):
    """The two facts of a partition the scaling reads."""

    def __init__(self, n_train: int, n_global: int) -> None:
        super().__init__(train_mask=torch.tensor([True] * n_train + [False] * 3))
        self.train_mask, self.num_train_global = self["train_mask"], n_global


def test_each_form_scales_as_documented() -> None:
    loss = torch.tensor(2.0)
    assert float(scaled_loss(loss, "train_mean", 4, _Part(3, 12))) == pytest.approx(2.0 * 4 * 3 / 12)
    assert float(scaled_loss(loss, "share", 4, _Part(3, 12))) == 8.0
    assert float(scaled_loss(loss, "none", 4, _Part(3, 12))) == 2.0
    assert float(scaled_loss(loss, "train_mean", 4, None)) == 2.0  # outside a halo step: as returned


def test_a_rank_without_train_nodes_weighs_zero_but_keeps_its_graph() -> None:
    logits = torch.tensor([1.0, 2.0], requires_grad=True)
    empty_mean = logits[:0].mean()  # what a loss over no train node is
    assert math.isnan(float(empty_mean))
    out = scaled_loss(empty_mean, "train_mean", 2, _Part(0, 5))
    assert float(out) == 0.0 and out.requires_grad
    out.backward()
    assert logits.grad.tolist() == [0.0, 0.0]


def test_a_graph_without_train_nodes_is_an_error() -> None:
    with pytest.raises(ValueError, match="no train node"):
        scaled_loss(torch.tensor(1.0), "train_mean", 2, SimpleNamespace(num_train_global=0))
