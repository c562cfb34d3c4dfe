r"""Which rank scores which pair: the owner of the pair's source node, so every pair is scored exactly once."""

from __future__ import annotations

import torch
from torch import Tensor


def owned_mask(num_nodes: int, n_id: Tensor) -> Tensor:
    """A bool ``[num_nodes]`` mask of the nodes this rank owns (``n_id``: its inner global ids)."""
    mask = torch.zeros(num_nodes, dtype=torch.bool)
    mask[n_id.cpu()] = True
    return mask


def owned_pairs(edge_label_index: Tensor, owned: Tensor, edge_label: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    r"""The pairs (and labels) whose source node this rank owns.

    The ranks' masks partition the nodes, so the ranks' results partition the pairs: each is
    scored once, whichever ranks own its endpoints.

    Args:
        edge_label_index (Tensor): pairs in global ids ``[2, M]``.
        owned (Tensor): bool ``[N]``, the nodes of this rank (:func:`owned_mask`).
        edge_label (Tensor, optional): labels ``[M]``.

    Example:
        >>> owned_pairs(torch.tensor([[0, 1, 2], [2, 0, 1]]), torch.tensor([True, False, True]))[0]
        tensor([[0, 2],
                [2, 1]])
    """
    keep = owned[edge_label_index[0].cpu()].to(edge_label_index.device)
    return edge_label_index[:, keep], None if edge_label is None else edge_label[keep]
