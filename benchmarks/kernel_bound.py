r"""Kernel bound of a partition: the time of one training step's SpMMs and dense matmuls alone.

CAGNET and DistGNN compare an epoch with what its kernels allow. For a 2-layer model on one
partition, this times exactly the sparse-dense products (forward :math:`A H`, backward
:math:`A^\top G`, on the partition's CSR as the fused path builds it) and the dense matmuls
(forward :math:`X W`, backward :math:`G W^\top` and :math:`X^\top G`) of a training step,
with the same shapes, dtype and threads as the run, one kernel at a time (median of
``repeats``). Everything else an epoch does (activations, dropout, loss, optimizer, Python,
Lightning) is outside the bound, so ``compute / bound`` says how far an epoch is from it.

    from benchmarks.kernel_bound import kernel_bound
    kernel_bound("gcn", part, dims=[F, 256, C])  # {'spmm_s': ..., 'dense_s': ..., 'bound_s': ...}
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch


from lightning_halo.layers.fused import FusedAdjacency
from lightning_halo.layers.normalize import gcn_weights


def _time(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up (allocations, kernel selection)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _adjacency(model: str, part: Any, dtype: torch.dtype) -> tuple[FusedAdjacency, int]:
    """The CSR the fused path multiplies with, and its row count (the layer's output rows)."""
    n_inner, n_src = int(part.n_inner), int(part.n_inner) + int(part.n_halo)
    ei = part.edge_index
    if model == "gcn":  # full feed, square, normalised (the halo's degrees do not change the pattern)
        ei, w = gcn_weights(ei, None, n_inner, n_src, improved=False, add_self_loops=True,
                            to_halo=lambda v: torch.ones(n_src - n_inner, dtype=v.dtype), dtype=dtype)  # fmt: skip
        return FusedAdjacency.build(ei, w, n_src, n_src, "sum", dtype), n_src
    reduce = "mean" if model == "sage" else "sum"
    return FusedAdjacency.build(ei, None, n_inner, n_src, reduce, dtype), n_inner


def kernel_bound(model: str, part: Any, dims: list[int], repeats: int = 5, dtype: torch.dtype = torch.float32) -> dict:
    """Seconds of one training step's kernels on ``part`` for ``model`` in ``{"gcn", "sage", "gin"}``.

    Args:
        model: the zoo model (GCN: transform then aggregate on ``[x; halo]``; SAGE/GIN: aggregate
            the inputs of the inner nodes, then their linear layers).
        part: the rank's :class:`~lightning_halo.HaloPartition`.
        dims: feature sizes ``[F, hidden, ..., classes]`` (one layer per consecutive pair).
        repeats: timed repetitions per kernel (the median counts).
        dtype: the features' dtype.

    Returns:
        ``{"spmm_s", "dense_s", "bound_s", "kernels": [(name, seconds), ...]}``.
    """
    if model not in ("gcn", "sage", "gin"):
        raise ValueError(f"no kernel bound for {model!r} (it computes per-edge values): use gcn, sage or gin")
    adj, n_out = _adjacency(model, part, dtype)
    n_inner, n_src = int(part.n_inner), int(part.n_inner) + int(part.n_halo)
    a, a_t = adj._pair("mean" if model == "sage" else "sum", dtype, torch.device("cpu"))
    mm = torch.sparse.mm
    kernels: list[tuple[str, float, str]] = []

    def add(name: str, kind: str, fn: Callable[[], Any]) -> None:
        kernels.append((name, _time(fn, repeats), kind))

    for layer, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
        first = layer == 0  # its input needs no gradient
        w = torch.randn(d_in, d_out, dtype=dtype)
        if model == "gcn":
            x = torch.randn(n_src, d_in, dtype=dtype)
            h, g = torch.randn(n_src, d_out, dtype=dtype), torch.randn(n_out, d_out, dtype=dtype)
            add(f"l{layer} X W", "dense", lambda: x @ w)
            add(f"l{layer} A H", "spmm", lambda: mm(a, h, "sum"))
            add(f"l{layer} A^T G", "spmm", lambda: mm(a_t, g, "sum"))
            add(f"l{layer} X^T dH", "dense", lambda: x.t() @ h)
            if not first:
                add(f"l{layer} dH W^T", "dense", lambda: h @ w.t())
        else:
            x = torch.randn(n_src, d_in, dtype=dtype)
            g_agg = torch.randn(n_inner, d_in, dtype=dtype)
            z, gz = torch.randn(n_inner, d_in, dtype=dtype), torch.randn(n_inner, d_out, dtype=dtype)
            add(f"l{layer} A X", "spmm", lambda: mm(a, x, "sum"))
            if not first:
                add(f"l{layer} A^T G", "spmm", lambda: mm(a_t, g_agg, "sum"))
            n_lin = 2  # SAGE: lin_l(aggregate) + lin_r(root); GIN: the MLP's two layers
            for i in range(n_lin):
                wi = w if i == 0 or model == "sage" else torch.randn(d_out, d_out, dtype=dtype)
                zi = z if i == 0 or model == "sage" else gz
                add(f"l{layer} lin{i} fwd", "dense", lambda zi=zi, wi=wi: zi @ wi)
                add(f"l{layer} lin{i} dW", "dense", lambda zi=zi: zi.t() @ gz)
                if not first or i > 0:
                    add(f"l{layer} lin{i} dX", "dense", lambda wi=wi: gz @ wi.t())
    spmm_s = sum(t for _, t, k in kernels if k == "spmm")
    dense_s = sum(t for _, t, k in kernels if k == "dense")
    return {
        "spmm_s": spmm_s,
        "dense_s": dense_s,
        "bound_s": spmm_s + dense_s,
        "nnz": int(a._nnz()),
        "rows": [n_inner, n_src],
        "threads": torch.get_num_threads(),
        "kernels": [(n, t) for n, t, _ in kernels],
    }


