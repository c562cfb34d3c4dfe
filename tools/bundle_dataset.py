"""Convert a Planetoid dataset from ../shared/datasets into the compact file shipped in the package.

The shipped file is a pickle-free ``.npz`` (loaded with ``allow_pickle=False``), holding the
graph exactly as ``torch_geometric.datasets.Planetoid(root, name)`` builds it: sparse binary
features as (row, col) pairs, the directed edge list, labels and the public split masks.

    python tools/bundle_dataset.py --root ../shared/datasets --name Cora --out lightning_halo/datasets/cora.npz
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="../shared/datasets")
    parser.add_argument("--name", default="Cora")
    parser.add_argument("--out", default="lightning_halo/datasets/cora.npz")
    args = parser.parse_args()

    from torch_geometric.datasets import Planetoid

    with tempfile.TemporaryDirectory() as tmp:  # Planetoid writes processed/ next to raw/
        shutil.copytree(Path(args.root) / args.name, Path(tmp) / args.name)
        data = Planetoid(tmp, args.name)[0]
    x = data.x
    if not torch.all((x == 0) | (x == 1)):
        raise SystemExit("features are not binary; this converter stores binary features only")
    row, col = torch.nonzero(x, as_tuple=True)
    np.savez_compressed(
        args.out,
        num_nodes=np.int64(data.num_nodes),
        num_features=np.int64(x.size(1)),
        x_row=row.to(torch.int32).numpy(),
        x_col=col.to(torch.int32).numpy(),
        edge_index=data.edge_index.to(torch.int32).numpy(),
        y=data.y.to(torch.int8).numpy(),
        train_mask=data.train_mask.numpy(),
        val_mask=data.val_mask.numpy(),
        test_mask=data.test_mask.numpy(),
    )
    digest = hashlib.sha256(Path(args.out).read_bytes()).hexdigest()
    print(f"wrote {args.out}: {data}  sha256={digest}")


if __name__ == "__main__":
    main()
