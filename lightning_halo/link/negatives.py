r"""Negatives from the whole graph, seeded by the edge set and the epoch (the same draw on every rank).

PyG's :func:`~torch_geometric.utils.negative_sampling` draws from Python's global ``random``
module, so two processes (or a partitioned run and a single-process one) never draw the same
pairs. :class:`NegativeSampler` draws the same way (uniform over the non-edges, no self-loops,
no repeats) from a generator seeded by a digest of the *set* of edges, the user's seed and the
epoch: every rank of a job and a single-process run with the same arguments get the same
negatives, whatever the order of ``edge_index``.
"""

from __future__ import annotations

import hashlib
from typing import Optional, Union

import torch
from torch import Tensor

from lightning_halo._compat.pyg import pair_ids, pairs_of
from lightning_halo.partition.halo_partition import tensor_digest

#: Rounds of over-sampling before giving up on a very dense graph (PyG tries 3 times).
MAX_ROUNDS = 8


def _first_occurrences(values: Tensor) -> Tensor:
    """``values`` without repeats, in the order of their first occurrence."""
    uniq, inverse = torch.unique(values, return_inverse=True)
    first = torch.full_like(uniq, values.numel()).scatter_reduce_(
        0, inverse, torch.arange(values.numel()), "amin"
    )
    return values[first.sort().values]


class NegativeSampler:
    r"""Uniform negative pairs of one graph, reproducible from ``(edge set, seed, epoch)``.

    Holds the graph's edges as sorted pair ids (one ``int64`` per edge), so each draw is
    :math:`O(k \log E)`. The pairs it returns are not in ``edge_index``, not self-loops and
    distinct; as with PyG, fewer than asked may come back when the graph is nearly complete.

    Args:
        edge_index (Tensor): the edges to avoid, ``[2, E]`` (typically the message-passing edges
            of the training split, as in PyG's ``examples/link_pred.py``).
        num_nodes (int or tuple): number of nodes; or ``(N_src, N_dst)`` for the pairs of two node
            types (bipartite, as PyG's ``size``: source ids in ``[0, N_src)``, targets in
            ``[0, N_dst)``, and a pair ``(i, i)`` is no self-loop).
        seed (int, optional): the user's seed. (default: ``0``)
        force_undirected (bool, optional): sample undirected pairs (``i < j``) and return both
            directions, as PyG's ``force_undirected=True``. (default: ``False``)

    Shapes:
        - **input:** ``edge_index`` :math:`(2, E)`
        - **output of** :meth:`sample`: :math:`(2, k)`

    Example:
        >>> s = NegativeSampler(torch.tensor([[0, 1], [1, 2]]), num_nodes=4, seed=0)
        >>> torch.equal(s.sample(3, epoch=5), s.sample(3, epoch=5))
        True
    """

    def __init__(
        self, edge_index: Tensor, num_nodes: Union[int, tuple[int, int]], seed: int = 0, force_undirected: bool = False
    ) -> None:
        if edge_index.dim() != 2 or edge_index.size(0) != 2:
            raise ValueError(f"edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
        bipartite = isinstance(num_nodes, (tuple, list))
        sizes = (int(num_nodes[0]), int(num_nodes[1])) if bipartite else (int(num_nodes),) * 2  # type: ignore[index, arg-type]
        if bipartite and force_undirected:
            raise ValueError("force_undirected needs one node set; pairs of two node types (a tuple num_nodes) have no reverse")
        for row, n in zip(edge_index, sizes):
            if row.numel() and (int(row.min()) < 0 or int(row.max()) >= n):
                raise ValueError(f"edge_index holds node ids outside [0, {n}); pass the graph's num_nodes"
                                 + (" as (num_src_nodes, num_dst_nodes)" if bipartite else ""))  # fmt: skip
        self.num_nodes: Union[int, tuple[int, int]] = sizes if bipartite else sizes[0]
        self.seed, self.force_undirected = int(seed), bool(force_undirected)
        self.device = edge_index.device
        idx, self.population = pair_ids(edge_index.cpu().long(), num_nodes, force_undirected)
        self._edges = torch.unique(idx)  # sorted; the set, independent of order and repeats
        self.digest = tensor_digest(self._edges)

    def generator(self, epoch: int) -> torch.Generator:
        """The generator of ``epoch``: seeded by the edge set's digest, ``num_nodes``, the seed and the epoch."""
        key = f"{self.digest}:{self.num_nodes}:{self.force_undirected}:{self.seed}:{int(epoch)}".encode()
        seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & 0x7FFF_FFFF_FFFF_FFFF
        return torch.Generator().manual_seed(seed)

    def sample(self, num_neg_samples: int, epoch: int = 0) -> Tensor:
        """``num_neg_samples`` negative pairs of ``epoch`` (``[2, k]``; with ``force_undirected``, both directions)."""
        if num_neg_samples < 0:
            raise ValueError(f"num_neg_samples must be >= 0, got {num_neg_samples}")
        k = num_neg_samples // 2 if self.force_undirected else num_neg_samples
        free = self.population - self._edges.numel()
        if k == 0 or free <= 0:
            return torch.empty(2, 0, dtype=torch.long, device=self.device)
        g = self.generator(epoch)
        oversample = int(1.1 * k * self.population / free) + 16
        found = torch.empty(0, dtype=torch.long)
        for _ in range(MAX_ROUNDS):
            rnd = torch.randint(self.population, (oversample,), generator=g)
            rnd = rnd[~self._is_edge(rnd)]
            found = _first_occurrences(torch.cat([found, rnd]))  # earlier draws keep their place
            if found.numel() >= k:
                break
        pairs = pairs_of(found[:k], self.num_nodes, self.force_undirected)
        return pairs.to(self.device)

    def _is_edge(self, ids: Tensor) -> Tensor:
        pos = torch.searchsorted(self._edges, ids).clamp_max(max(self._edges.numel() - 1, 0))
        return self._edges[pos] == ids if self._edges.numel() else torch.zeros_like(ids, dtype=torch.bool)


def negative_sampling(
    edge_index: Tensor,
    num_nodes: Optional[Union[int, tuple[int, int]]] = None,
    num_neg_samples: Optional[Union[int, float]] = None,
    method: str = "sparse",
    force_undirected: bool = False,
    *,
    seed: int = 0,
    epoch: int = 0,
) -> Tensor:
    r"""Drop-in for :func:`torch_geometric.utils.negative_sampling`, reproducible across processes.

    The same arguments as PyG's (a tuple ``num_nodes`` for the pairs of two node types, as PyG's
    bipartite ``size``; ``method`` is accepted for compatibility, both draw uniformly without
    repeats), plus ``seed`` and ``epoch``: the draw depends only on
    the *set* of edges, ``num_nodes``, ``seed`` and ``epoch``, never on global random state.
    So a single-process PyG loop calling ``negative_sampling(train_edge_index, N, k, seed=s,
    epoch=e)`` draws the negatives that :class:`~lightning_halo.HaloLinkDataModule` hands the
    ranks of a distributed run in epoch ``e``.

    Args:
        edge_index (Tensor): the edges to avoid.
        num_nodes (int or tuple, optional): number of nodes, or ``(N_src, N_dst)`` for pairs of two
            node types (bipartite). (default: ``edge_index.max() + 1``)
        num_neg_samples (int or float, optional): pairs to return; a float is a fraction of
            ``E``. (default: ``E``)
        method (str, optional): ``"sparse"`` or ``"dense"`` (same draw). (default: ``"sparse"``)
        force_undirected (bool, optional): undirected pairs in both directions. (default: ``False``)
        seed (int, optional): seed. (default: ``0``)
        epoch (int, optional): the epoch (a new draw per epoch). (default: ``0``)

    Returns:
        ``[2, k]`` ``int64`` pairs on ``edge_index``'s device.

    Example:
        >>> ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
        >>> negative_sampling(ei, 4, 2, seed=1, epoch=0).shape
        torch.Size([2, 2])
    """
    if method not in ("sparse", "dense"):
        raise ValueError(f"method must be 'sparse' or 'dense' (as in PyG), got {method!r}")
    n: Union[int, tuple[int, int]]
    if isinstance(num_nodes, (tuple, list)):
        n = (int(num_nodes[0]), int(num_nodes[1]))
    else:
        n = int(edge_index.max()) + 1 if num_nodes is None and edge_index.numel() else int(num_nodes or 0)
    if num_neg_samples is None:
        num_neg_samples = edge_index.size(1)
    elif isinstance(num_neg_samples, float):
        num_neg_samples = int(num_neg_samples * edge_index.size(1))
    return NegativeSampler(edge_index, n, seed, force_undirected).sample(int(num_neg_samples), epoch)
