"""Graphs shipped inside the package, loaded without any network access."""

from __future__ import annotations

from importlib import resources

import numpy as np
import torch
from torch_geometric.data import Data

#: Bundled dataset names (case-insensitive) and their files in ``lightning_halo/datasets``.
BUNDLED: dict[str, str] = {"cora": "cora.npz"}


def load_bundled(name: str) -> Data:
    """Load a dataset shipped with the package (see ``lightning_halo/datasets/README.md``).

    Args:
        name (str): one of :data:`BUNDLED` (case-insensitive), e.g. ``"cora"``.

    Returns:
        The graph as a :class:`~torch_geometric.data.Data` with ``x``, ``edge_index``, ``y``
        and the public ``train_mask`` / ``val_mask`` / ``test_mask``.

    Example:
        >>> load_bundled("cora")
        Data(x=[2708, 1433], edge_index=[2, 10556], y=[2708], train_mask=[2708], val_mask=[2708], test_mask=[2708])
    """
    key = name.lower()
    if key not in BUNDLED:
        raise ValueError(
            f"unknown bundled dataset {name!r}; bundled: {sorted(BUNDLED)}. "
            "For another graph pass a torch_geometric Data or a path to a file written with torch.save(data, path)."
        )
    with resources.files("lightning_halo.datasets").joinpath(BUNDLED[key]).open("rb") as f:
        arrays = dict(np.load(f, allow_pickle=False))  # pickle-free by construction
    n, f_dim = int(arrays["num_nodes"]), int(arrays["num_features"])
    x = torch.zeros(n, f_dim)
    x[torch.from_numpy(arrays["x_row"]).long(), torch.from_numpy(arrays["x_col"]).long()] = 1.0
    return Data(
        x=x,
        edge_index=torch.from_numpy(arrays["edge_index"]).long(),
        y=torch.from_numpy(arrays["y"]).long(),
        train_mask=torch.from_numpy(arrays["train_mask"]),
        val_mask=torch.from_numpy(arrays["val_mask"]),
        test_mask=torch.from_numpy(arrays["test_mask"]),
    )
