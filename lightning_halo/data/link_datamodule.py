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
from lightning_halo.data.hetero import HeteroSource, open_hetero
from lightning_halo.data.partition_dir import is_partition_dir
from lightning_halo.data.sources import InMemorySource, load_graph
from lightning_halo.data.validation import is_hetero, validate_graph
from lightning_halo.link.negatives import NegativeSampler
from lightning_halo.link.ownership import owned_mask, owned_pairs
from lightning_halo.link.split import LinkSplit, link_split
from lightning_halo.partition.halo_partition import HaloPartition
from lightning_halo.partition.hetero import HeteroGraphError, HeteroHaloPartition, hetero_layout
from lightning_halo.partition.options import Balance, Partitioner

Stage = Literal["train", "val", "test"]
EdgeType = tuple[str, str, str]

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


def check_link_types(data: Any, edge_type: Any, rev_edge_type: Any) -> tuple[EdgeType, Optional[EdgeType]]:
    """The edge type to predict and its reverse (``None``: none, or the type is its own reverse), checked against a
    :class:`~torch_geometric.data.HeteroData`'s types.

    Raises:
        ValueError: a type the graph lacks, or a reverse that does not run the other way.
    """
    edge_types = [tuple(e) for e in data.edge_types]
    kinds = f"its edge types: {edge_types}"
    if not isinstance(edge_type, (tuple, list)) or len(edge_type) != 3 or tuple(edge_type) not in edge_types:
        raise ValueError(f"edge_type={edge_type!r} is not an edge type of the graph ({kinds}); pass one of them, "
                         "e.g. edge_type=('author', 'writes', 'paper')")  # fmt: skip
    edge_type = tuple(edge_type)
    if rev_edge_type is None:
        return edge_type, None  # type: ignore[return-value]
    if not isinstance(rev_edge_type, (tuple, list)) or tuple(rev_edge_type) not in edge_types:
        raise ValueError(f"rev_edge_type={rev_edge_type!r} is not an edge type of the graph ({kinds}); pass the "
                         "edge type that holds edge_type's edges reversed (e.g. one T.ToUndirected() added), or None")  # fmt: skip
    rev_edge_type = tuple(rev_edge_type)
    if (rev_edge_type[0], rev_edge_type[2]) != (edge_type[2], edge_type[0]):
        raise ValueError(f"rev_edge_type={rev_edge_type!r} does not run from {edge_type[2]!r} to {edge_type[0]!r}, the "
                         f"reverse of edge_type={edge_type!r}; pass the edge type holding its edges reversed")  # fmt: skip
    return edge_type, (None if rev_edge_type == edge_type else rev_edge_type)  # type: ignore[return-value]


def hetero_link_nodes(data: Any, edge_type: EdgeType) -> Any:
    """A copy of ``data`` (tensors shared) for link prediction on ``edge_type``: if no node type has labels, the
    source type gets placeholders (``y = 0``, every node a train node), which partitioning expects."""
    import copy

    out = copy.copy(data)
    if not any("y" in out[t] for t in out.node_types):
        src = out[edge_type[0]]
        n = int(src.num_nodes)
        src.y = torch.zeros(n, dtype=torch.long)
        for key, fill in (("train_mask", True), ("val_mask", False), ("test_mask", False)):
            src[key] = torch.full((n,), fill, dtype=torch.bool)
    return out


def hetero_stage_graph(nodes: Any, edge_type: EdgeType, rev_edge_type: Optional[EdgeType], edge_index: Tensor) -> Any:
    """``nodes``' graph with ``edge_type``'s edges replaced by ``edge_index`` and ``rev_edge_type``'s by their reverse
    (``RandomLinkSplit``'s ``rev_edge_types``); the other edge types as they are, tensors shared. The two split
    types keep no edge attribute (as the homogeneous message-passing graph)."""
    from torch_geometric.data import HeteroData

    out = HeteroData()
    for key, value in nodes.stores[0].items():
        out[key] = value
    for t in nodes.node_types:
        for key, value in nodes[t].items():
            out[t][key] = value
    for e in nodes.edge_types:
        if e == edge_type:
            out[e].edge_index = edge_index
        elif e == rev_edge_type:
            out[e].edge_index = edge_index.flip(0)
        else:
            for key, value in nodes[e].items():
                out[e][key] = value
    return out


class _HeteroStageGraph(HeteroSource):
    """A stage's heterogeneous message-passing graph, built by ``build()`` at its first use."""

    def __init__(self, build: Callable[[], Any]) -> None:
        super().__init__(None, description="the link-prediction graph")
        self._build: Optional[Callable[[], Any]] = build

    @override
    def facts(self) -> dict[str, Any]:
        if self._build is not None:
            self._data, self._build = self._build(), None
        return super().facts()

    @override
    def graph(self) -> Any:
        self.facts()
        return super().graph()

    open = graph


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

    **Heterogeneous graphs.** With ``edge_type`` (a
    :class:`~torch_geometric.data.HeteroData`, its file or graph directory, or a ``pyg:`` class)
    the pairs are those of one edge type, as ``RandomLinkSplit(edge_types=edge_type,
    rev_edge_types=rev_edge_type)`` makes them: the edge type's edges are split (the same
    positives for the same seed); its message-passing edges are the training edges and, if
    ``rev_edge_type`` is given, that type is rebuilt as their reverse, so no held-out edge reaches
    the encoder either way. Every other edge type stays. Pairs are ``(source-type id,
    target-type id)`` and sit where ``RandomLinkSplit`` puts them,
    ``batch[edge_type].edge_label_index`` and ``batch[edge_type].edge_label``; negatives are
    drawn from every source-target pair of the two types (PyG's bipartite ``negative_sampling``;
    within one type, without self-loops). A pair belongs to the owner of its source node; fetch
    rows with ``gather_rows(z_dict[src], ids, node_type=src)``. A graph without labels gets
    placeholders on the source type.

    Nothing is read or split when the data module is made: every rank loads the whole graph and
    splits it (seeded, so identically on all ranks) at its first use, in ``prepare_data`` /
    ``setup`` or at the first read of :attr:`split` or ``num_features``. Partition directories are
    not supported. Edge attributes are not carried into the message-passing graph.

    Args:
        data (Data, HeteroData or str): the graph, as for :class:`HaloDataModule` (not a
            partition directory). A :class:`~torch_geometric.data.Data` needs only ``x`` and
            ``edge_index``; a file or other source is read by
            :func:`~lightning_halo.load_graph`, which expects labels and masks too. A
            heterogeneous graph needs ``edge_type``. (default: ``"cora"``)
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
        edge_type (tuple, optional): for a heterogeneous graph, the edge type whose links are
            predicted, e.g. ``("author", "writes", "paper")``. (default: ``None``)
        rev_edge_type (tuple, optional): the edge type holding ``edge_type``'s edges reversed
            (e.g. added by ``T.ToUndirected()``): rebuilt from the split in every stage.
            Without it a reverse type keeps every edge, held-out ones too. (default: ``None``)

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
        edge_type: Optional[EdgeType] = None,
        rev_edge_type: Optional[EdgeType] = None,
    ) -> None:
        if edge_type is None and rev_edge_type is not None:
            raise ValueError(f"rev_edge_type={rev_edge_type!r} without edge_type: pass the edge type to predict as well")
        if isinstance(data, Data) and edge_type is not None:
            raise ValueError(f"edge_type={edge_type!r} is for heterogeneous graphs (a HeteroData); this graph is a "
                             "Data with one edge set: leave edge_type unset")  # fmt: skip
        if is_hetero(data):
            if edge_type is None:
                raise ValueError("a heterogeneous graph needs the edge type whose links to predict: pass "
                                 f"edge_type= one of {[tuple(e) for e in data.edge_types]}")  # type: ignore[union-attr]  # fmt: skip
            check_link_types(data, edge_type, rev_edge_type)
        if isinstance(data, (str, os.PathLike)) and is_partition_dir(data):
            raise ValueError(
                f"{data} is a partition directory; a link split needs the whole graph. Pass the original graph "
                "(a Data, a file, 'cora', 'pyg:...') to HaloLinkDataModule."
            )
        if not isinstance(data, (Data, str, os.PathLike)) and not is_hetero(data):
            load_graph(data)  # raises the explanation
        self.edge_type: Optional[EdgeType] = None if edge_type is None else tuple(edge_type)  # type: ignore[assignment]
        self.rev_edge_type: Optional[EdgeType] = None if rev_edge_type is None else tuple(rev_edge_type)  # type: ignore[assignment]
        super().__init__(
            data=self._stage_source("train"),
            num_parts=num_parts, partitioner=partitioner, balance=balance, seed=seed, cache_dir=cache_dir,
        )  # fmt: skip
        self.neg_ratio = float(neg_ratio)
        self.test_with_val_edges = test_with_val_edges
        self._given: Optional[Any] = data
        self._split_options = dict(
            num_val=num_val, num_test=num_test, neg_ratio=neg_ratio, seed=seed, undirected=undirected
        )
        self._nodes: Optional[Any] = None  # the graph's node attributes (no edges; hetero: the graph), once split
        self._split: Optional[LinkSplit] = None
        self._sizes: Optional[Union[int, tuple[int, int]]] = None  # hetero: the node counts pairs are drawn from
        self._sampler: Optional[NegativeSampler] = None
        self._test_data: Optional[HaloDataModule] = None
        self._owned: dict[str, Tensor] = {}

    # ------------------------------------------------------------------ built at first use
    def _stage_source(self, stage: Stage) -> Union[_StageGraph, _HeteroStageGraph]:
        build = partial(self._stage_graph, stage)  # a bound method: the data module pickles
        return _StageGraph(build) if self.edge_type is None else _HeteroStageGraph(build)

    def _built(self) -> tuple[LinkSplit, Any]:
        """The split and the graph's node attributes (no edges): the graph read, checked and split at the first call."""
        if self._split is not None and self._nodes is not None:
            return self._split, self._nodes
        if self.edge_type is not None:
            return self._built_hetero(self.edge_type)
        given = self._given
        if is_hetero(given) or open_hetero(given) is not None:
            raise ValueError(f"{given!r} is a heterogeneous graph: pass HaloLinkDataModule(edge_type=...), the edge "
                             "type whose links to predict")  # fmt: skip
        raw = given if isinstance(given, Data) else load_graph(str(given))
        # placeholders first (a link graph needs no labels), then the usual checks (int64 edges, ids in range)
        graph = validate_graph(message_passing_graph(raw, raw.edge_index), source="the link-prediction graph")
        split = link_split(graph.edge_index, int(graph.num_nodes), **self._split_options)
        nodes = message_passing_graph(graph, graph.edge_index[:, :0])  # the stages' graphs add their edges
        self._split, self._nodes, self._given = split, nodes, None
        return split, nodes

    def _built_hetero(self, edge_type: EdgeType) -> tuple[LinkSplit, Any]:
        given = self._given
        raw = given if is_hetero(given) else open_hetero(given)
        if raw is None:
            raise ValueError(f"edge_type={edge_type!r} is for heterogeneous graphs, but {given!r} is not one (a "
                             "HeteroData, its torch.save file, a heterogeneous graph directory or a pyg: class); "
                             "leave edge_type unset for a Data")  # fmt: skip
        edge_type, rev = check_link_types(raw, edge_type, self.rev_edge_type)
        nodes = hetero_link_nodes(raw, edge_type)
        try:
            layout = hetero_layout(nodes)  # types, counts and id ranges, each error naming its type
        except HeteroGraphError as err:
            raise HeteroGraphError(f"the link-prediction graph: {err}") from err
        src, _, dst = edge_type
        undirected = self._split_options["undirected"]
        if rev is not None and src == dst:
            if undirected:
                raise ValueError(f"undirected=True, but rev_edge_type={rev!r} holds the reverse of {edge_type!r}: "
                                 "pass undirected=None (split as directed, the reverse rebuilt from the split)")  # fmt: skip
            undirected = False
        options = {**self._split_options, "undirected": undirected}
        self._sizes = self._pair_size(layout.num_nodes)
        split = link_split(nodes[edge_type].edge_index, self._sizes, **options)  # type: ignore[arg-type]
        self._split, self._nodes, self._given = split, nodes, None
        return split, nodes

    def _pair_size(self, num_nodes: dict[str, int]) -> Union[int, tuple[int, int]]:
        """The node count pairs are drawn from: one type's, or ``(N_src, N_dst)`` for two types (bipartite)."""
        assert self.edge_type is not None
        src, _, dst = self.edge_type
        return num_nodes[src] if src == dst else (num_nodes[src], num_nodes[dst])

    def _stage_graph(self, stage: Stage) -> Any:
        """The graph ``stage`` passes messages on: training's edges, or for ``"test"`` training's and validation's."""
        split, nodes = self._built()
        edges = split.test_edge_index if stage == "test" else split.edge_index
        if self.edge_type is not None:
            rev = None if self.rev_edge_type == self.edge_type else self.rev_edge_type
            return hetero_stage_graph(nodes, self.edge_type, rev, edges)
        return message_passing_graph(nodes, edges)

    @property
    def split(self) -> LinkSplit:
        """The split, in global ids (the same on every rank), made at first use."""
        return self._built()[0]

    @property
    def sampler(self) -> NegativeSampler:
        """Draws each epoch's training negatives from the whole graph (built at first use)."""
        if self._sampler is None:
            split, nodes = self._built()
            size = int(nodes.num_nodes) if self._sizes is None else self._sizes
            self._sampler = NegativeSampler(split.edge_index, size, self.seed)
        return self._sampler

    @property
    def test_data(self) -> Optional[HaloDataModule]:
        """The test stage's partitioning (training + validation edges), if it differs from training's."""
        if self._test_data is None and self.test_with_val_edges and self.split.val_pos.size(1):
            self._test_data = HaloDataModule(
                data=self._stage_source("test"),
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
        self._owned = {"train": self._owned_mask(self.partition)}
        if self.test_data is not None and stage in ("test", "predict"):
            self.test_data.trainer = self.trainer
            self.test_data.setup(stage)
            assert self.test_data.partition is not None
            self._owned["test"] = self._owned_mask(self.test_data.partition)

    def _owned_mask(self, part: Any) -> Tensor:
        """The nodes (of the pairs' source type) ``part``'s rank owns: its pairs are those with their source there."""
        if isinstance(part, HeteroHaloPartition):
            assert self.edge_type is not None
            store = part[self.edge_type[0]]
            return owned_mask(int(store.num_nodes_global), store.n_id[: int(store.n_inner)])
        return owned_mask(self.num_nodes, part.n_id)

    def _epoch(self) -> int:
        return int(self.trainer.current_epoch) if self.trainer is not None else 0

    def _partition_of(self, stage: Stage) -> tuple[Any, Tensor]:
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

    def batch(self, stage: Stage) -> Union[HaloPartition, HeteroHaloPartition]:
        """The rank's batch of ``stage``: a new object of the stage's partition carrying its pairs (tensors shared);
        on a heterogeneous graph the pairs sit on the edge type's store (``batch[edge_type].edge_label_index``)."""
        part, _ = self._partition_of(stage)
        index, label = self.pairs(stage, self._epoch())
        if isinstance(part, HeteroHaloPartition):
            device = part[self.edge_type[0]].n_id.device  # type: ignore[index]
            return part.with_attrs(self.edge_type, edge_label_index=index.to(device), edge_label=label.to(device))
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
