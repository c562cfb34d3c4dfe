"""Partition once, offline, into a directory that the training job's ranks read from shared storage."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Optional, Union

from torch_geometric.data import Data

from lightning_halo.data.cache import cache_key, publish
from lightning_halo.data.partition_dir import MANIFEST, PartitionDirectory, Phase, is_partition_dir, write_partition_dir
from lightning_halo.data.sources import InMemorySource, graph_facts, open_graph
from lightning_halo.partition.options import check_num_parts, check_options, check_threads


def partition_to_dir(
    source: Union[str, os.PathLike, Data],
    out: Union[str, os.PathLike],
    num_parts: int,
    *,
    partitioner: str = "metis",
    balance: str = "nodes",
    seed: int = 0,
    threads: int = 1,
    overwrite: bool = False,
    on_phase: Optional[Phase] = None,
) -> dict[str, Any]:
    r"""Write the partition directory ``out`` for ``source``, in bounded memory; return its manifest.

    What ``lightning-halo partition GRAPH --parts P --out DIR`` runs. A path is memory-mapped
    and read in windows (see :mod:`lightning_halo.data.sources`), so the peak memory is the
    graph's structure and METIS's working set plus a window, never the features. The
    directory is written next to ``out`` and renamed into place when complete: a failure
    leaves nothing behind, and an existing ``out`` is only replaced with ``overwrite=True``
    and only if it is a partition directory itself.

    Args:
        source (str or Data): a graph (file, graph directory, bundled name, ``pyg:`` spec or
            a :class:`~torch_geometric.data.Data`).
        out (str): the partition directory to create.
        num_parts (int): :math:`P`, the number of training processes.
        partitioner (str, optional): ``"metis"``, ``"kaminpar"``, ``"auto"`` or ``"random"``, as
            for :func:`~lightning_halo.partition_graph`. (default: ``"metis"``)
        balance (str, optional): ``"nodes"`` or ``"edges"``. (default: ``"nodes"``)
        seed (int, optional): partitioner seed. (default: ``0``)
        threads (int, optional): KaMinPar's threads. One writer serves every rank here, so
            more than one (faster, not deterministic) is safe. (default: ``1``)
        overwrite (bool, optional): replace an existing partition directory. (default: ``False``)
        on_phase (callable, optional): called with ``"scan"``, ``"partition"``, ``"halo"``,
            ``"write"``, ``"done"`` as each phase starts.

    Example:
        >>> manifest = partition_to_dir("graph.pt", "/shared/graph-8", 8)  # doctest: +SKIP
        >>> manifest["num_parts"]  # doctest: +SKIP
        8
    """
    check_options(partitioner, balance, num_parts, allow_none=False)
    check_threads(threads)
    out = Path(out)
    if on_phase is not None:
        on_phase("scan")
    if isinstance(source, Data):
        data = InMemorySource(source).graph()
        facts = graph_facts(data, "a torch_geometric Data")
    else:
        data = open_graph(source)
        facts = graph_facts(data, str(source))
    check_num_parts(num_parts, facts["num_nodes"])
    key = cache_key(facts["fingerprint"], num_parts=num_parts, partitioner=partitioner, balance=balance, seed=seed)
    existing = PartitionDirectory(out)
    if out.exists() and any(out.iterdir()):
        if existing.is_complete() and existing.read_meta().get("key") == key:
            return existing.read_meta()  # already partitioned exactly so
        if not overwrite:
            raise FileExistsError(
                f"{out} exists and holds {'another partitioning' if is_partition_dir(out) else 'other files'}; "
                "choose a new --out directory" + (", or pass --overwrite to replace it" if is_partition_dir(out) else "")
            )
        if not is_partition_dir(out):
            raise FileExistsError(f"{out} is not a partition directory (no {MANIFEST}); refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        manifest = write_partition_dir(
            data, tmp, num_parts, partitioner=partitioner, balance=balance, seed=seed, threads=threads, graph=facts,
            key=key, on_phase=on_phase,
        )  # fmt: skip
        publish(tmp, out, replace=True)
        return manifest
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
