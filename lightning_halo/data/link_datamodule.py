"""HaloLinkDataModule: a seeded link split, the message-passing graph partitioned, each rank its own pairs."""

from __future__ import annotations

import os
from functools import partial
from typing import Any, Callable, Literal, Optional, Union

import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset
from torch_geometric.data import Data
from typing_extensions import override

from lightning_halo.data.datamodule import HaloDataModule
from lightning_halo.data.partition_dir import is_partition_dir
from lightning_halo.data.sources import InMemorySource, load_graph
from lightning_halo.data.validation import validate_graph
from lightning_halo.link.negatives import NegativeSampler
from lightning_halo.link.ownership import owned_mask, owned_pairs
from lightning_halo.link.split import LinkSplit, link_split
from lightning_halo.partition.halo_partition import HaloPartition
from lightning_halo.partition.options import Balance, Partitioner

Stage = Literal["train", "val", "test"]

#: Node-level attributes the message-passing graph keeps (edge attributes are not split along).
_NODE_KEYS = ("x", "y", "train_mask", "val_mask", "test_mask")


def message_passing_graph(graph: Data, edge_index: Tensor) -> Data:
    """The graph the encoder runs on: ``graph``'s node features with the split's message-passing edges.

    A graph without labels or masks gets placeholders (``y = 0``, every node a train node),
    which link prediction never reads but partitioning expects.
    """
    n = graph.num_nodes
    out = Data(edge_index=edge_index, num_nodes=n)
    for key in _NODE_KEYS:
        if key in graph:
            out[key] = graph[key]
    if "y" not in out:
        out.y = torch.zeros(n, dtype=torch.long)
    for key, fill in (("train_mask", True), ("val_mask", False), ("test_mask", False)):
        if key not in out:
            out[key] = torch.full((n,), fill, dtype=torch.bool)
    return out


def _as_is(batch: Any) -> Any:
    return batch


class _StageGraph(InMemorySource):
    """A stage's message-passing graph, built by ``build()`` at its first use (not when the data module is made)."""

    def __init__(self, build: Callable[[], Data]) -> None:
        super().__init__(Data())
        self._build: Optional[Callable[[], Data]] = build

    def graph(self) -> Data:
        if self._build is not None:
            self._data, self._build = self._build(), None
        return super().graph()

    open = graph


class _StageBatches(IterableDataset):
    """Yields the rank's batch of one stage once per epoch (built when the epoch starts)."""

    def __init__(self, dm: HaloLinkDataModule, stage: Stage) -> None:
        self.dm, self.stage = dm, stage

    def __iter__(self):  # type: ignore[override]
        yield self.dm.batch(self.stage)

    def __len__(self) -> int:
        return 1


class HaloLinkDataModule(HaloDataModule):
    r"""Full-graph link prediction on partitions: split, partition, and each rank's supervision pairs.

    The graph's edges are split with :func:`~lightning_halo.link.link_split`
    (:class:`~torch_geometric.transforms.RandomLinkSplit`'s semantics and positives for the same
    seed; for an undirected graph a held-out edge leaves the message-passing graph in both
    directions). The message-passing graph of training and validation (the training edges) is
    partitioned and cached as :class:`HaloDataModule` does; so is, for test and predict, that of
    the test stage (training and validation edges, as ``RandomLinkSplit``'s ``test_data``), unless
    ``test_with_val_edges=False``. Each rank's batch is its :class:`HaloPartition` plus the pairs
    it scores, in *global* node ids: ``batch.edge_label_index`` ``[2, M_r]`` and
    ``batch.edge_label`` ``[M_r]`` (1 positive, 0 negative). Every stage (and every epoch) gets a
    batch object of its own (:meth:`HaloPartition.with_attrs`: the partition's tensors shared, not
    copied), so a callback holding the training batch keeps the training pairs. A pair belongs to the owner of its
    source node, so every pair is scored exactly once; its other endpoint may be anywhere
    (fetch the rows with :func:`~lightning_halo.gather_rows`).

    * training: this rank's training positives and, new every epoch, its share of
      ``neg_ratio`` negatives per positive drawn from the whole graph by
      :class:`~lightning_halo.link.NegativeSampler` (avoiding the message-passing edges,
      seeded by them, ``seed`` and the epoch): a single-process loop calling
      ``lightning_halo.link.negative_sampling(dm.split.edge_index, N, dm.num_train_negatives,
      seed=seed, epoch=e)`` draws the same negatives (:meth:`negatives`);
    * validation / test: the held-out positives and fixed negatives (``neg_ratio`` per positive,
      non-edges of the whole graph).

    Nothing is read or split when the data module is made: every rank loads the whole graph and
    splits it (seeded, so identically on all ranks) at its first use, in ``prepare_data`` /
    ``setup`` or at the first read of :attr:`split` or ``num_features``. Partition directories are
    not supported. Edge attributes are not carried into the message-passing graph.

    Args:
        data (Data or str): the graph, as for :class:`HaloDataModule` (not a partition
            directory). A :class:`~torch_geometric.data.Data` needs only ``x`` and
            ``edge_index``; a file or other source is read by
            :func:`~lightning_halo.load_graph`, which expects labels and masks too.
            (default: ``"cora"``)
        num_val (int or float, optional): validation edges (fraction or count). (default: ``0.1``)
        num_test (int or float, optional): test edges (fraction or count). (default: ``0.1``)
        neg_ratio (float, optional): negatives per positive, in every stage. (default: ``1.0``)
        undirected (bool, optional): split as undirected; ``None`` detects it. (default: ``None``)
        seed (int, optional): seed of the split, the negatives and the partitioner. (default: ``0``)
        num_parts (int, optional): as for :class:`HaloDataModule`.
        partitioner (str, optional): as for :class:`HaloDataModule`. (default: ``"metis"``)
        balance (str, optional): as for :class:`HaloDataModule`. (default: ``"nodes"``)
        cache_dir (str, optional): as for :class:`HaloDataModule`.
        test_with_val_edges (bool, optional): the test stage passes messages over the training
            and validation edges (``RandomLinkSplit``'s semantics; a second partitioning). With
            ``False`` every stage uses the training edges and one partitioning. (default: ``True``)

    Example:
        >>> dm = HaloLinkDataModule("cora", num_val=0.05, num_test=0.1)
        >>> dm.split.val_pos.size(1), dm.num_features
        (263, 1433)
        >>> trainer = L.Trainer(strategy=HaloQuantStrategy(bits=32, scale_loss="share"), devices=2)  # doctest: +SKIP
        >>> trainer.fit(LinkPredictor(dm.num_features), datamodule=dm)  # doctest: +SKIP
    """

    def __init__(
        self,
        data: Union[str, Data] = "cora",
        num_val: Union[int, float] = 0.1,
        num_test: Union[int, float] = 0.1,
        neg_ratio: float = 1.0,
        undirected: Optional[bool] = None,
        seed: int = 0,
        num_parts: Optional[int] = None,
        partitioner: Partitioner = "metis",
        balance: Balance = "nodes",
        cache_dir: Optional[str] = None,
        test_with_val_edges: bool = True,
    ) -> None:
        if isinstance(data, (str, os.PathLike)) and is_partition_dir(data):
            raise ValueError(
                f"{data} is a partition directory; a link split needs the whole graph. Pass the original graph "
                "(a Data, a file, 'cora', 'pyg:...') to HaloLinkDataModule."
            )
        if not isinstance(data, (Data, str, os.PathLike)):
            load_graph(data)  # raises the explanation
        super().__init__(
            data=_StageGraph(partial(self._stage_graph, "train")),  # a bound method: the data module pickles
            num_parts=num_parts, partitioner=partitioner, balance=balance, seed=seed, cache_dir=cache_dir,
        )  # fmt: skip
        self.neg_ratio = float(neg_ratio)
        self.test_with_val_edges = test_with_val_edges
        self._given: Optional[Union[str, os.PathLike, Data]] = data
        self._split_options = dict(
            num_val=num_val, num_test=num_test, neg_ratio=neg_ratio, seed=seed, undirected=undirected
        )
        self._nodes: Optional[Data] = None  # the graph's node attributes (no edges), once split
        self._split: Optional[LinkSplit] = None
        self._sampler: Optional[NegativeSampler] = None
        self._test_data: Optional[HaloDataModule] = None
        self._owned: dict[str, Tensor] = {}

    # ------------------------------------------------------------------ built at first use
    def _built(self) -> tuple[LinkSplit, Data]:
        """The split and the graph's node attributes (no edges): the graph read, checked and split at the first call."""
        if self._split is not None and self._nodes is not None:
            return self._split, self._nodes
        given = self._given
        raw = given if isinstance(given, Data) else load_graph(str(given))
        # placeholders first (a link graph needs no labels), then the usual checks (int64 edges, ids in range)
        graph = validate_graph(message_passing_graph(raw, raw.edge_index), source="the link-prediction graph")
        split = link_split(graph.edge_index, int(graph.num_nodes), **self._split_options)
        nodes = message_passing_graph(graph, graph.edge_index[:, :0])  # the stages' graphs add their edges
        self._split, self._nodes, self._given = split, nodes, None
        return split, nodes

    def _stage_graph(self, stage: Stage) -> Data:
        """The graph ``stage`` passes messages on: training's edges, or for ``"test"`` training's and validation's."""
        split, nodes = self._built()
        return message_passing_graph(nodes, split.test_edge_index if stage == "test" else split.edge_index)

    @property
    def split(self) -> LinkSplit:
        """The split, in global ids (the same on every rank), made at first use."""
        return self._built()[0]

    @property
    def sampler(self) -> NegativeSampler:
        """Draws each epoch's training negatives from the whole graph (built at first use)."""
        if self._sampler is None:
            split, nodes = self._built()
            self._sampler = NegativeSampler(split.edge_index, int(nodes.num_nodes), self.seed)
        return self._sampler

    @property
    def test_data(self) -> Optional[HaloDataModule]:
        """The test stage's partitioning (training + validation edges), if it differs from training's."""
        if self._test_data is None and self.test_with_val_edges and self.split.val_pos.size(1):
            self._test_data = HaloDataModule(
                data=_StageGraph(partial(self._stage_graph, "test")),
                num_parts=self.num_parts, partitioner=self.partitioner, balance=self.balance, seed=self.seed,
                cache_dir=str(self.cache_dir),
            )  # fmt: skip
        return self._test_data

    @property
    def num_train_negatives(self) -> int:
        """Training negatives per epoch over all ranks: ``int(neg_ratio * E_train)``."""
        return int(self.neg_ratio * self.split.train_pos.size(1))

    def negatives(self, epoch: int) -> Tensor:
        """The training negatives of ``epoch`` over all ranks, ``[2, k]`` (what a single-process run draws)."""
        return self.sampler.sample(self.num_train_negatives, epoch)

    @override
    def prepare_data(self) -> None:
        super().prepare_data()
        if self.test_data is not None:
            self.test_data.trainer = self.trainer
            self.test_data.prepare_data()

    @override
    def setup(self, stage: str) -> None:
        super().setup(stage)  # the split and the training partition
        assert self.partition is not None
        if stage == "fit":
            _ = self.sampler  # built here, before the first step needs it
        self._owned = {"train": owned_mask(self.num_nodes, self.partition.n_id)}
        if self.test_data is not None and stage in ("test", "predict"):
            self.test_data.trainer = self.trainer
            self.test_data.setup(stage)
            assert self.test_data.partition is not None
            self._owned["test"] = owned_mask(self.num_nodes, self.test_data.partition.n_id)

    def _epoch(self) -> int:
        return int(self.trainer.current_epoch) if self.trainer is not None else 0

    def _partition_of(self, stage: Stage) -> tuple[HaloPartition, Tensor]:
        """The partition ``stage`` passes messages on, and the mask of the nodes this rank owns in it."""
        if not self._owned:
            raise RuntimeError("HaloLinkDataModule.setup() has not run; let the Trainer call it.")
        if stage == "test" and self.test_data is not None:
            if "test" not in self._owned:
                raise RuntimeError("the test partition is not loaded: run trainer.test / trainer.predict with this data module.")
            assert self.test_data.partition is not None
            return self.test_data.partition, self._owned["test"]
        assert self.partition is not None
        return self.partition, self._owned["train"]

    def pairs(self, stage: Stage, epoch: int = 0) -> tuple[Tensor, Tensor]:
        """This rank's ``(edge_label_index, edge_label)`` of ``stage`` (training: of ``epoch``), on the CPU."""
        _, owned = self._partition_of(stage)
        if stage == "train":
            pos, neg = self.split.train_pos, self.negatives(epoch)
            index = torch.cat([pos, neg], 1)
            label = torch.cat([torch.ones(pos.size(1)), torch.zeros(neg.size(1))])
        else:
            index, label = self.split.labelled(stage)
        index, label = owned_pairs(index, owned, label)
        return index, label

    def batch(self, stage: Stage) -> HaloPartition:
        """The rank's batch of ``stage``: a new object of the stage's partition carrying its pairs (tensors shared)."""
        part, _ = self._partition_of(stage)
        index, label = self.pairs(stage, self._epoch())
        device = part.n_id.device
        return part.with_attrs(edge_label_index=index.to(device), edge_label=label.to(device))

    def _stage_loader(self, stage: Stage) -> DataLoader:
        self._loader()  # the checks and warning filters of HaloDataModule
        return DataLoader(_StageBatches(self, stage), batch_size=None, collate_fn=_as_is, num_workers=0)

    @override
    def train_dataloader(self) -> DataLoader:
        return self._stage_loader("train")

    @override
    def val_dataloader(self) -> DataLoader:
        return self._stage_loader("val")

    @override
    def test_dataloader(self) -> DataLoader:
        return self._stage_loader("test")

    @override
    def predict_dataloader(self) -> DataLoader:
        return self._stage_loader("test")
