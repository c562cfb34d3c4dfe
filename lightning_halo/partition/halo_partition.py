"""The per-rank batch: one partition with its halo and its exchange plan."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from lightning_halo.partition.chunks import CHUNK_BYTES, release_pages, windows
from lightning_halo.partition.csr import CSR_KEYS

#: Keys that describe the partition itself rather than the user's graph.
PLAN_KEYS = (
    "global_id",
    "send_index",
    "send_counts",
    "recv_counts",
    "part_id",
    "num_parts",
    "n_inner",
    "n_halo",
    "num_train_global",
    "num_nodes_global",
    "halo_x",
    "x_digest",
    *CSR_KEYS,
)

#: Attributes a partition derives from stored ones (its properties, computed on access and never
#: stored), each with the stored attributes it is computed from. ``in``, ``keys()``, ``hasattr``,
#: ``get`` and ``[]`` see one when its sources are there, as they see a stored attribute.
DERIVED_FROM: dict[str, tuple[str, ...]] = {
    "n_id": ("global_id", "n_inner"),
    "inner_global_id": ("global_id", "n_inner"),
    "halo_owner": ("recv_counts",),
    "num_local_nodes": ("n_inner", "n_halo"),
}

#: Names a partition derives from :data:`PLAN_KEYS` (see :data:`DERIVED_FROM`): a graph attribute
#: of the same name would be hidden behind them.
DERIVED_KEYS = tuple(DERIVED_FROM)

#: What a partition *is* to the exchange: its edges and plan. Two batch objects holding these
#: very tensors (:meth:`HaloPartition.with_attrs`) are views of one partition.
STRUCTURE_KEYS = ("edge_index", *PLAN_KEYS)

#: Attribute names a graph must not have before partitioning: what every partition adds or derives.
RESERVED_KEYS = PLAN_KEYS + DERIVED_KEYS


def hash_header(h: Any, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """Feed what :func:`hash_tensor` hashes before the bytes (so a tensor can be hashed in pieces)."""
    h.update(f"{dtype}{tuple(shape)}".encode())


def hash_tensor(h: Any, t: Tensor) -> None:
    """Feed a tensor's dtype, shape and bytes into the hashlib object ``h`` (exact, any device).

    The bytes are hashed in place, a window at a time (a memory-mapped tensor's pages are
    released as it goes), so hashing needs no copy of the tensor.
    """
    t = t.detach().cpu().contiguous()
    hash_header(h, t.dtype, tuple(t.shape))
    if t.numel():
        flat = t.reshape(-1).view(torch.uint8)
        for start, stop in windows(flat.numel(), CHUNK_BYTES):
            piece = flat[start:stop]
            h.update(piece.numpy())
            release_pages(piece)


def tensor_digest(t: Tensor) -> str:
    """Hash of a tensor's dtype, shape and bytes (exact, independent of device and thread count).

    Example:
        >>> tensor_digest(torch.zeros(2, 3)) == tensor_digest(torch.zeros(2, 3))
        True
    """
    h = hashlib.blake2b(digest_size=16)
    hash_tensor(h, t)
    return h.hexdigest()



def stacked_view(top: Tensor, bottom: Tensor) -> Tensor | None:
    """``torch.cat([top, bottom])`` as a view, if ``bottom``'s rows follow ``top``'s in one storage; else ``None``.

    A partition's ``x`` and ``halo_x`` are such views (one tensor in the part file), so the
    first layer's input ``[x; halo_x]`` costs no copy.
    """
    if top.shape[1:] != bottom.shape[1:] or top.dtype != bottom.dtype or top.device != bottom.device:
        return None
    if not (top.is_contiguous() and bottom.is_contiguous()) or top.dim() == 0:
        return None
    if top.untyped_storage().data_ptr() != bottom.untyped_storage().data_ptr():
        return None
    if bottom.storage_offset() != top.storage_offset() + top.numel():
        return None
    return top.as_strided((top.size(0) + bottom.size(0), *top.shape[1:]), top.stride(), top.storage_offset())

def _refuse_derived(key: str) -> None:
    if key in DERIVED_FROM:
        sources = " and ".join(DERIVED_FROM[key])
        raise AttributeError(
            f"HaloPartition.{key} is derived from {sources} on every access and cannot be set (a stored value would "
            f"hide behind the derived one). Change {sources} instead, or store your value under another name."
        )


class HaloPartition(Data):
    r"""One rank's share of the graph: its *inner* nodes, their *halo* and the exchange plan.

    Local node ids put the :math:`n_{in}` inner nodes (owned by this rank, sorted by global
    id) first, then the :math:`n_{halo}` halo nodes (remote in-neighbours of inner nodes,
    grouped by owner rank, then sorted by global id). ``edge_index`` holds every in-edge of
    every inner node of the original graph, in local ids: sources in
    :math:`[0, n_{in} + n_{halo})`, targets in :math:`[0, n_{in})`. So a message-passing
    layer run on ``[x_inner; x_halo]`` computes exactly the full-graph output of the inner
    nodes (owner-compute, as in DistDGL and CAGNET).

    Node-level attributes (``x``, ``y``, masks, anything else sized by nodes) cover inner
    nodes only, so ``num_nodes == n_inner``; edge-level attributes follow ``edge_index``.

    Exchange plan (all ``int64``):

    * ``send_index`` ``[S]``: local inner ids of the rows this rank sends, peer after peer in
      rank order; peer ``q``'s slice lists the rows ``q`` needs, in ``q``'s halo order.
    * ``send_counts`` ``[P]``: rows sent to each peer (``0`` for itself).
    * ``recv_counts`` ``[P]``: halo rows received from each peer, the halo being laid out in
      the same peer order.
    * ``global_id`` ``[n_inner + n_halo]``: global id of every local node.

    ``n_id`` ``[n_inner]`` (derived from ``global_id``, not stored, but seen by ``"n_id" in batch``,
    ``batch.keys()``, ``batch.get`` and ``batch["n_id"]`` like a stored attribute; see
    :data:`DERIVED_FROM`): the global id of every row of ``x``, with the meaning of
    :class:`~torch_geometric.loader.NeighborLoader`'s ``batch.n_id``. So a per-node parameter
    looked up as ``self.emb(batch.n_id)`` reads each node's own row on every rank (on one process ``n_id`` is ``arange(N)``), and the result
    equals single-process training. A lookup by position (``emb(torch.arange(x.size(0)))``,
    ``emb.weight[:n]``) reads other nodes' rows on a partition.

    Input features of the halo (DistDGL-style, so layer 1 needs no exchange):

    * ``halo_x`` ``[n_halo, F]``: ``x`` of the halo nodes, in halo order.
    * ``x_digest``: hash of this partition's ``x`` when it was built. While ``batch.x`` still
      matches it, the first layer reads ``halo_x``; if you change ``batch.x`` after
      partitioning, the owners' rows are exchanged instead.

    ``x`` and ``halo_x`` are views of one tensor, inner rows then halo rows
    (:meth:`input_rows`), so the first layer's input needs no concatenated copy.

    The CSR adjacency of ``edge_index`` and its transpose, built once when partitioning
    (``adj_crow``, ``adj_col``, ... see :mod:`lightning_halo.partition.csr`), for the layers
    that aggregate with a fused sparse-dense product.

    Plus ``part_id``, ``num_parts``, ``n_inner``, ``n_halo``, ``num_nodes_global`` and
    ``num_train_global`` (train nodes of the whole graph, used to scale the loss).

    Args:
        **kwargs: the attributes above, as for :class:`~torch_geometric.data.Data`
            (built by :func:`~lightning_halo.build_halo_partitions`, not by hand).

    Example:
        >>> from lightning_halo import build_halo_partitions, load_graph, partition_graph
        >>> data = load_graph("cora")
        >>> part = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, 2), 2)[0]
        >>> part.x.shape[0] == part.n_inner
        True
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)

    # ------------------------------------------------------------------ derived attributes, as PyG sees attributes
    def keys(self) -> list[str]:
        """The stored attributes' names, and the derived ones (:data:`DERIVED_FROM`) whose sources are stored.

        So ``"n_id" in batch`` is ``True`` wherever ``batch.n_id`` works, as for any attribute.
        What is stored, written, collated and moved (``to_dict()``, ``items()``, ``apply``) is
        the stored attributes only.
        """
        stored = super().keys()
        have = set(stored)
        return stored + [key for key, sources in DERIVED_FROM.items() if have.issuperset(sources)]

    def __getitem__(self, key: str) -> Any:
        if key in DERIVED_FROM and key in self.keys():
            return getattr(self, key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        """``batch[key]`` if ``key in batch`` (stored or derived), else ``default``, as ``dict.get``."""
        return self[key] if key in self else default

    def __setattr__(self, key: str, value: Any) -> None:
        _refuse_derived(key)
        super().__setattr__(key, value)

    def __setitem__(self, key: str, value: Any) -> None:
        _refuse_derived(key)
        super().__setitem__(key, value)

    # ------------------------------------------------------------------ views of one partition
    def with_attrs(self, **attrs: Any) -> HaloPartition:
        """A new batch object of this partition with ``attrs`` added (or replaced): every tensor shared, none copied.

        What a data module hands each stage (its own pairs, say) so that a callback holding one
        stage's batch never sees another's. While :data:`STRUCTURE_KEYS` are untouched the
        result :meth:`shares_structure` with this one, and the exchange treats it as the same
        partition (no plan, cache or check is rebuilt).

        Args:
            **attrs: attributes of the new batch object.

        Example:
            >>> train = part.with_attrs(edge_label_index=pairs)  # doctest: +SKIP
            >>> train.x is part.x and "edge_label_index" not in part  # doctest: +SKIP
            True
        """
        out = copy.copy(self)  # PyG's shallow copy: a new store holding the same tensors
        for key, value in attrs.items():
            out[key] = value
        return out

    def shares_structure(self, other: HaloPartition) -> bool:
        """Whether ``other`` holds this partition's very edges and plan (:data:`STRUCTURE_KEYS`: the same tensor
        objects, equal numbers), e.g. another stage's view from :meth:`with_attrs`.

        Example:
            >>> part.with_attrs(edge_label=labels).shares_structure(part)  # doctest: +SKIP
            True
        """
        for key in STRUCTURE_KEYS:
            mine, theirs = self.get(key), other.get(key)
            numbers = not isinstance(mine, Tensor) and not isinstance(theirs, Tensor)
            if not (mine is theirs or (numbers and mine == theirs)):
                return False
        return True

    def __getattr__(self, key: str) -> Any:
        if key == "batch_size":  # the NeighborLoader idiom out[:batch.batch_size] has no meaning here
            raise AttributeError(
                "HaloPartition has no batch_size: it is this rank's share of the whole graph, not a NeighborLoader "
                "mini-batch of seed nodes. Every row of the model's output is an owned node; select with the masks, "
                "e.g. F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])."
            )
        return super().__getattr__(key)

    @property
    def num_local_nodes(self) -> int:
        """``n_inner + n_halo``: the row count a layer sees after the halo exchange."""
        return int(self.n_inner) + int(self.n_halo)

    @property
    def n_id(self) -> Tensor:
        """Global ids of the rows of ``x`` (``[n_inner]``), as :class:`~torch_geometric.loader.NeighborLoader`'s ``batch.n_id``.

        ``self.emb(batch.n_id)`` looks up each node's own row of an ``nn.Embedding(num_nodes, d)``.
        A view of ``global_id``, which owns the ids.
        """
        return self.global_id[: int(self.n_inner)]

    @property
    def inner_global_id(self) -> Tensor:
        """Global ids of the inner nodes, to place this rank's predictions in the full graph (the same ids as :attr:`n_id`)."""
        return self.n_id

    @property
    def halo_owner(self) -> Tensor:
        """Owner rank of every halo node (``[n_halo]``)."""
        counts = self.recv_counts.to(torch.long)
        return torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)

    def input_rows(self) -> Tensor | None:
        """``[x; halo_x]`` as one tensor without a copy, if ``x`` and ``halo_x`` are adjacent views of one storage.

        ``None`` otherwise (e.g. after ``batch.x`` was replaced).
        """
        x, halo = self.get("x"), self.get("halo_x")
        if not isinstance(x, Tensor) or not isinstance(halo, Tensor):
            return None
        return stacked_view(x, halo)

    def apply(self, func: Any, *args: str) -> HaloPartition:
        """As :meth:`Data.apply`, but ``x`` and ``halo_x`` stay views of one tensor (e.g. through ``.to("cuda")``)."""
        keys = args or tuple(self.to_dict())
        rows = self.input_rows() if "x" in keys and "halo_x" in keys else None
        if rows is None:
            return super().apply(func, *args)  # type: ignore[return-value]
        n = self.x.size(0)
        rest = [k for k in keys if k not in ("x", "halo_x")]
        if rest:
            super().apply(func, *rest)
        moved = func(rows)
        if moved is not rows:  # unchanged (e.g. .to() on the same device): keep the very objects, caches key on them
            self.x, self.halo_x = moved[:n], moved[n:]
        return self

    def to_state(self) -> dict[str, Any]:
        """Plain dict of tensors and Python scalars, loadable with ``torch.load(weights_only=True)``."""
        return {key: value for key, value in self.items()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> HaloPartition:
        """Inverse of :meth:`to_state`."""
        return cls(**state)

    def __repr__(self) -> str:  # keep the default, but say which part this is
        base = super().__repr__()
        return base.replace("HaloPartition(", f"HaloPartition(part={self.part_id}/{self.num_parts}, ", 1)
