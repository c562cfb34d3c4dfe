r"""Predictions of the whole graph in global node order, from each rank's rows of its own nodes.

Under :class:`~lightning_halo.HaloQuantStrategy` a rank's ``predict_step`` sees its
:class:`~lightning_halo.HaloPartition` and returns one row per inner node, in the partition's
order (``batch.inner_global_id`` names each row's node). :func:`gather_predictions` collects the
rows of every rank and puts each at its node's global id: ``[N, ...]``, the tensor a
single-process forward over the whole graph gives. ``predict_step`` may return a tensor or a
dict, tuple or list of tensors (nested too); the result has the same structure.

The pure steps (:func:`flatten_prediction`, :func:`place_rows`) are separate from the one
collective function, so they are tested without processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_halo.partition.halo_partition import HaloPartition
from lightning_halo.partition.hetero import HeteroHaloPartition

__all__ = ["PredictionError", "flatten_prediction", "gather_predictions", "place_rows"]


class PredictionError(ValueError):
    """Predictions that cannot be put in global node order (the message names the value and the fix)."""


@dataclass(frozen=True)
class _Slot:
    index: int


@dataclass(frozen=True)
class Flat:
    """A prediction taken apart: its tensors in order, and how to put them back together."""

    tensors: list[Tensor]
    #: One entry per tensor: (where it sits, e.g. ``prediction['logits']``, dtype, shape of one row).
    layout: tuple[tuple[str, str, tuple[int, ...]], ...]
    template: Any

    def rebuild(self, tensors: list[Tensor]) -> Any:
        """The prediction's structure with ``tensors`` in place of the original ones."""
        return _fill(self.template, tensors)

    @property
    def signature(self) -> str:
        """What must agree on every rank: structure, dtypes and row shapes (not the row counts)."""
        return f"{self.template!r} {self.layout!r}"


def _take_apart(obj: Any, where: str, out: list[tuple[str, Tensor]]) -> Any:
    if isinstance(obj, Tensor):
        out.append((where, obj))
        return _Slot(len(out) - 1)
    if isinstance(obj, Mapping):
        return {key: _take_apart(value, f"{where}[{key!r}]", out) for key, value in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple keeps its class
        return type(obj)(*(_take_apart(v, f"{where}.{name}", out) for name, v in zip(obj._fields, obj)))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_take_apart(v, f"{where}[{i}]", out) for i, v in enumerate(obj))
    raise PredictionError(
        f"{where} is a {type(obj).__name__}, not a tensor. Only tensors with one row per node of the rank's partition "
        "can be put in global node order: return a tensor, or a dict, tuple or list of them, from predict_step "
        "(gather other values yourself, e.g. with torch.distributed.all_gather_object)."
    )


def _fill(template: Any, tensors: list[Tensor]) -> Any:
    if isinstance(template, _Slot):
        return tensors[template.index]
    if isinstance(template, dict):
        return {key: _fill(value, tensors) for key, value in template.items()}
    if isinstance(template, tuple) and hasattr(template, "_fields"):
        return type(template)(*(_fill(v, tensors) for v in template))
    return type(template)(_fill(v, tensors) for v in template)


def flatten_prediction(prediction: Any, rows: int, name: str = "prediction") -> Flat:
    """Take a rank's prediction apart and check that every tensor has one row per owned node.

    Args:
        prediction (Any): a tensor, or a dict, tuple or list of tensors (nested too).
        rows (int): the nodes this rank owns (``n_inner``).
        name (str, optional): what to call it in messages. (default: ``"prediction"``)

    Example:
        >>> flat = flatten_prediction({"logits": torch.zeros(3, 2), "ids": torch.arange(3)}, rows=3)
        >>> [where for where, _, _ in flat.layout]
        ["prediction['logits']", "prediction['ids']"]
    """
    found: list[tuple[str, Tensor]] = []
    template = _take_apart(prediction, name, found)
    if not found:
        raise PredictionError(f"{name} holds no tensor; predict_step must return the rows of the rank's nodes")
    for where, t in found:
        if t.dim() == 0 or t.size(0) != rows:
            raise PredictionError(
                f"{where} has shape {tuple(t.shape)}, but this rank owns {rows} nodes: every tensor predict_step returns "
                "needs one row per node of its partition, in the partition's order (the model's output, say, not "
                "out[batch.test_mask]; select nodes in the gathered [N, ...] result instead)."
            )
    layout = tuple((where, str(t.dtype).replace("torch.", ""), tuple(t.shape[1:])) for where, t in found)
    return Flat([t for _, t in found], layout, template)


def place_rows(ids: list[Tensor], rows: list[Tensor], num_nodes: int) -> Tensor:
    """Rows of several ranks, ``rows[r][i]`` belonging to node ``ids[r][i]``, in global node order.

    Every node of ``[0, num_nodes)`` must be named exactly once.

    Args:
        ids (list[Tensor]): per rank, the global id of each row (``[n_r]``).
        rows (list[Tensor]): per rank, the rows (``[n_r, ...]``).
        num_nodes (int): nodes of the graph.

    Shapes:
        - **output:** ``[num_nodes, ...]``, on the CPU.

    Example:
        >>> place_rows([torch.tensor([2, 0]), torch.tensor([1])], [torch.tensor([20, 0]), torch.tensor([10])], 3)
        tensor([ 0, 10, 20])
    """
    all_ids = torch.cat([i.reshape(-1).cpu().long() for i in ids])
    if all_ids.numel() and (int(all_ids.min()) < 0 or int(all_ids.max()) >= num_nodes):
        raise PredictionError(f"a global node id is outside [0, {num_nodes}): the partitions do not belong to this graph")
    counts = torch.bincount(all_ids, minlength=num_nodes)
    if bool((counts != 1).any()):
        node = int(torch.nonzero(counts != 1)[0, 0])
        raise PredictionError(
            f"node {node} has {int(counts[node])} predicted rows (every node needs exactly one): the ranks' partitions "
            "do not cover the graph once; run predict on all ranks of the partitioning"
        )
    first = rows[0]
    out = torch.empty((num_nodes, *first.shape[1:]), dtype=first.dtype)
    out[all_ids] = torch.cat([r.cpu() for r in rows])
    return out


def gather_predictions(prediction: Any, part: Any, dst: Optional[int] = None, node_type: Optional[str] = None) -> Any:
    """Every rank's prediction for its own nodes, put together in global node order.

    A collective: every rank of the job must call it (with its own ``prediction`` and
    partition). The result has the structure of ``prediction`` with each tensor
    ``[n_inner, ...]`` replaced by ``[N, ...]``, row ``i`` belonging to node ``i`` of the
    graph, on the CPU. A problem on any rank (a value that is not a tensor, a tensor without
    one row per owned node, ranks returning different structures) raises the same
    :class:`PredictionError` on every rank, so none waits for the others.

    Args:
        prediction (Any): what this rank's ``predict_step`` returned for its partition.
        part (HaloPartition): this rank's partition (the predict batch).
        dst (int, optional): the rank that receives the result (the others get ``None``);
            by default every rank receives it. (default: ``None``)
        node_type (str, optional): on a heterogeneous partition, the node type the rows are of
            (``[N_type, ...]`` in the type's global order). (default: its labelled type)

    Example:
        >>> out = model.predict_step(part, 0)  # doctest: +SKIP
        >>> gather_predictions(out, part).shape  # doctest: +SKIP
        torch.Size([2708, 7])
    """
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    world_size, rank = (dist.get_world_size(), dist.get_rank()) if distributed else (1, 0)
    if dst is not None and not 0 <= dst < world_size:
        raise ValueError(f"dst={dst} is not a rank of this job (0 to {world_size - 1}); use None for every rank")
    flat: Optional[Flat] = None
    problem: Optional[str] = None
    n_inner, inner_ids, num_nodes = 0, torch.empty(0, dtype=torch.long), 0
    try:
        if isinstance(part, HeteroHaloPartition):
            node_type = node_type or part.labelled_type
            if node_type not in part.node_types:
                raise PredictionError(f"node_type={node_type!r} is not a node type of the graph ({part.node_types})")
            store = part[node_type]
            n_inner, num_nodes = int(store.n_inner), int(store.num_nodes_global)
            inner_ids = store.n_id[:n_inner]
        elif isinstance(part, HaloPartition):
            n_inner, inner_ids, num_nodes = int(part.n_inner), part.inner_global_id, int(part.num_nodes_global)
        else:
            raise PredictionError(f"part must be this rank's HaloPartition (the predict batch), got {type(part).__name__}")
        if (int(part.num_parts), int(part.part_id)) != (world_size, rank):
            raise PredictionError(
                f"rank {rank} of {world_size} was given partition {int(part.part_id)} of {int(part.num_parts)}; "
                "each rank gathers with its own part of a partitioning into as many parts as there are processes"
            )
        flat = flatten_prediction(prediction, n_inner)
    except PredictionError as err:
        problem = str(err)
    signature = None if flat is None else flat.signature
    if world_size == 1:
        if problem is not None:
            raise PredictionError(problem)
        assert flat is not None
        placed = [place_rows([inner_ids], [t], num_nodes) for t in flat.tensors]
        return flat.rebuild(placed)
    metas: list[Any] = [None] * world_size
    dist.all_gather_object(metas, (problem, signature, n_inner if flat is not None else 0))
    _raise_everywhere(metas)
    assert flat is not None
    counts = [int(m[2]) for m in metas]
    cpu_wire = dist.get_backend() != "nccl"  # gloo and mpi gather host tensors; NCCL device tensors
    gathered = [_gather_rows(t, counts, rank, dst, cpu_wire) for t in [inner_ids, *flat.tensors]]
    if gathered[0] is None:
        return None
    ids = gathered[0]
    placed = [place_rows(ids, rows, num_nodes) for rows in gathered[1:]]
    return flat.rebuild(placed)


def _raise_everywhere(metas: list[Any]) -> None:
    """Raise the first rank's problem, or a structure mismatch, on every rank alike."""
    for r, (problem, _, _) in enumerate(metas):
        if problem is not None:
            raise PredictionError(f"rank {r}: {problem}")
    reference = metas[0][1]
    for r, (_, signature, _) in enumerate(metas):
        if signature != reference:
            raise PredictionError(
                f"rank {r}'s prediction differs in structure, dtype or row shape from rank 0's ({signature} vs "
                f"{reference}); predict_step must return the same kind of value on every rank"
            )


def _gather_rows(
    t: Tensor, counts: list[int], rank: int, dst: Optional[int], cpu_wire: bool
) -> Optional[list[Tensor]]:
    """Each rank's ``[counts[r], ...]`` rows (padded to the largest count on the wire); ``None`` off ``dst``."""
    import torch.distributed as dist

    longest = max(counts)
    send = t.detach()
    if cpu_wire:
        send = send.cpu()
    if send.size(0) < longest:
        send = torch.cat([send, send.new_zeros((longest - send.size(0), *send.shape[1:]))])
    send = send.contiguous()
    receiving = dst is None or rank == dst
    bufs = [torch.empty_like(send) for _ in counts] if receiving else None
    if dst is None:
        dist.all_gather(bufs, send)
    else:
        dist.gather(send, bufs, dst=dst)
    return [b[:n].cpu() for b, n in zip(bufs, counts)] if bufs is not None else None
