"""Heterogeneous graphs for the tests: a generated one of every awkward kind, and HeCo's DBLP from the shared datasets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import HeteroData

from benchmarks.shared import find_shared


def generated_hetero(seed: int = 0, papers: int = 300, authors: int = 200, venues: int = 7) -> HeteroData:
    """Papers (features, labels, masks), authors (features), venues (no features: ``num_nodes`` only);
    paper->paper citations (a relation within one type, with repeats and self-loops), author->paper,
    paper->venue, and a reverse type; an author with no edges."""
    g = torch.Generator().manual_seed(seed)
    data = HeteroData()
    data["paper"].x = torch.randn(papers, 6, generator=g, dtype=torch.float64)
    data["paper"].y = torch.randint(0, 3, (papers,), generator=g)
    perm = torch.randperm(papers, generator=g)
    for name, chunk in zip(("train_mask", "val_mask", "test_mask"), perm.chunk(3)):
        mask = torch.zeros(papers, dtype=torch.bool)
        mask[chunk] = True
        data["paper"][name] = mask
    data["author"].x = torch.randn(authors, 4, generator=g, dtype=torch.float64)
    data["venue"].num_nodes = venues
    cites = torch.randint(0, papers, (2, 4 * papers), generator=g)
    cites[:, :5] = torch.arange(5).repeat(2, 1)  # self-loops
    data["paper", "cites", "paper"].edge_index = torch.cat([cites, cites[:, :7]], dim=1)  # and repeats
    writes = torch.stack([torch.randint(0, authors - 1, (2 * papers,), generator=g),  # author authors-1: no edges
                          torch.randint(0, papers, (2 * papers,), generator=g)])  # fmt: skip
    data["author", "writes", "paper"].edge_index = writes
    data["paper", "rev_writes", "author"].edge_index = writes.flip(0)
    data["paper", "in", "venue"].edge_index = torch.stack([torch.arange(papers), torch.randint(0, venues, (papers,), generator=g)])
    return data


def dblp(root: Path | None = None) -> HeteroData | None:
    """HeCo's DBLP (author 4,057 labelled in 4 classes; paper, term, conference) with reverse edge types, or
    ``None`` where the shared datasets are not on this machine. Splits: ``train_20``/``val_20``/``test_20``."""
    import scipy.sparse as sp

    base = root or find_shared("datasets", override="LIGHTNING_HALO_DATASETS")
    if base is None or not (Path(base) / "heco" / "dblp").is_dir():
        return None
    d = Path(base) / "heco" / "dblp"
    data = HeteroData()
    data["author"].x = torch.from_numpy(sp.load_npz(d / "a_feat.npz").toarray()).float()
    data["paper"].x = torch.from_numpy(sp.load_npz(d / "p_feat.npz").toarray()).float()
    data["term"].x = torch.from_numpy(np.load(d / "t_feat.npz")).float()
    data["conference"].num_nodes = 20
    labels = torch.from_numpy(np.load(d / "labels.npy")).long()
    data["author"].y = labels
    for split in ("train", "val", "test"):
        mask = torch.zeros(labels.numel(), dtype=torch.bool)
        mask[torch.from_numpy(np.load(d / f"{split}_20.npy")).long()] = True
        data["author"][f"{split}_mask"] = mask
    for name, (src, dst) in {"pa": ("paper", "author"), "pc": ("paper", "conference"), "pt": ("paper", "term")}.items():
        ei = torch.from_numpy(np.loadtxt(d / f"{name}.txt", dtype=np.int64).T)
        data[src, "to", dst].edge_index = ei
        data[dst, "rev_to", src].edge_index = ei.flip(0)
    return data
