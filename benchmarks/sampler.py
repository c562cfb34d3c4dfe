"""A uniform neighbour sampler standing in for PyG's ``NeighborLoader`` in the baseline.

PyG's ``NeighborLoader`` needs ``pyg-lib`` or ``torch-sparse``, and neither has wheels for this
torch build on the package index, so the mini-batch baseline uses this sampler with the same
interface and semantics (``num_neighbors`` per hop, the seed nodes first, ``batch_size`` and
``input_id`` on each batch), sampling neighbours uniformly *with* replacement (duplicates
removed), where PyG samples without replacement.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor
from torch_geometric.data import Data


class UniformNeighborLoader:
    """Mini-batches of ``batch_size`` seed nodes with their sampled ``len(num_neighbors)``-hop in-neighbourhood.

    Example:
        >>> for batch in UniformNeighborLoader(data, [10, 10], batch_size=1024, input_nodes=train_idx):
        ...     out = model(batch.x, batch.edge_index)[: batch.batch_size]
    """

    def __init__(
        self, data: Data, num_neighbors: list[int], batch_size: int, input_nodes: Tensor, shuffle: bool = False, seed: int = 0
    ) -> None:
        self.data, self.fanouts, self.batch_size, self.shuffle = data, num_neighbors, batch_size, shuffle
        self.input_nodes = input_nodes
        n = data.num_nodes
        dst, order = torch.sort(data.edge_index[1], stable=True)
        self.src = data.edge_index[0][order]
        self.colptr = torch.zeros(n + 1, dtype=torch.long)
        self.colptr[1:] = torch.cumsum(torch.bincount(dst, minlength=n), 0)
        self.local = torch.full((n,), -1, dtype=torch.long)
        self.gen = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return (self.input_nodes.numel() + self.batch_size - 1) // self.batch_size

    def __iter__(self) -> Iterator[Data]:
        idx = self.input_nodes
        if self.shuffle:
            idx = idx[torch.randperm(idx.numel(), generator=self.gen)]
        offsets = torch.arange(idx.numel())
        for start in range(0, idx.numel(), self.batch_size):
            yield self._sample(idx[start : start + self.batch_size], offsets[start : start + self.batch_size])

    def _sample(self, seeds: Tensor, input_id: Tensor) -> Data:
        nodes = [seeds]
        self.local[seeds] = torch.arange(seeds.numel())
        count = seeds.numel()
        frontier = seeds
        rows, cols = [], []
        for k in self.fanouts:
            start, deg = self.colptr[frontier], self.colptr[frontier + 1] - self.colptr[frontier]
            has = deg > 0
            f, start, deg = frontier[has], start[has], deg[has]
            pick = (torch.rand(f.numel(), k, generator=self.gen) * deg[:, None]).long() + start[:, None]
            nbr = self.src[pick].view(-1)
            tgt = f.repeat_interleave(k)
            pair = torch.unique(torch.stack([nbr, tgt]), dim=1)  # drop duplicate samples
            nbr, tgt = pair[0], pair[1]
            new = torch.unique(nbr[self.local[nbr] < 0])
            self.local[new] = torch.arange(count, count + new.numel())
            count += new.numel()
            nodes.append(new)
            rows.append(self.local[nbr])
            cols.append(self.local[tgt])
            frontier = new
        n_id = torch.cat(nodes)
        self.local[n_id] = -1  # reset for the next batch
        d = self.data
        return Data(
            x=d.x[n_id], y=d.y[n_id], edge_index=torch.stack([torch.cat(rows), torch.cat(cols)]),
            n_id=n_id, batch_size=seeds.numel(), input_id=input_id, num_nodes=n_id.numel(),
        )  # fmt: skip
