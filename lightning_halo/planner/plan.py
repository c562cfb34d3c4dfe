r"""The capacity planner: per rank count, memory per rank, bytes and epoch time per bit width and mode.

    from lightning_halo.planner import plan
    result = plan("cora", ranks=[2, 4], model="gcn", hidden=256, bits=[32, 1], modes=["sync", "pipelined"])
    result["plans"][0]      # {"ranks": 2, "bits": 32, "mode": "sync", "peak_bytes_per_rank": ..., ...}
    result["recommendation"]["text"]

Each figure comes from a pure function of :mod:`lightning_halo.planner.memory` and
:mod:`lightning_halo.planner.timing`; the bytes are :func:`~lightning_halo.exchange.plan.predict_traffic`'s,
exactly as ``lightning-halo partition`` prints them. ``assumptions`` in the result says what the
figures rest on (where the counts came from, the link, the calibration).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from lightning_halo.planner import memory as mem
from lightning_halo.planner.calibrate import RATE_KEYS, check_rates
from lightning_halo.planner import timing
from lightning_halo.planner.facts import Partitioning, from_counts, from_graph
from lightning_halo.planner.options import PLAN_PARTITIONERS, check_model, format_bytes, parse_latency, parse_rate

#: Rank counts planned when none are given (a partition directory plans its own).
DEFAULT_RANKS = (2, 4, 8)


@dataclass(frozen=True)
class Workload:
    """The model and the run the plan is for (checked once, in :func:`plan`).

    Args:
        model (str): ``"gcn"`` or ``"sage"``. hidden (int): hidden width. layers (int): message-passing layers.
        bandwidth (float): bytes/s of one rank's link. latency (float): seconds per message.
        reduction (str): ``"cover"`` (halo partial sums, the strategy's default) or ``"none"``.
        duplex (str): ``"half"`` or ``"full"`` (:func:`~lightning_halo.planner.timing.exchange_seconds`).
        refresh_every (int): periodic mode's refresh interval.
        ranks_per_host (int): ranks that share one host's cores (:func:`~lightning_halo.planner.timing.sharing_factor`).
        rates (dict): the calibration (:func:`~lightning_halo.planner.calibrate.check_rates`).
    """

    model: str
    hidden: int
    layers: int
    bandwidth: float
    latency: float
    reduction: str = "cover"
    duplex: str = "half"
    refresh_every: int = 10
    rates: dict[str, Any] = field(default_factory=dict)
    ranks_per_host: int = 1


def halo_rows(parts: Partitioning, reduction: str) -> tuple[list[int], list[int]]:
    """Rows each rank receives and sends per exchange: every halo row, or with partial sums the cover's.

    With ``reduction="cover"`` and the manifest's per-rank ``cover_rows``, a rank receives its
    cover rows; what it sends is not recorded per rank, so its sent rows shrink by the same
    overall factor (exact for two ranks, where one's sends are the other's receipts).
    """
    if reduction != "cover" or parts.cover_rows is None:
        return list(parts.n_halo), list(parts.send_rows)
    recv = list(parts.cover_rows)
    if parts.ranks == 2:
        return recv, recv[::-1]
    scale = sum(recv) / max(sum(parts.n_halo), 1)
    return recv, [round(s * scale) for s in parts.send_rows]


def epoch_bytes(parts: Partitioning, work: Workload, bits: int) -> int:
    """Halo bytes of one training epoch, all ranks (``predict_traffic``'s forward + backward)."""
    from lightning_halo.exchange.plan import predict_traffic

    cover = sum(parts.cover_rows) if work.reduction == "cover" and parts.cover_rows is not None else None
    t = predict_traffic(sum(parts.n_halo), parts.num_features, work.hidden, work.layers, bits,
                        feature_bytes=parts.feature_bytes, cover_rows=cover)  # fmt: skip
    return t["fwd_per_epoch"] + t["bwd_per_epoch"]


def plan_cell(parts: Partitioning, work: Workload, bits: int, mode: str) -> dict[str, Any]:
    """One row of the plan: ``parts`` at ``bits`` in ``mode`` (memory of the largest rank, epoch time)."""
    from lightning_halo.quant import row_nbytes

    wire = row_nbytes(work.hidden, bits) if bits < 32 else 0
    idle, codec = int(work.rates["idle_bytes"]), int(work.rates["codec_bytes"]) if bits < 32 else 0
    ranks = [
        mem.rank_memory(parts, p, work.model, work.hidden, work.layers, mode, wire, idle, codec)
        for p in range(parts.ranks)
    ]
    worst = max(range(parts.ranks), key=lambda p: ranks[p]["peak"])
    dims = mem.layer_dims(parts.num_features, work.hidden, work.layers, parts.num_classes)
    kernels_by, overhead_by = timing.sharing_factor(min(work.ranks_per_host, parts.ranks), work.rates)
    compute = [timing.compute_seconds(work.model, dims, parts.n_inner[p], parts.n_inner[p] + parts.n_halo[p],
                                      parts.edges[p] + parts.n_inner[p], work.rates) for p in range(parts.ranks)]  # fmt: skip
    slowest = max(compute, key=lambda c: c["total"])
    kernels = slowest["total"] * kernels_by
    overhead = timing.overhead_seconds(parts.ranks, work.layers, work.rates) * overhead_by
    recv, sent = halo_rows(parts, work.reduction)
    halo = timing.halo_seconds(recv, sent, work.hidden, work.layers, bits, work.bandwidth, work.latency, work.duplex)
    grads = mem.FP32 * mem.model_params(work.model, dims)
    allreduce = timing.allreduce_seconds(grads, parts.ranks, work.bandwidth, work.latency)
    codec = kernels_by * timing.codec_seconds(max(r + s for r, s in zip(recv, sent)), work.hidden, work.layers, bits, work.rates)
    epoch = timing.epoch_seconds(kernels + overhead, halo, allreduce, codec, mode, work.refresh_every)
    return {
        "ranks": parts.ranks, "bits": bits, "mode": mode,
        "peak_bytes_per_rank": ranks[worst]["peak"], "epoch_seconds": epoch, "bytes_per_epoch": epoch_bytes(parts, work, bits),
        "memory": ranks[worst], "memory_rank": worst,
        "time": {"compute": kernels + overhead, "kernels": kernels, "overhead": overhead, "sharing": kernels_by,
                 "compute_terms": slowest, "halo": halo, "allreduce": allreduce, "codec": codec},
        "halo_rows_received": recv, "halo_rows_sent": sent, "source": parts.source,
    }  # fmt: skip


def partition_step(parts: Partitioning, idle: int) -> list[dict[str, Any]]:
    """The partition step's predicted peak for each partitioner (nothing to partition at one rank)."""
    if parts.ranks < 2:
        return []
    rows = []
    for name in PLAN_PARTITIONERS:
        step = mem.partition_step_bytes(parts.num_nodes, parts.num_edges, name, parts.ranks, idle)
        rows.append({"ranks": parts.ranks, "partitioner": name, "peak_bytes": step["peak"], "csr_bytes": step["csr"],
                     "working_set_bytes": step["working_set"]})  # fmt: skip
    return rows


def recommend(plans: list[dict[str, Any]], memory: Optional[int]) -> dict[str, Any]:
    """The fastest plan that fits ``memory`` per rank (fewer ranks on a tie within 5 %), with its line of text."""
    fitting = [p for p in plans if memory is None or p["peak_bytes_per_rank"] <= memory]
    if not fitting:
        least = min(plans, key=lambda p: p["peak_bytes_per_rank"])
        return {"plan": None, "text": f"no plan fits {format_bytes(memory or 0)} per rank: the smallest needs "
                f"{format_bytes(least['peak_bytes_per_rank'])} ({least['ranks']} ranks); plan more ranks"}  # fmt: skip
    best = min(p["epoch_seconds"] for p in fitting)
    pick = min(
        (p for p in fitting if p["epoch_seconds"] <= 1.05 * best),
        key=lambda p: (p["ranks"], -p["bits"], p["epoch_seconds"]),
    )
    bit = "bit" if pick["bits"] == 1 else "bits"
    text = (f"{pick['ranks']} ranks at {pick['bits']} {bit}, {pick['mode']}: {format_bytes(pick['peak_bytes_per_rank'])} "
            f"per rank, ~{pick['epoch_seconds']:.3g} s/epoch")  # fmt: skip
    return {
        "plan": {k: pick[k] for k in ("ranks", "bits", "mode", "peak_bytes_per_rank", "epoch_seconds")},
        "text": text,
    }


def partitionings(
    graph: Any, ranks: Optional[Sequence[int]], partitioner: str = "metis", counts: Optional[dict[str, int]] = None,
    cut_ratio: Optional[float] = None, cache_dir: Optional[str] = None,
) -> list[Partitioning]:  # fmt: skip
    """The counts for every rank count: a partition directory's own, a graph partitioned into the cache, or estimates.

    Args:
        graph: a partition directory, or what ``HaloDataModule(data=...)`` takes, or ``None`` with ``counts``.
        ranks (list[int], optional): rank counts (a partition directory has its own). (default: ``None``:
            :data:`DEFAULT_RANKS`)
        partitioner (str, optional): for a graph. (default: ``"metis"``)
        counts (dict, optional): ``num_nodes``, ``num_edges``, ``num_features``, ``num_classes``
            (and ``feature_bytes``) of a graph too large to load. (default: ``None``)
        cut_ratio (float, optional): with ``counts``: the share of edges between parts. (default: ``None``)
        cache_dir (str, optional): the partition cache. (default: ``$LIGHTNING_HALO_CACHE``)
    """
    from lightning_halo.data.partition_dir import is_partition_dir, read_manifest
    from lightning_halo.planner.facts import from_manifest

    if isinstance(graph, str) and is_partition_dir(graph):
        manifest = read_manifest(graph)
        held = int(manifest["num_parts"])
        if ranks and list(ranks) != [held]:
            raise ValueError(f"{graph} is a partition directory of {held} parts: it plans {held} ranks only. Leave out "
                             f"--ranks, or plan other rank counts from the graph itself (or from --nodes/--edges counts)")  # fmt: skip
        return [from_manifest(manifest)]
    if ranks is not None and len(ranks) == 0:
        raise ValueError("ranks is empty: give at least one rank count (e.g. ranks=[2, 4]), or None for (2, 4, 8)")
    ranks = ranks or DEFAULT_RANKS
    if graph is not None:
        return [from_graph(graph, int(p), partitioner, cache_dir) for p in ranks]
    if counts is None:
        raise ValueError(
            "give a graph, a partition directory, or the graph's counts (--nodes, --edges, --features, --classes)"
        )
    if cut_ratio is None:
        raise ValueError(
            "planning from counts needs an assumed cut ratio (--cut-ratio 0.1: the share of edges between parts)"
        )
    return [from_counts(ranks=int(p), cut_ratio=cut_ratio, **counts) for p in ranks]


def plan(
    graph: Any = None, ranks: Optional[Sequence[int]] = None, model: str = "gcn", hidden: int = 256, layers: int = 2,
    bits: Sequence[int] = (32, 1), modes: Sequence[str] = ("sync", "pipelined"), bandwidth: str | float = "10gbit",
    latency: str | float = "50us", *, partitioner: str = "metis", halo_reduction: str = "cover", duplex: str = "half",
    refresh_every: int = 10, memory: Optional[int] = None, counts: Optional[dict[str, int]] = None,
    cut_ratio: Optional[float] = None, rates: Optional[dict[str, Any]] = None, threads: int = 1,
    cache_dir: Optional[str] = None, ranks_per_host: int = 1,
) -> dict[str, Any]:  # fmt: skip
    r"""Plan a run: for every rank count, bit width and mode, the per-rank peak memory and the epoch time.

    Args:
        graph: a partition directory (its manifest only is read), a graph as ``HaloDataModule``
            takes it (partitioned into the cache for every rank count), or ``None`` with ``counts``. (default: ``None``)
        ranks (list[int], optional): rank counts. (default: ``None``: a partition directory's own, else ``(2, 4, 8)``)
        model (str, optional): ``"gcn"`` or ``"sage"``. (default: ``"gcn"``)
        hidden (int, optional): hidden width. (default: ``256``)
        layers (int, optional): message-passing layers. (default: ``2``)
        bits (list[int], optional): wire bit widths. (default: ``(32, 1)``)
        modes (list[str], optional): halo modes. (default: ``("sync", "pipelined")``)
        bandwidth (str or float, optional): one rank's link, ``"10gbit"`` or bits/s. (default: ``"10gbit"``)
        latency (str or float, optional): per message, ``"50us"`` or seconds. (default: ``"50us"``)
        partitioner (str, optional): for a graph. (default: ``"metis"``)
        halo_reduction (str, optional): ``"cover"`` (partial sums) or ``"none"``. (default: ``"cover"``)
        duplex (str, optional): ``"half"`` or ``"full"``. (default: ``"half"``)
        refresh_every (int, optional): periodic mode's interval. (default: ``10``)
        memory (int, optional): bytes a rank may use; plans that exceed it are not recommended. (default: ``None``)
        counts (dict, optional), cut_ratio (float, optional): for a graph too large to load (:func:`partitionings`).
        rates (dict, optional): kernel rates (default: the stored calibration, measured if missing).
        threads (int, optional): threads per rank, for the calibration. (default: ``1``)
        cache_dir (str, optional): the partition cache. (default: ``$LIGHTNING_HALO_CACHE``)
        ranks_per_host (int, optional): ranks that share one host's cores: their kernels slow down
            by the calibrated ``share``, and more where they ask for more cores than the host has
            (:func:`~lightning_halo.planner.timing.sharing_factor`). (default: ``1``, a host per rank)

    Returns:
        ``{"plans": [...], "partition_step": [...], "recommendation": {...}, "assumptions": {...}}``.

    Example:
        >>> result = plan("cora", ranks=[2, 4], model="sage", hidden=64, bits=[32, 1], bandwidth="1gbit")  # doctest: +SKIP
        >>> result["recommendation"]["text"]  # doctest: +SKIP
        '4 ranks at 32 bits, pipelined: 521 MB per rank, ~0.0582 s/epoch'
    """
    work, bits, modes = _checked(
        model, hidden, layers, bits, modes, bandwidth, latency, halo_reduction, duplex, refresh_every, ranks_per_host
    )
    if rates is None:
        from lightning_halo.planner.calibrate import load_rates

        rates = check_rates(load_rates(threads), "this machine's stored calibration")
    else:
        check_rates(rates, "the calibration given as rates")
    work = Workload(**{**work.__dict__, "rates": rates})
    parts_list = partitionings(graph, ranks, partitioner, counts, cut_ratio, cache_dir)
    plans = [plan_cell(parts, work, b, m) for parts in parts_list for b in bits for m in modes]
    for p in plans:
        p["fits"] = mem.fits(p["peak_bytes_per_rank"], memory)
    steps = [row for parts in parts_list for row in partition_step(parts, int(rates["idle_bytes"]))]
    return {"plans": plans, "partition_step": steps, "recommendation": recommend(plans, memory),
            "assumptions": assumptions(parts_list, work, memory), "graph": _graph_facts(parts_list[0])}  # fmt: skip


def _checked(
    model: str, hidden: int, layers: int, bits: Sequence[int], modes: Sequence[str], bandwidth: Any, latency: Any,
    reduction: str, duplex: str, refresh_every: int, ranks_per_host: int = 1,
) -> tuple[Workload, list[int], list[str]]:  # fmt: skip
    from lightning_halo.exchange.policy import check_count, check_mode
    from lightning_halo.layers.reduction import check_halo_reduction
    from lightning_halo.quant.allocate import is_adaptive
    from lightning_halo.quant.format import check_bits

    check_model(model)
    for name, given in (("bits", bits), ("modes", modes)):
        if isinstance(given, (str, int)) or len(given) == 0:  # a bare 8 or "sync" is a list of one, not of digits
            raise ValueError(f"{name} must be a non-empty list (e.g. {name}={[32, 1] if name == 'bits' else ['sync']}), "
                             f"got {given!r}")  # fmt: skip
    check_halo_reduction(reduction)
    check_count("refresh_every", refresh_every, 1)
    check_count("ranks_per_host", ranks_per_host, 1)
    for b in bits:
        if is_adaptive(b):  # widths chosen from the variance measured while training
            raise ValueError(
                "bits 'adaptive' chooses each layer's width from the variance its rows show during training, which no "
                "plan can know: plan its bounds, the narrowest of its bit_choices and the width whose bytes its "
                "bit_budget allows (bits 1 and 2 for the defaults: 2x the 1-bit bytes is about 2-bit's)"
            )
    for m in modes:
        check_mode(m)
        if m == "adaptive":  # its layers switch between the two from the drift measured while training
            raise ValueError(
                "mode 'adaptive' runs each layer synchronous or pipelined as the drift measured during training "
                "decides, which no plan can know: plan modes 'sync' and 'pipelined', its two bounds"
            )
    if duplex not in timing.DUPLEX:
        raise ValueError(f"duplex must be one of {timing.DUPLEX}, got {duplex!r}")
    mem.layer_dims(1, hidden, layers, 1)  # checks hidden and layers
    work = Workload(model, hidden, layers, parse_rate(bandwidth), parse_latency(latency), reduction, duplex,
                    refresh_every, ranks_per_host=ranks_per_host)  # fmt: skip
    return work, [check_bits(b) for b in bits], list(modes)


def assumptions(parts_list: list[Partitioning], work: Workload, memory: Optional[int]) -> dict[str, Any]:
    """What the figures rest on, for the report and the JSON."""
    rates = work.rates
    return {
        "counts": sorted({p.note for p in parts_list}), "source": sorted({p.source for p in parts_list}),
        "model": work.model, "hidden": work.hidden, "layers": work.layers, "halo_reduction": work.reduction,
        "bandwidth_bytes_per_s": work.bandwidth, "latency_s": work.latency, "duplex": work.duplex,
        "memory_per_rank": memory, "ranks_per_host": work.ranks_per_host,
        "calibration": {k: rates.get(k) for k in ("key", "measured", "version", *RATE_KEYS)},
        "not_modelled": "accuracy (1 bit and stale halos are lossy: validate them), kernels slower on operand shapes "
                        "unlike the calibration's (skinny matrices, wide inputs), memory the allocator keeps "
                        "(docs/large-graphs.md#memory-arithmetic), GPU kernels",
    }  # fmt: skip


def _graph_facts(parts: Partitioning) -> dict[str, int]:
    return {"num_nodes": parts.num_nodes, "num_edges": parts.num_edges, "num_features": parts.num_features,
            "num_classes": parts.num_classes}  # fmt: skip
