r"""Memory of one training rank and of the partition step, term by term (pure arithmetic on counts).

One rank, with :math:`n` inner and :math:`n_h` halo nodes (:math:`m = n + n_h`), :math:`E_p`
in-edges, :math:`\mathrm{nnz} = E_p + n` adjacency entries (its CSR stores each inner node's
diagonal), layer widths :math:`d_0 = F, d_1 = \dots = h, d_L = C`, float32 compute:

* ``pages``: the part files' pages the step reads: ``part_<p>.pt`` without its int64
  ``edge_index`` (the fused aggregation reads the stored CSR instead) plus ``adj_<p>.pt``;
* ``adjacency``: the values of the fused adjacency and of its transpose, :math:`2\,\mathrm{nnz}\cdot 4`;
* ``activations``: what autograd saves per layer (:func:`activation_bytes`, checked against
  what real ranks saved);
* ``halo``: one block of received halo rows :math:`n_h h 4` (pipelined: the stale rows and
  gradients of every later layer, kept between steps), plus the wire buffers of a quantized run;
* ``backward``: the temporaries of the backward pass: the gradient of a hidden layer's input
  :math:`m h 4` and of one activation :math:`n h 4`;
* ``model``: weights, gradients and Adam's two moments, :math:`4 \times 4` bytes per parameter;
* ``graph``: the whole graph, when every rank holds it (a graph given in memory or by name:
  :math:`N F s + 16 E + 11 N`; a path or a partition directory is memory-mapped, 0);
* ``codec``: the quantizer's compiled kernels, in a run with fewer than 32 bits (calibrated);
* ``idle``: the process before any data (Python, torch, Lightning, PyG; calibrated).

The partition step holds the int64 CSR (:func:`~lightning_halo.partition.graph.csr_bytes`) and
the partitioner's working set (:func:`partition_step_bytes`).
"""

from __future__ import annotations

import math
from typing import Optional

from lightning_halo.planner.facts import Partitioning
from lightning_halo.planner.options import check_model

#: KaMinPar's working set above the process, in CSRs: ``a + b log2(P)``, plus a fixed part. Fitted on
#: the memory benchmark's partition cells (SBM 1M / 24M, big 4M / 64M, huge 8M / 128M; 2-8 parts).
KAMINPAR_CSR = (1.0, 0.7)
KAMINPAR_FIXED = 256 << 20
FP32 = 4


def layer_dims(num_features: int, hidden: int, layers: int, num_classes: int) -> list[int]:
    """``[F, h, ..., h, C]``: one width per layer boundary.

    Example:
        >>> layer_dims(10, 256, 3, 2)
        [10, 256, 256, 2]
    """
    if layers < 1 or hidden < 1:
        raise ValueError(f"layers and hidden must be positive, got layers={layers}, hidden={hidden}")
    return [num_features] + [hidden] * (layers - 1) + [num_classes]


def model_params(model: str, dims: list[int]) -> int:
    """Parameters of a GCN (``W`` and a bias per layer) or GraphSAGE (``W_l``, ``W_r``, a bias) stack.

    Example:
        >>> model_params("gcn", [10, 256, 2]), model_params("sage", [10, 256, 2])
        (3330, 6402)
    """
    weights = {"gcn": 1, "sage": 2}[check_model(model)]  # W; or W_l and W_r
    return sum(weights * a * b + b for a, b in zip(dims[:-1], dims[1:]))


def activation_bytes(model: str, dims: list[int], n: int, m: int) -> int:
    r"""Bytes autograd saves for backward in one training step of ``model`` on a rank.

    Per layer ``l`` (:math:`d_{in} \to d_{out}`): GCN keeps a later layer's whole input
    ``[m, d_in]`` (it transforms every row, halo included, for :math:`X^\top G`); SAGE keeps
    its aggregate ``[n, d_in]`` and a later layer's root input ``[n, d_in]`` (the inner rows,
    a tensor of their own); between layers the activation's output and the dropout mask,
    ``[n, d_out]`` each (4 bytes a value, as measured); the loss keeps its ``[n, C]``
    log-probabilities. The first layer's input is the mapped part (counted in ``pages``).
    Measured with ``saved_tensors_hooks`` in real ranks (``benchmarks.memory``): SAGE, hidden 64,
    SBM at 2-8 ranks: :math:`5.08\,n h\,4` bytes; this gives :math:`5.125\,n h\,4`.

    Example:
        >>> activation_bytes("sage", [64, 64, 8], n=100, m=150)
        131200
    """
    sage = check_model(model) == "sage"
    total = 0
    last = len(dims) - 2
    for layer, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
        if layer > 0:
            total += (n if sage else m) * d_in * FP32
        if sage:
            total += n * d_in * FP32
        if layer < last:
            total += 2 * n * d_out * FP32
    return total + n * dims[-1] * FP32


def part_file_bytes(parts: Partitioning, p: int) -> tuple[int, int]:
    """``(part_<p>.pt, adj_<p>.pt)`` sizes: from the manifest, else from the counts (docs/large-graphs.md).

    Example:
        >>> from lightning_halo.planner.facts import from_counts
        >>> part_file_bytes(from_counts(1000, 10000, 16, 4, 2, 0.1), 0)
        (146780, 91264)
    """
    if parts.part_bytes is not None and parts.adj_bytes is not None:
        return int(parts.part_bytes[p]), int(parts.adj_bytes[p])
    n, h, e, s = parts.n_inner[p], parts.n_halo[p], parts.edges[p], parts.send_rows[p]
    part = (n + h) * parts.num_features * parts.feature_bytes + 11 * n + 16 * e + 8 * (n + h + s)
    nnz = e + n
    return part, 4 * (3 * nnz + e + 2 * n + h)


def whole_graph_bytes(parts: Partitioning) -> int:
    """The whole graph in memory: features, int64 ``edge_index``, int64 labels and three boolean masks.

    Example:
        >>> from lightning_halo.planner.facts import from_counts
        >>> whole_graph_bytes(from_counts(1000, 10000, 16, 4, 2, 0.1))
        235000
    """
    n = parts.num_nodes
    return n * parts.num_features * parts.feature_bytes + 16 * parts.num_edges + 11 * n


def rank_memory(
    parts: Partitioning, p: int, model: str, hidden: int, layers: int, mode: str = "sync",
    wire_row_bytes: int = 0, idle: int = 0, codec: int = 0,
) -> dict[str, int]:  # fmt: skip
    r"""Each term of rank ``p``'s memory and their sum, ``peak`` (bytes; see the module docstring).

    Args:
        parts (Partitioning): the counts. p (int): the rank. model (str): ``"gcn"`` or ``"sage"``.
        hidden (int): :math:`h`. layers (int): message-passing layers :math:`L`.
        mode (str, optional): ``"pipelined"`` keeps stale halo rows and gradients between
            steps. (default: ``"sync"``)
        wire_row_bytes (int, optional): bytes of one quantized row (``0`` at 32 bits: rows are
            sent from the tensors themselves). (default: ``0``)
        idle (int, optional): the idle process. (default: ``0``)
        codec (int, optional): the quantizer's kernels (give it for runs under 32 bits). (default: ``0``)
    """
    n, n_halo = parts.n_inner[p], parts.n_halo[p]
    m, nnz = n + n_halo, parts.edges[p] + n
    dims = layer_dims(parts.num_features, hidden, layers, parts.num_classes)
    part, adj = part_file_bytes(parts, p)
    stale = 2 * (layers - 1) * n_halo * hidden * FP32 if mode == "pipelined" else 0
    terms = {
        "part_file": part,
        "adjacency_file": adj,
        "pages": max(part - 16 * parts.edges[p], 0) + adj,
        "adjacency": 2 * nnz * FP32,
        "activations": activation_bytes(model, dims, n, m),
        "halo": (n_halo * hidden * FP32 if layers > 1 else 0) + stale + (n_halo + parts.send_rows[p]) * wire_row_bytes,
        "backward": (m * hidden + n * hidden) * FP32,
        "model": 4 * FP32 * model_params(model, dims),
        "graph": whole_graph_bytes(parts) if parts.graph_in_memory else 0,
        "codec": codec,
        "idle": idle,
    }
    terms["peak"] = sum(v for k, v in terms.items() if k not in ("part_file", "adjacency_file"))
    return terms


def partition_step_bytes(num_nodes: int, nnz: int, partitioner: str, parts: int, idle: int = 0) -> dict[str, int]:
    r"""Peak of ``lightning-halo partition`` with ``partitioner``: the process, the CSR, the partitioner's working set.

    METIS: :data:`~lightning_halo.partition.graph.METIS_FACTOR` CSRs (what ``partitioner="auto"``
    predicts). KaMinPar: :data:`KAMINPAR_CSR` ``(a, b)``: :math:`(a + b \log_2 P)` CSRs plus
    :data:`KAMINPAR_FIXED` (its compressed graph and its multilevel hierarchy, which grows with :math:`P`).

    Args:
        num_nodes (int): :math:`N`. nnz (int): entries of the symmetric adjacency (:math:`E` for
            a graph that lists both directions of every edge).
        partitioner (str): ``"metis"`` or ``"kaminpar"``. parts (int): :math:`P`.
        idle (int, optional): the idle process. (default: ``0``)

    Example:
        >>> partition_step_bytes(1000, 10000, "metis", 4)["working_set"] // partition_step_bytes(1000, 10000, "metis", 4)["csr"]
        15
    """
    from lightning_halo.partition.graph import METIS_FACTOR, csr_bytes

    csr = csr_bytes(num_nodes, nnz)
    if partitioner == "metis":
        work = METIS_FACTOR * csr
    elif partitioner == "kaminpar":
        a, b = KAMINPAR_CSR
        work = int((a + b * math.log2(max(parts, 1))) * csr) + KAMINPAR_FIXED - csr
    else:
        raise ValueError(f"no memory formula for partitioner {partitioner!r}; choose 'metis' or 'kaminpar'")
    return {"idle": idle, "csr": csr, "working_set": work, "peak": idle + csr + work}


def fits(peak: int, budget: Optional[int]) -> Optional[bool]:
    """Whether ``peak`` bytes fit ``budget`` (``None`` when no budget was given)."""
    return None if budget is None else peak <= budget
