r"""Generated heterogeneous graphs shaped like OGB-MAG, with classes planted so that training means something.

OGB-MAG (`Hu et al., 2020 <https://arxiv.org/abs/2005.00687>`_) has papers (128 features, 349
venues as labels), authors, institutions and fields of study (no features); papers cite papers,
authors write papers and are affiliated with institutions, papers have topics. Per paper it has
about 1.54 authors, 0.012 institutions, 0.081 fields, 7.3 citations, 9.7 authorships, 10.2
topics; per author 1.4 affiliations. :func:`mag_like_graph` draws a graph with these ratios at
any size: every paper gets a class, its features a noisy class centroid, and each edge joins
nodes of the same class with probability ``homophily`` (authors, institutions and fields have a
class too), so a GNN reading the neighbours beats one reading the features alone.

Only numpy's seeded generator is used: the same arguments give the same graph on every machine.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: OGB-MAG's counts per paper (authors, institutions, fields) and edges per paper or author.
MAG_RATIOS = {"authors": 1.54, "institutions": 0.0118, "fields": 0.0813, "cites": 7.3, "writes": 9.7, "topics": 10.2,
              "affiliations_per_author": 1.4}  # fmt: skip


def _of_class(rng: np.random.Generator, classes_of: np.ndarray, wanted: np.ndarray, homophily: float) -> np.ndarray:
    """For every entry of ``wanted`` (a class), a node whose class it is with probability ``homophily``, else any node."""
    order = np.argsort(classes_of, kind="stable")
    counts = np.bincount(classes_of, minlength=int(wanted.max(initial=0)) + 1)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    k = counts[wanted]
    at = starts[wanted] + (rng.random(wanted.size) * np.maximum(k, 1)).astype(np.int64)
    pick = order[np.minimum(at, classes_of.size - 1)]  # a class without nodes: replaced below by anyone
    anyone = rng.integers(0, classes_of.size, wanted.size)
    same = (rng.random(wanted.size) < homophily) & (k > 0)
    return np.where(same, pick, anyone)


def mag_like_graph(
    papers: int = 2000,
    *,
    classes: int = 16,
    features: int = 64,
    homophily: float = 0.8,
    signal: float = 0.6,
    reverse: bool = True,
    seed: int = 0,
) -> Any:
    r"""A :class:`~torch_geometric.data.HeteroData` shaped like OGB-MAG, with ``papers`` papers (see the module docstring).

    Args:
        papers (int, optional): papers; the other counts follow OGB-MAG's ratios. (default: ``2000``)
        classes (int, optional): paper classes (``y``). (default: ``16``)
        features (int, optional): paper features (float32). (default: ``64``)
        homophily (float, optional): probability that an edge joins nodes of one class. (default: ``0.8``)
        signal (float, optional): how far apart the class centroids of the features are (the noise is 1).
            (default: ``0.6``)
        reverse (bool, optional): add a reverse edge type for each (``rev_<relation>``, as
            ``T.ToUndirected()`` names them), so every type receives messages. (default: ``True``)
        seed (int, optional): numpy's seed. (default: ``0``)

    Shapes:
        - paper: ``x`` ``[P, features]``, ``y`` ``[P]``, ``train_mask``/``val_mask``/``test_mask`` (50/25/25 %)
        - author, institution, field_of_study: ``num_nodes`` only

    Example:
        >>> g = mag_like_graph(500, seed=1)
        >>> g["paper"].x.shape, g["author"].num_nodes, len(g.edge_types)
        (torch.Size([500, 64]), 770, 8)
    """
    from torch_geometric.data import HeteroData

    if papers < 10:
        raise ValueError(f"papers must be at least 10, got {papers}")
    rng = np.random.default_rng(seed)
    r = MAG_RATIOS
    n = {"paper": papers, "author": max(1, round(papers * r["authors"])),
         "institution": max(1, round(papers * r["institutions"])), "field_of_study": max(1, round(papers * r["fields"]))}  # fmt: skip
    cls = {t: rng.integers(0, classes, count) for t, count in n.items()}
    centroids = rng.normal(0.0, signal, (classes, features)).astype(np.float32)
    x = centroids[cls["paper"]] + rng.normal(0.0, 1.0, (papers, features)).astype(np.float32)

    def edges(src: str, dst: str, count: int) -> np.ndarray:
        s = rng.integers(0, n[src], count)
        return np.stack([s, _of_class(rng, cls[dst], cls[src][s], homophily)])

    relations = {
        ("paper", "cites", "paper"): edges("paper", "paper", round(papers * r["cites"])),
        ("author", "writes", "paper"): edges("author", "paper", round(papers * r["writes"])),
        ("author", "affiliated_with", "institution"): edges("author", "institution",
                                                             round(n["author"] * r["affiliations_per_author"])),
        ("paper", "has_topic", "field_of_study"): edges("paper", "field_of_study", round(papers * r["topics"])),
    }  # fmt: skip
    data = HeteroData()
    data["paper"].x = torch.from_numpy(x)
    data["paper"].y = torch.from_numpy(cls["paper"])
    split = rng.random(papers)
    for name, (lo, hi) in {"train_mask": (0.0, 0.5), "val_mask": (0.5, 0.75), "test_mask": (0.75, 1.0)}.items():
        data["paper"][name] = torch.from_numpy((split >= lo) & (split < hi))
    for t in ("author", "institution", "field_of_study"):
        data[t].num_nodes = n[t]
    for (src, rel, dst), ei in relations.items():
        data[src, rel, dst].edge_index = torch.from_numpy(ei)
        if reverse:
            data[dst, f"rev_{rel}", src].edge_index = torch.from_numpy(ei[::-1].copy())
    return data
