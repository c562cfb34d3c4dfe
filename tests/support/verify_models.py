"""LightningModules for the verify tests: a plain GCN and the code around layers that is not exact on partitions."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv, global_mean_pool
from torch_geometric.utils import add_self_loops

#: What ``forward`` does around its two GCN layers.
MODES = (
    "plain",  # conv1 -> relu -> dropout -> conv2: exact
    "pool",  # h - global_mean_pool(h, None) between the layers: reads all nodes
    "position",  # emb(torch.arange(x.size(0))): per-node parameters by position
    "weight_slice",  # emb.weight[: x.size(0)]: the same without calling the Embedding
    "n_id",  # emb(batch.n_id): exact
    "center",  # a module of its own that subtracts the mean over the rows it sees
    "self_loops",  # add_self_loops(edge_index) in forward: refused on a partition
)


class Center(nn.Module):
    """``h - h.mean(0)``: a module whose output depends on every row it is given."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h - h.mean(0)


class VerifyGCN(L.LightningModule):
    def __init__(self, in_channels: int = 1433, out_channels: int = 7, num_nodes: int = 2708, mode: str = "plain",
                 hidden: int = 16, dim: int = 4) -> None:  # fmt: skip
        super().__init__()
        assert mode in MODES, mode
        self.mode = mode
        extra = dim if mode in ("position", "weight_slice", "n_id") else 0
        self.emb = nn.Embedding(num_nodes, dim) if extra else None
        self.conv1, self.conv2 = GCNConv(in_channels + extra, hidden), GCNConv(hidden, out_channels)
        self.center = Center() if mode == "center" else None

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, n_id: torch.Tensor) -> torch.Tensor:
        if self.mode == "position":
            x = torch.cat([x, self.emb(torch.arange(x.size(0), device=x.device))], 1)
        elif self.mode == "weight_slice":
            x = torch.cat([x, self.emb.weight[: x.size(0)]], 1)
        elif self.mode == "n_id":
            x = torch.cat([x, self.emb(n_id)], 1)
        elif self.mode == "self_loops":
            edge_index, _ = add_self_loops(edge_index)
        h = F.dropout(self.conv1(x, edge_index).relu(), p=0.5, training=self.training)
        if self.mode == "pool":
            h = h - global_mean_pool(h, None)
        elif self.mode == "center":
            h = self.center(h)
        return self.conv2(h, edge_index)

    def training_step(self, batch, batch_idx):
        out = self(batch.x, batch.edge_index, batch.n_id)
        return F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)
