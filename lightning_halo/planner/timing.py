r"""Epoch time: compute from the calibrated kernel rates, communication from an α-β model, overlap per mode.

**Compute** of one rank's training step (:func:`compute_seconds`), with the rates of
:mod:`lightning_halo.planner.calibrate`: the sparse-dense products of the fused aggregation
(forward :math:`A H`, backward :math:`A^\top G`) at ``spmm`` edge·features/s, the dense
matmuls (forward, weight and input gradients) at ``dense`` flop/s, the elementwise work around
each layer (bias, activation, dropout and their backward) at ``elementwise_s`` per value. GCN transforms then aggregates over the rank's
``m = n + n_halo`` rows (its square adjacency adds the halo's self-loops); SAGE aggregates the
``d_in`` columns of the inner nodes' inputs, then applies its two linear layers.

**Overhead** (:func:`overhead_seconds`): what a step costs beyond its kernels (Lightning's loop,
the optimizer's Python, the strategy's hooks and halo bookkeeping, DDP's hooks), calibrated
through real runs of a tiny model (:mod:`lightning_halo.planner.step`): ``step_s + L layer_s``
on one rank, ``dist_step_s + L dist_layer_s`` on several.

**Ranks sharing a host** (:func:`sharing_factor`): with :math:`k` ranks of :math:`t` threads on
a host of :math:`c` cores, the kernels run slower by the calibrated ``share`` (measured with
``share_ranks`` ranks at once), scaled by the oversubscription :math:`\max(1, k t / c)` relative to
the calibration's; the overhead grows with the oversubscription only.

**Communication**, α-β (Hockney; CAGNET's model): a message of :math:`b` bytes takes
:math:`\alpha + b / \beta`. One halo exchange is one ``all_to_all``; it lasts as long as the
busiest rank's link needs: with ``duplex="half"`` (measured on gloo over the testbed: a rank's
sends and receives of one exchange do not overlap) :math:`\alpha (P-1) + \max_p (s_p + r_p) / \beta`,
with ``"full"`` :math:`\alpha (P-1) + \max_p \max(s_p, r_p) / \beta`. Each of the :math:`L - 1`
later layers exchanges rows forward and gradients backward (:func:`halo_seconds`; the bytes are
:func:`~lightning_halo.exchange.plan.predict_traffic`'s, per rank). DDP's gradient all-reduce is
a ring: :math:`2 (P-1) \alpha + 2 \frac{P-1}{P} G / \beta` (:func:`allreduce_seconds`).

**Overlap** (:func:`epoch_seconds`): ``sync`` adds everything; ``pipelined`` overlaps this
epoch's exchange with its compute (:math:`\max`); ``periodic`` exchanges (synchronously) one
epoch in ``refresh_every``. The slowest rank sets the pace: compute and exchange are maxima over ranks.
"""

from __future__ import annotations

from typing import Any, Optional

from lightning_halo.planner.memory import FP32
from lightning_halo.planner.options import check_model

Duplex = str
DUPLEX = ("half", "full")


def compute_seconds(model: str, dims: list[int], n: int, m: int, nnz: int, rates: dict[str, Any]) -> dict[str, float]:
    r"""Seconds of one training step's kernels on a rank: ``spmm``, ``dense``, ``elementwise``, ``total``.

    Args:
        model (str): ``"gcn"`` or ``"sage"``. dims (list[int]): ``[F, h, ..., C]``.
        n (int): inner nodes. m (int): inner + halo nodes. nnz (int): entries of the rank's
            adjacency (in-edges + the inner diagonal).
        rates (dict): ``spmm``, ``dense`` and ``elementwise_s`` (:func:`~lightning_halo.planner.calibrate.calibrate`).

    Example:
        >>> r = {"spmm": 1e9, "dense": 1e10, "elementwise_s": 1e-8}
        >>> round(compute_seconds("sage", [16, 32, 4], n=1000, m=1500, nnz=10000, rates=r)["total"], 6)
        0.001683
    """
    gcn = check_model(model) == "gcn"
    spmm = dense = values = 0.0
    last = len(dims) - 2
    for layer, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
        grad_in = 1.0 if layer > 0 else 0.0  # the first layer's input needs no gradient
        if gcn:
            spmm += 2 * (nnz + m - n) * d_out  # A (X W) and A^T G on the square adjacency
            dense += 2 * m * d_in * d_out * (2 + grad_in)
        else:
            spmm += nnz * d_in * (1 + grad_in)
            dense += 2 * n * d_in * d_out * 2 * (2 + grad_in)  # lin_l and lin_r
        values += n * d_out if layer < last else 0
    out = {
        "spmm": spmm / rates["spmm"],
        "dense": dense / rates["dense"],
        "elementwise": values * rates["elementwise_s"],
    }
    out["total"] = sum(out.values())
    return out


def overhead_seconds(ranks: int, layers: int, rates: dict[str, Any]) -> float:
    """A step's cost beyond its kernels: ``step_s + layers * layer_s`` on one rank, the ``dist_`` pair on several.

    Args:
        ranks (int): ranks of the run. layers (int): message-passing layers.
        rates (dict): ``step_s``, ``layer_s``, ``dist_step_s``, ``dist_layer_s`` (:func:`~lightning_halo.planner.calibrate.calibrate`).

    Example:
        >>> r = {"step_s": 0.004, "layer_s": 0.001, "dist_step_s": 0.006, "dist_layer_s": 0.005}
        >>> overhead_seconds(1, 2, r), overhead_seconds(4, 2, r)
        (0.006, 0.016)
    """
    if ranks < 1 or layers < 1:
        raise ValueError(f"ranks and layers must be positive, got ranks={ranks}, layers={layers}")
    step, layer = ("step_s", "layer_s") if ranks == 1 else ("dist_step_s", "dist_layer_s")
    return rates[step] + layers * rates[layer]


def oversubscription(ranks_per_host: int, threads: int, cores: int) -> float:
    """How many times the host's cores are asked for: ``max(1, ranks_per_host * threads / cores)``.

    Example:
        >>> oversubscription(2, 1, 2), oversubscription(4, 1, 2)
        (1.0, 2.0)
    """
    return max(1.0, ranks_per_host * threads / cores)


def sharing_factor(ranks_per_host: int, rates: dict[str, Any]) -> tuple[float, float]:
    """``(kernels, overhead)``: how much slower each runs with ``ranks_per_host`` ranks on one host (see the module docstring).

    One rank per host: ``(1, 1)``. Several: the kernels by the calibrated ``share`` times the
    oversubscription relative to the calibration's (``share_ranks`` ranks of ``threads`` threads
    on ``cores`` cores), the overhead (measured with ``share_ranks`` ranks on the host) by that
    relative oversubscription only, never below 1.

    Args:
        ranks_per_host (int): ranks that share one host's cores.
        rates (dict): ``share``, ``share_ranks``, ``threads``, ``cores``.

    Example:
        >>> r = {"share": 1.2, "share_ranks": 2, "threads": 1, "cores": 2}
        >>> sharing_factor(1, r), sharing_factor(2, r), sharing_factor(4, r)
        ((1.0, 1.0), (1.2, 1.0), (2.4, 2.0))
    """
    if ranks_per_host < 1:
        raise ValueError(f"ranks_per_host must be at least 1, got {ranks_per_host}")
    if ranks_per_host == 1:
        return 1.0, 1.0
    cores, threads = int(rates["cores"]), int(rates["threads"])
    more = oversubscription(ranks_per_host, threads, cores) / oversubscription(int(rates["share_ranks"]), threads, cores)
    return float(rates["share"]) * max(more, 1.0), max(more, 1.0)


def exchange_seconds(
    sent: list[float], received: list[float], bandwidth: float, latency: float, duplex: Duplex = "half"
) -> float:
    r"""One ``all_to_all``: :math:`\alpha (P - 1)` plus the busiest link's bytes over :math:`\beta` (see the module docstring).

    Args:
        sent (list[float]): bytes each rank sends. received (list[float]): bytes each rank receives.
        bandwidth (float): bytes per second of one rank's link (:math:`\beta`).
        latency (float): seconds per message (:math:`\alpha`).
        duplex (str, optional): ``"half"`` or ``"full"``. (default: ``"half"``)

    Example:
        >>> exchange_seconds([3e6, 4e6], [4e6, 3e6], 1e7, 1e-4), exchange_seconds([3e6, 4e6], [4e6, 3e6], 1e7, 0, "full")
        (0.7001, 0.4)
    """
    if duplex not in DUPLEX:
        raise ValueError(f"duplex must be one of {DUPLEX}, got {duplex!r}")
    if len(sent) < 2 or not any(sent) and not any(received):
        return 0.0
    join = (lambda s, r: s + r) if duplex == "half" else max
    return latency * (len(sent) - 1) + max(join(s, r) for s, r in zip(sent, received)) / bandwidth


def halo_seconds(
    recv_rows: list[int], send_rows: list[int], hidden: int, layers: int, bits: int, bandwidth: float, latency: float,
    duplex: Duplex = "half",
) -> float:  # fmt: skip
    """Seconds of one epoch's halo exchanges (forward rows and backward gradients of the later layers).

    The bytes per rank are :func:`~lightning_halo.exchange.plan.predict_traffic`'s for the rows it
    receives (forward; it sends as many gradients backward) and sends.

    Args:
        recv_rows (list[int]): rows each rank receives per exchange. send_rows (list[int]): rows it sends.
        hidden (int): row width. layers (int): message-passing layers. bits (int): wire bits.
        bandwidth (float): bytes/s. latency (float): s. duplex (str, optional): as for
            :func:`exchange_seconds`. (default: ``"half"``)
    """
    from lightning_halo.exchange.plan import predict_traffic

    def per_layer(rows: int) -> float:
        t = predict_traffic(rows, 0, hidden, layers, bits)
        return t["fwd_per_epoch"] / max(layers - 1, 1)

    recv = [per_layer(r) for r in recv_rows]
    sent = [per_layer(s) for s in send_rows]
    one = exchange_seconds(sent, recv, bandwidth, latency, duplex) + exchange_seconds(
        recv, sent, bandwidth, latency, duplex
    )
    return (layers - 1) * one


def allreduce_seconds(gradient_bytes: int, ranks: int, bandwidth: float, latency: float) -> float:
    r"""DDP's ring all-reduce of ``gradient_bytes``: :math:`2 (P-1) \alpha + 2 \frac{P-1}{P} G / \beta`.

    Example:
        >>> allreduce_seconds(8_000_000, 2, 12.5e6, 0.0)
        0.64
    """
    if ranks < 2:
        return 0.0
    return 2 * (ranks - 1) * latency + 2 * (ranks - 1) / ranks * gradient_bytes / bandwidth


def codec_seconds(rows: int, hidden: int, layers: int, bits: int, rates: dict[str, Any]) -> float:
    """Quantizing and dequantizing ``rows`` rows (sent plus received) forward and backward, per epoch (0 at 32 bits)."""
    if bits >= 32 or layers < 2:
        return 0.0
    return 2 * (layers - 1) * rows * hidden * FP32 / rates["codec"]


def epoch_seconds(
    compute: float, halo: float, allreduce: float, codec: float, mode: str, refresh_every: Optional[int] = None,
) -> float:  # fmt: skip
    """The epoch as ``mode`` overlaps its parts (see the module docstring).

    Args:
        compute (float): the slowest rank's compute (kernels and overhead). halo (float): one epoch's exchanges.
        allreduce (float): the gradient all-reduce. codec (float): quantization.
        mode (str): ``"sync"``, ``"pipelined"`` or ``"periodic"``.
        refresh_every (int, optional): periodic only. (default: ``10``, ``HaloSchedule``'s)

    Example:
        >>> epoch_seconds(0.3, 0.7, 0.01, 0.0, "sync"), epoch_seconds(0.3, 0.7, 0.01, 0.0, "pipelined")
        (1.01, 0.71)
    """
    if mode == "sync":
        return compute + halo + codec + allreduce
    if mode == "pipelined":
        return max(compute + codec, halo) + allreduce
    if mode == "periodic":
        k = refresh_every or 10
        return compute + allreduce + (halo + codec) / k
    from lightning_halo.exchange.policy import check_mode

    check_mode(mode)
    raise AssertionError("unreachable")
