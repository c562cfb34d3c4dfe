"""Pair ownership: the source's owner scores the pair, so the ranks' pairs partition the pairs."""

from __future__ import annotations

import torch

from lightning_halo.link.ownership import owned_mask, owned_pairs


def test_ranks_partition_the_pairs() -> None:
    g = torch.Generator().manual_seed(0)
    parts = torch.randint(0, 3, (40,), generator=g)
    pairs = torch.randint(0, 40, (2, 200), generator=g)
    labels = torch.rand(200, generator=g)
    seen = []
    for r in range(3):
        mask = owned_mask(40, (parts == r).nonzero().view(-1))
        index, label = owned_pairs(pairs, mask, labels)
        assert bool((parts[index[0]] == r).all())
        seen += [(int(a), int(b), float(c)) for (a, b), c in zip(index.t(), label)]
    assert sorted(seen) == sorted((int(a), int(b), float(c)) for (a, b), c in zip(pairs.t(), labels))
