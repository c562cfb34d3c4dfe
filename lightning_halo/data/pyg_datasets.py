"""Load PyG dataset classes from a local, read-only folder (no download), as a training-ready Data or HeteroData."""

from __future__ import annotations

import contextlib
import io
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Union
from urllib.parse import parse_qs

import torch
from torch_geometric.data import Data, HeteroData

from lightning_halo.data.validation import GraphValidationError
from lightning_halo.partition.options import MASK_KEYS

PREFIX = "pyg:"


def load_pyg_dataset(spec: str) -> Union[Data, HeteroData]:
    r"""Load ``pyg:<Class>:<root>[:<name>][?split=<k>&seed=<s>]`` from local raw files.

    ``<Class>`` is a class in :mod:`torch_geometric.datasets` (``Planetoid``,
    ``HeterophilousGraphDataset``, ``LINKXDataset``, ``Actor``, ...), ``<root>`` the folder laid
    out as that class expects (raw files present, so nothing is downloaded) and ``<name>`` its
    dataset name. The raw files are copied to a temporary folder first, so a read-only root
    works. Masks with several splits (``[N, k]``) are reduced to split ``k`` (default 0); a
    graph without masks gets a seeded 50/25/25 split of its labelled nodes (``y >= 0``), as in
    the LINKX benchmarks. A heterogeneous class (``DBLP``, ``IMDB``, ``OGB_MAG``, ``HGBDataset``,
    ...) gives a :class:`~torch_geometric.data.HeteroData`, its masks treated so on every node
    type with ``y``.

    Example:
        >>> load_pyg_dataset("pyg:Planetoid:../shared/datasets:CiteSeer")  # doctest: +SKIP
        Data(x=[3327, 3703], edge_index=[2, 9104], y=[3327], train_mask=[3327], ...)
    """
    body, _, query = spec[len(PREFIX) :].partition("?")
    options = {k: v[-1] for k, v in parse_qs(query).items()}
    parts = body.split(":")
    if len(parts) not in (2, 3):
        raise GraphValidationError(f"{spec!r}: expected pyg:<Class>:<root>[:<name>], e.g. pyg:Planetoid:data:Cora")
    root = Path(parts[1])
    name = parts[2] if len(parts) == 3 else None
    cls = _dataset_class(spec)
    if not root.is_dir():
        raise GraphValidationError(f"{spec!r}: {root} is not a directory")
    with tempfile.TemporaryDirectory(prefix="lightning-halo-") as tmp:
        if name is None:
            shutil.copytree(root, Path(tmp) / "ds")
            dataset = _quietly(cls, str(Path(tmp) / "ds"))
        else:
            for sub in dict.fromkeys((name, name.lower())):  # both spellings occur in PyG's classes
                if (root / sub).is_dir():
                    shutil.copytree(root / sub, Path(tmp) / sub)
            dataset = _quietly(cls, tmp, name)
        data = dataset[0]
    split, seed = int(options.get("split", 0)), int(options.get("seed", 0))
    if isinstance(data, HeteroData):
        for store in data.node_stores:
            if "y" in store:
                _normalise_masks(store, split, seed)
        return data
    return _normalise_masks(data, split, seed)


def _dataset_class(spec: str) -> type:
    import torch_geometric.datasets as pyg_datasets

    cls_name = spec[len(PREFIX) :].partition("?")[0].split(":")[0]
    cls = getattr(pyg_datasets, cls_name, None)
    if cls is None:
        raise GraphValidationError(f"{spec!r}: torch_geometric.datasets has no class {cls_name!r}")
    return cls


def may_be_heterogeneous(spec: str) -> bool:
    """Whether the class of a ``pyg:`` spec can build a :class:`~torch_geometric.data.HeteroData` (its source
    names it), so the data module loads it up front to tell; the others are loaded where they are needed."""
    import inspect

    try:
        return "HeteroData" in inspect.getsource(_dataset_class(spec))
    except (OSError, TypeError):  # no source to read: load it to tell
        return True


def _quietly(cls: type, *args: str) -> Any:
    """Build the dataset without PyG's "Processing..."/"Done!" lines (stderr; every rank, every run:
    we always process a fresh copy). Anything else it writes to stderr (warnings) is passed on."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return cls(*args)
    finally:
        lines = captured.getvalue().splitlines(keepends=True)
        sys.stderr.write("".join(line for line in lines if line.strip() not in ("Processing...", "Done!")))


def _normalise_masks(data: Any, split: int, seed: int) -> Any:
    """A Data's (or one node type's) masks as one split: ``[N, k]`` masks reduced to ``split``, absent ones drawn."""
    if all(k in data for k in MASK_KEYS):
        for k in MASK_KEYS:
            if data[k].dim() == 2:
                if not 0 <= split < data[k].size(1):
                    raise GraphValidationError(f"split={split} but the dataset has {data[k].size(1)} splits")
                data[k] = data[k][:, split].contiguous()
        return data
    labelled = torch.nonzero(data.y.view(-1) >= 0).view(-1) if data.y.dim() == 1 else torch.arange(data.num_nodes)
    perm = labelled[torch.randperm(labelled.numel(), generator=torch.Generator().manual_seed(seed))]
    n = perm.numel()
    cut1, cut2 = n // 2, (3 * n) // 4
    for key, idx in zip(MASK_KEYS, (perm[:cut1], perm[cut1:cut2], perm[cut2:])):
        mask = torch.zeros(data.num_nodes, dtype=torch.bool)
        mask[idx] = True
        data[key] = mask
    return data
