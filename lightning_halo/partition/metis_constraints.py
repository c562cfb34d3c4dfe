r"""METIS with several balance constraints, through the METIS library that pymetis ships.

METIS balances ``ncon`` weights per node at once (multi-constraint partitioning: G. Karypis and
V. Kumar, `"Multilevel Algorithms for Multi-Constraint Graph Partitioning"
<https://doi.org/10.1109/SC.1998.10018>`_, SC 1998): every part :math:`p` keeps
:math:`\sum_{v \in p} w_c(v) \le u_c \cdot \frac{1}{P} \sum_v w_c(v)` for every constraint :math:`c`
(:math:`u_c = 1.03`, METIS' default ``ufactor=30``, for every constraint). pymetis' ``part_graph``
passes one weight per node, but its extension module links METIS in and exports METIS' C API
(``METIS_SetDefaultOptions``, ``METIS_PartGraphKway``, ``METIS_PartGraphRecursive``). We call that
API through :mod:`ctypes` (:func:`~lightning_halo._compat.pymetis.metis_c_api`: the index width
pymetis was built with and its option indices), choosing recursive bisection up to 8 parts as
pymetis does. With one constraint the result is
pymetis' own, node for node (tested); with two it is the same multilevel algorithm balancing both.

Pure: arrays in, array out. Heterogeneous graphs use it to balance the labelled type inside METIS
(:func:`~lightning_halo.partition.hetero.assign_hetero_parts`).
"""

from __future__ import annotations

import ctypes

import numpy as np

from lightning_halo._compat.pymetis import MetisUnavailable, metis_c_api

METIS_OK = 1
#: METIS' return codes other than ``METIS_OK``.
METIS_ERRORS = {-2: "METIS_ERROR_INPUT (an invalid graph or weights)", -3: "METIS_ERROR_MEMORY (out of memory)",
                -4: "METIS_ERROR (an internal error)"}  # fmt: skip
#: ``METIS_NOPTIONS``: the length of METIS' options array.
METIS_NOPTIONS = 40


def metis_available() -> bool:
    """Whether :func:`part_graph_constraints` can run here."""
    try:
        metis_c_api()
    except MetisUnavailable:
        return False
    return True


def part_graph_constraints(
    xadj: np.ndarray, adjncy: np.ndarray, weights: np.ndarray, num_parts: int, seed: int = 0
) -> np.ndarray:
    r"""Partition a symmetric CSR graph into ``num_parts`` parts balancing every column of ``weights``.

    Args:
        xadj (np.ndarray): ``[N + 1]`` row offsets of the symmetric adjacency without self-loops
            (:func:`~lightning_halo.partition.graph.symmetric_csr`).
        adjncy (np.ndarray): ``[2E]`` neighbours.
        weights (np.ndarray): ``[N, ncon]`` non-negative integer weights, one column per balance
            constraint; every column sums to more than zero.
        num_parts (int): :math:`P \ge 2`.
        seed (int, optional): METIS' seed. (default: ``0``)

    Returns:
        ``int64`` array ``[N]``: the part of every node.

    Raises:
        MetisUnavailable: pymetis does not export METIS' C API.
        ValueError: weights of the wrong shape, negative, or a column summing to zero.
        RuntimeError: METIS returned an error (named).
    """
    lib, idx, keys = metis_c_api()
    dtype = np.int64 if idx is ctypes.c_int64 else np.int32
    n = int(xadj.size) - 1
    weights = np.asarray(weights)
    if weights.ndim == 1:
        weights = weights[:, None]
    if weights.ndim != 2 or weights.shape[0] != n or weights.shape[1] < 1:
        raise ValueError(f"weights must be [num_nodes={n}, ncon], got {list(weights.shape)}")
    if (weights < 0).any() or (weights.sum(axis=0) <= 0).any():
        raise ValueError("every balance constraint needs non-negative weights summing to more than zero; "
                         f"column sums: {weights.sum(axis=0).tolist()}")  # fmt: skip
    if num_parts < 2:
        raise ValueError(f"num_parts must be at least 2 (one part needs no METIS), got {num_parts}")
    ncon = int(weights.shape[1])

    def arr(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a, dtype=dtype)

    xadj_, adjncy_, vwgt = arr(xadj), arr(adjncy), arr(weights.reshape(-1))
    options = (idx * METIS_NOPTIONS)()
    lib.METIS_SetDefaultOptions(options)
    options[keys["SEED"]], options[keys["NUMBERING"]] = int(seed), 0
    nvtxs, ncon_, nparts, objval = idx(n), idx(ncon), idx(int(num_parts)), idx(0)
    part = np.zeros(n, dtype=dtype)
    ptr = lambda a: a.ctypes.data_as(ctypes.POINTER(idx))  # noqa: E731
    # recursive bisection up to 8 parts, k-way above: pymetis' choice, so one constraint partitions as pymetis does
    call = lib.METIS_PartGraphRecursive if num_parts <= 8 else lib.METIS_PartGraphKway
    status = call(
        ctypes.byref(nvtxs), ctypes.byref(ncon_), ptr(xadj_), ptr(adjncy_), ptr(vwgt), None, None, ctypes.byref(nparts),
        None, None, options, ctypes.byref(objval), ptr(part),
    )  # fmt: skip
    if status != METIS_OK:
        raise RuntimeError(f"METIS failed: {METIS_ERRORS.get(status, f'code {status}')} partitioning {n} nodes into "
                           f"{num_parts} parts with {ncon} constraints")  # fmt: skip
    return part.astype(np.int64, copy=False)
