"""Train a heterogeneous GNN on DBLP (authors, papers, terms, conferences) with 2 CPU processes and the halo strategy.

    python examples/hetero_dblp.py --devices 2 --bits 1 --epochs 100 --conv sage
    python examples/hetero_dblp.py --conv hgt --norm layer     # HGT with a LayerNorm per type (steadier)
    python examples/hetero_dblp.py --data PATH/heco/dblp        # HeCo's DBLP (or acm) folder
    python examples/hetero_dblp.py --data graph.pt              # a torch.save'd HeteroData, or a graph directory

Without ``--data`` it reads HeCo's DBLP from the shared datasets (``$LIGHTNING_HALO_DATASETS``
or ``../shared/datasets`` beside the checkout) and, where there are none, a generated graph shaped
like OGB-MAG (:func:`lightning_halo.datasets.synthetic.mag_like_graph`), so it runs from a fresh
clone. Prints per epoch the loss, validation accuracy and halo traffic; at the end the test accuracy.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path
from typing import Any, Optional

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities.warnings import PossibleUserWarning

from lightning_halo import EpochPrinter, HaloDataModule, HaloQuantStrategy
from lightning_halo.models import HeteroNodeClassifier

#: HeCo's folders (Wang et al., KDD 2021, github.com/liun-online/HeCo): the labelled type, the node types with
#: their feature files (None: no features, the count instead) and the edge files (source, target).
HECO = {
    "dblp": ("author", {"author": "a_feat.npz", "paper": "p_feat.npz", "term": "t_feat.npz", "conference": 20},
             {"pa": ("paper", "author"), "pc": ("paper", "conference"), "pt": ("paper", "term")}),
    "acm": ("paper", {"paper": "p_feat.npz", "author": "a_feat.npz", "subject": 60},
            {"pa": ("paper", "author"), "ps": ("paper", "subject")}),
}  # fmt: skip


def heco_graph(folder: str | os.PathLike, split: int = 20) -> Any:
    """HeCo's DBLP or ACM folder as a HeteroData, with a reverse edge type for each relation (``rev_to``)."""
    import scipy.sparse as sp
    from torch_geometric.data import HeteroData

    folder = Path(folder)
    target, nodes, edges = HECO[folder.name]
    data = HeteroData()
    for node_type, source in nodes.items():
        if isinstance(source, int):
            data[node_type].num_nodes = source
            continue
        try:
            features = sp.load_npz(folder / source).toarray()
        except (TypeError, ValueError):  # DBLP's term features: a dense array saved with np.save
            features = np.load(folder / source)
        data[node_type].x = torch.from_numpy(np.asarray(features, dtype=np.float32))
    labels = torch.from_numpy(np.load(folder / "labels.npy")).long()  # ACM stores them as float
    data[target].y = labels
    for name in ("train", "val", "test"):
        mask = torch.zeros(labels.numel(), dtype=torch.bool)
        mask[torch.from_numpy(np.load(folder / f"{name}_{split}.npy")).long()] = True
        data[target][f"{name}_mask"] = mask
    for file, (src, dst) in edges.items():
        ei = torch.from_numpy(np.loadtxt(folder / f"{file}.txt", dtype=np.int64).T.copy())
        data[src, "to", dst].edge_index = ei
        data[dst, "rev_to", src].edge_index = ei.flip(0)
    return data


def shared_dblp() -> Optional[Path]:
    """HeCo's DBLP in the shared datasets, if this machine has them."""
    root = os.environ.get("LIGHTNING_HALO_DATASETS") or str(Path(__file__).resolve().parents[2] / "shared" / "datasets")
    folder = Path(root) / "heco" / "dblp"
    return folder if folder.is_dir() else None


def load(data: Optional[str]) -> Any:
    """What ``--data`` names: a HeCo folder becomes a HeteroData; a file or graph directory goes to HaloDataModule as is."""
    if data is not None and Path(data).name in HECO and (Path(data) / "labels.npy").is_file():
        return heco_graph(data)
    if data is not None:
        return data
    found = shared_dblp()
    if found is not None:
        return heco_graph(found)
    from lightning_halo.datasets.synthetic import mag_like_graph

    print("no DBLP here (pass --data PATH/heco/dblp): training a generated graph shaped like OGB-MAG")
    return mag_like_graph(3000, seed=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="HeCo's dblp/acm folder, a torch.save'd HeteroData or a graph directory")
    parser.add_argument("--devices", type=int, default=2, help="processes per node")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--bits", type=int, default=1, choices=[1, 2, 4, 8, 32])
    parser.add_argument("--conv", default="sage", choices=["sage", "gat", "hgt", "han"])
    parser.add_argument("--norm", default=None, choices=["layer", "batch"],
                        help="a normalisation per node type after each layer (layer: HGT's own recipe, steadier)")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=PossibleUserWarning)
    L.seed_everything(args.seed, verbose=False)
    dm = HaloDataModule(load(args.data))
    model = HeteroNodeClassifier(dm.num_classes, dm.metadata, dm.num_features, dm.num_nodes, dm.labelled_type,
                                 hidden_channels=args.hidden, conv=args.conv, norm=args.norm)  # fmt: skip
    strategy = HaloQuantStrategy(bits=args.bits, find_unused_parameters=args.conv in ("hgt", "han"))
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=args.devices, max_epochs=args.epochs,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[EpochPrinter()])  # fmt: skip
    trainer.fit(model, datamodule=dm)
    result = trainer.test(model, datamodule=dm, verbose=False)[0]
    if trainer.global_rank == 0:
        print(f"test accuracy of the {dm.labelled_type} nodes: {result['test_acc']:.4f}")


if __name__ == "__main__":
    main()
