r"""A seeded link split with :class:`~torch_geometric.transforms.RandomLinkSplit`'s semantics.

For an undirected graph (every edge present in both directions) each undirected edge
``{i, j}`` is one candidate (its ``i <= j`` direction; a self-loop once). A validation or test
edge is held out of the message-passing graph in *both* directions. The message-passing graph
of training and validation is the training edges (in both directions when undirected), that
of the test stage the training and validation edges, as in ``RandomLinkSplit``; the
supervision pairs are the held-out edges once each (``i <= j``). For a directed graph every
edge is a candidate and only that direction is held out. The edges of two node types (an edge
type ``(src, rel, dst)`` with ``src != dst``; ``num_nodes=(N_src, N_dst)``) are directed: their
reverse is another edge type, which :class:`~lightning_halo.HaloLinkDataModule` rebuilds from
the split (``rev_edge_type``, as ``RandomLinkSplit``'s ``rev_edge_types``).

The permutation is the one ``RandomLinkSplit`` draws after ``torch.manual_seed(seed)``, so the
positives of each split equal PyG's for the same seed; the fixed validation and test negatives
come from :class:`~lightning_halo.link.negatives.NegativeSampler` over the whole graph's edges
(PyG draws them from Python's ``random``, which no two processes share).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor
from torch_geometric.utils import is_undirected as pyg_is_undirected

from lightning_halo.link.negatives import NegativeSampler

#: The ``epoch`` tag of the fixed validation/test negatives (training epochs are >= 0).
EVAL_NEGATIVES_EPOCH = -1


@dataclass(frozen=True)
class LinkSplit:
    r"""The result of :func:`link_split` (global node ids throughout).

    Attributes:
        edge_index (Tensor): message-passing edges of training and validation ``[2, E_mp]``
            (training edges; both directions for an undirected graph).
        test_edge_index (Tensor): message-passing edges of the test stage (training and
            validation edges; both directions for an undirected graph).
        train_pos (Tensor): training positives ``[2, E_train]`` (once each).
        val_pos, test_pos (Tensor): held-out positives ``[2, E_val]``, ``[2, E_test]``.
        val_neg, test_neg (Tensor): fixed negatives, ``neg_ratio`` per positive.
        undirected (bool): whether the graph was split as undirected.
    """

    edge_index: Tensor
    test_edge_index: Tensor
    train_pos: Tensor
    val_pos: Tensor
    test_pos: Tensor
    val_neg: Tensor
    test_neg: Tensor
    undirected: bool

    def labelled(self, stage: str) -> tuple[Tensor, Tensor]:
        """``(edge_label_index, edge_label)`` of ``"val"`` or ``"test"``: positives (1) then negatives (0)."""
        pos, neg = (self.val_pos, self.val_neg) if stage == "val" else (self.test_pos, self.test_neg)
        return torch.cat([pos, neg], 1), _labels(pos.size(1), neg.size(1))


def _labels(num_pos: int, num_neg: int) -> Tensor:
    return torch.cat([torch.ones(num_pos), torch.zeros(num_neg)])


def _count(value: Union[int, float], total: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{name} must be a fraction in [0, 1) or a count >= 0, got {value!r}")
    if isinstance(value, float):
        if value >= 1:
            raise ValueError(f"{name}={value} as a fraction must be < 1; pass an int for a number of edges")
        return int(value * total)
    return int(value)


def link_split(
    edge_index: Tensor,
    num_nodes: Union[int, tuple[int, int]],
    num_val: Union[int, float] = 0.1,
    num_test: Union[int, float] = 0.1,
    neg_ratio: float = 1.0,
    seed: int = 0,
    undirected: Optional[bool] = None,
) -> LinkSplit:
    r"""Split a graph's edges into message-passing edges and supervision pairs, seeded.

    Args:
        edge_index (Tensor): the graph's edges ``[2, E]``.
        num_nodes (int or tuple): number of nodes; ``(N_src, N_dst)`` for the edges of two node
            types (bipartite: split as directed, negatives drawn from every source-target pair).
        num_val (int or float, optional): validation edges (a fraction of the candidates, or a
            count). (default: ``0.1``)
        num_test (int or float, optional): test edges. (default: ``0.1``)
        neg_ratio (float, optional): validation/test negatives per positive. (default: ``1.0``)
        seed (int, optional): seed of the permutation and of the negatives. (default: ``0``)
        undirected (bool, optional): split as undirected; ``None`` detects it
            (:func:`torch_geometric.utils.is_undirected`). (default: ``None``)

    Returns:
        A :class:`LinkSplit`.

    Example:
        >>> from lightning_halo import load_graph
        >>> data = load_graph("cora")
        >>> s = link_split(data.edge_index, data.num_nodes, seed=0)
        >>> s.undirected, s.val_pos.size(1), s.edge_index.size(1) + 2 * (s.val_pos.size(1) + s.test_pos.size(1))
        (True, 527, 10556)
    """
    if neg_ratio < 0:
        raise ValueError(f"neg_ratio must be >= 0, got {neg_ratio}")
    edge_index = edge_index.cpu().long()  # pair ids are products of node ids: no int32
    if isinstance(num_nodes, (tuple, list)):
        if undirected:
            raise ValueError(
                "undirected=True, but these are the edges of two node types (num_nodes is a tuple): their reverse is "
                "another edge type. Pass undirected=False (or None); HaloLinkDataModule(rev_edge_type=...) rebuilds it."
            )
        undirected = False
    elif undirected is None:
        undirected = bool(pyg_is_undirected(edge_index, num_nodes=num_nodes))
    elif undirected and not pyg_is_undirected(edge_index, num_nodes=num_nodes):
        raise ValueError(
            "undirected=True but edge_index is not symmetric (an edge lacks its reverse); make it undirected with "
            "torch_geometric.utils.to_undirected, or pass undirected=False (or None to detect it)."
        )
    g = torch.Generator().manual_seed(int(seed))
    if undirected:
        cand = (edge_index[0] <= edge_index[1]).nonzero().view(-1)
        cand = cand[torch.randperm(cand.numel(), generator=g)]
    else:
        cand = torch.randperm(edge_index.size(1), generator=g)
    n_val, n_test = _count(num_val, cand.numel(), "num_val"), _count(num_test, cand.numel(), "num_test")
    n_train = cand.numel() - n_val - n_test
    if n_train <= 0:
        raise ValueError(
            f"num_val={num_val} and num_test={num_test} leave no training edge of {cand.numel()}; lower them."
        )
    train, val, test = cand[:n_train], cand[n_train : n_train + n_val], cand[n_train + n_val :]
    train_pos, val_pos = edge_index[:, train], edge_index[:, val]
    train_val = torch.cat([train_pos, val_pos], 1)
    mp, mp_test = (torch.cat([e, e.flip(0)], 1) if undirected else e for e in (train_pos, train_val))
    k_val, k_test = int(n_val * neg_ratio), int(n_test * neg_ratio)
    neg = NegativeSampler(edge_index, num_nodes, seed).sample(k_val + k_test, EVAL_NEGATIVES_EPOCH)
    k_val = min(k_val, neg.size(1))
    return LinkSplit(mp, mp_test, train_pos, val_pos, edge_index[:, test], neg[:, :k_val], neg[:, k_val:], undirected)
