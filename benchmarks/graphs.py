"""Graphs for the benchmarks: the real ones in ../shared/datasets and a generated SBM at scale."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch_geometric.data import Data

from benchmarks.shared import shared_path

ROOT = Path(__file__).resolve().parents[1]

REAL = {
    "cora": "cora",
    "citeseer": "pyg:Planetoid:{root}:CiteSeer",
    "actor": "pyg:Actor:{root}/Actor",
    "tolokers": "pyg:HeterophilousGraphDataset:{root}:Tolokers",
    "cornell5": "pyg:LINKXDataset:{root}:cornell5",
    "amherst41": "pyg:LINKXDataset:{root}:amherst41",
    "johnshopkins55": "pyg:LINKXDataset:{root}:johnshopkins55",
}


def shared_datasets() -> Path:
    """The shared datasets folder (:mod:`benchmarks.shared`: ``$LIGHTNING_HALO_DATASETS``,
    ``$LIGHTNING_HALO_SHARED/datasets`` or ``../shared/datasets``); an error names all three."""
    return shared_path("datasets", override="LIGHTNING_HALO_DATASETS")


def sbm(
    num_nodes: int = 1_000_000,
    avg_degree: int = 12,
    num_blocks: int = 64,
    num_classes: int = 8,
    num_features: int = 64,
    p_in: float = 0.8,
    noise: float = 2.0,
    seed: int = 0,
) -> Data:
    r"""A stochastic block model with learnable labels, generated in a few seconds.

    ``num_blocks`` blocks of equal size; every node draws ``avg_degree`` out-edges, each to a
    random node of its own block with probability ``p_in``, else to a random node; the edge set
    is symmetrised (so ``num_nodes * avg_degree * 2`` directed edges). A block's class is
    ``block % num_classes``; features are the class's random mean plus Gaussian noise of std
    ``noise``, so features alone are weak and neighbourhoods help. Masks: 50/25/25.
    """
    g = torch.Generator().manual_seed(seed)
    block = torch.arange(num_nodes) * num_blocks // num_nodes
    size = num_nodes // num_blocks
    src = torch.arange(num_nodes).repeat_interleave(avg_degree)
    same = torch.rand(src.numel(), generator=g) < p_in
    local = torch.randint(0, size, (src.numel(),), generator=g) + block[src] * size
    dst = torch.where(same, local.clamp_max(num_nodes - 1), torch.randint(0, num_nodes, (src.numel(),), generator=g))
    edge_index = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], dim=1)
    y = block % num_classes
    means = torch.randn(num_classes, num_features, generator=g)
    x = means[y] + noise * torch.randn(num_nodes, num_features, generator=g)
    perm = torch.randperm(num_nodes, generator=g)
    masks = [torch.zeros(num_nodes, dtype=torch.bool) for _ in range(3)]
    masks[0][perm[: num_nodes // 2]] = True
    masks[1][perm[num_nodes // 2 : 3 * num_nodes // 4]] = True
    masks[2][perm[3 * num_nodes // 4 :]] = True
    return Data(x=x, edge_index=edge_index, y=y, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])


def graph_source(name: str) -> str | Data:
    """What ``HaloDataModule(data=...)`` takes for a benchmark graph name (``sbm`` or ``sbm:<nodes>``)."""
    if name.startswith("sbm"):
        n = int(name.split(":")[1]) if ":" in name else 1_000_000
        results = Path(os.environ.get("LIGHTNING_HALO_BENCH_RESULTS", ROOT / "benchmarks" / "results"))
        cache = results / "tmp" / f"sbm-{n}.pt"
        if not cache.is_file():
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            torch.save(sbm(n), tmp)
            os.replace(tmp, cache)
        return str(cache)
    spec = REAL[name]
    return spec.format(root=shared_datasets()) if "{root}" in spec else spec
