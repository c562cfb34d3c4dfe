r"""A sparse adjacency that PyG's fused layers aggregate with, and its cached-transpose SpMM.

PyG layers with a ``message_and_aggregate`` (``GCNConv``, ``SAGEConv``, ``GINConv``, ...) call
``torch_geometric.utils.spmm(adj_t, x, reduce)`` when they are given a ``torch.sparse``
adjacency instead of an ``edge_index``: one sparse-dense product instead of an ``[E, d]``
message tensor. :class:`FusedAdjacency` is such an adjacency (a ``torch.sparse_csr`` tensor
PyG accepts as is) that routes the product to :class:`CachedSpMM`, whose backward uses a
transposed CSR built once, so a training step pays about one extra SpMM for the gradient
instead of torch's generic transpose of the sparse operand at every step.

The product keeps torch's semantics exactly (``sum``: :math:`A X`; ``mean``: :math:`A X`
divided row-wise by the stored entries per row, as ``torch.sparse.mm(A, X, "mean")`` and PyG's
CUDA path compute it; ``max``/``min``: torch's own kernels), so a layer gets the same result
with or without the interception.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, get_args

import torch
from torch import Tensor

from lightning_halo._compat.torch import make_subclass, plain_dispatch, sparse_mm_functions
from lightning_halo.memo import WarnOnce
from lightning_halo.partition.adjacency import Reduce

_REDUCES: tuple[Reduce, ...] = get_args(Reduce)
_warn_once = WarnOnce()  # once per process: the kernel a device lacks does not change


def csr(crow: Tensor, col: Tensor, values: Tensor, size: tuple[int, int]) -> Tensor:
    """A ``torch.sparse_csr`` tensor from sorted, duplicate-free parts (no O(nnz) invariant check)."""
    with warnings.catch_warnings():  # torch notes once per process that sparse CSR is "beta"
        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
        return torch.sparse_csr_tensor(crow, col, values, size=size, check_invariants=False)


def transpose_csr(a: Tensor) -> Tensor:
    """:math:`A^\\top` as CSR (built once per adjacency, then cached by its owner)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
        return a.t().to_sparse_csr()


def _sum_kernel(a: Tensor, x: Tensor) -> Tensor:
    """:math:`A X` with the fastest torch kernel for the device and dtype.

    On CPU torch's ``spmm_reduce`` kernel (``reduce="sum"``) is as fast as MKL's and also has
    bfloat16/float16 versions, which MKL lacks. On CUDA cuSPARSE; dtypes it lacks are computed
    in float32 and cast back (said once).
    """
    if x.device.type == "cpu":
        return torch.sparse.mm(a, x, "sum")
    try:
        return torch.sparse.mm(a, x)
    except RuntimeError:
        _warn_once(("spmm", str(x.dtype)), f"lightning-halo: no sparse kernel for {x.dtype} on {x.device}; "
                   "the fused aggregation runs in float32 and casts back")  # fmt: skip
        return torch.sparse.mm(a.to(torch.float32), x.float()).to(x.dtype)


class CachedSpMM(torch.autograd.Function):
    r"""``Y = A X`` whose backward is ``dX = A^T dY`` with a transposed CSR given up front."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, a: Tensor, a_t: Tensor) -> Tensor:  # type: ignore[override]
        ctx.a_t = a_t
        return _sum_kernel(a, x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], None, None]:  # type: ignore[override]
        return _sum_kernel(ctx.a_t, grad.contiguous()), None, None


_SPMM_FUNCS = sparse_mm_functions()


class FusedAdjacency(Tensor):
    r"""``torch.sparse_csr`` adjacency :math:`[n_{dst}, n_{src}]` whose products use :class:`CachedSpMM`.

    Everything else (``.size()``, ``.crow_indices()``, conversions, ...) behaves as for the
    plain CSR tensor and returns plain tensors. Built by :meth:`build`; the transposes are made
    on first use, per dtype and device, and kept.

    Shapes:
        - **adjacency:** :math:`[n_{dst}, n_{src}]`, row :math:`i` = in-edges of target :math:`i`
        - **x:** :math:`[n_{src}, d]` :math:`\to` :math:`[n_{dst}, d]`

    Example:
        >>> adj = FusedAdjacency.build(torch.tensor([[0, 1], [1, 0]]), None, 2, 2)
        >>> (adj @ torch.eye(2)).tolist()
        [[0.0, 1.0], [1.0, 0.0]]
    """

    @staticmethod
    def build(
        edge_index: Tensor,
        weights: Optional[Tensor],
        n_dst: int,
        n_src: int,
        reduce: Reduce = "sum",
        dtype: torch.dtype = torch.float32,
    ) -> FusedAdjacency:
        r"""The adjacency whose ``spmm(adj, x, reduce)`` equals PyG's message passing over ``edge_index``.

        A CSR matrix stores each ``(target, source)`` pair once, while ``edge_index`` may repeat
        an edge. The values make the product count repeats as PyG does: the summed weights
        :math:`S_{ij}` of the repeats for ``sum``; :math:`S_{ij}\, \mathrm{nnz}_i / \deg_i` for
        ``mean`` (torch divides by the stored entries :math:`\mathrm{nnz}_i`, PyG by the edge
        count :math:`\deg_i`); 1 for ``max``/``min`` (which take no weights).

        Args:
            edge_index (Tensor): ``[2, E]``, source -> target.
            weights (Tensor, optional): ``[E]`` per-edge weights (default 1).
            n_dst (int): rows (targets).
            n_src (int): columns (sources).
            reduce (str, optional): the layer's aggregation. (default: ``"sum"``)
            dtype (torch.dtype, optional): dtype of the values. (default: ``torch.float32``)
        """
        if reduce not in _REDUCES:
            raise ValueError(f"reduce must be 'sum', 'mean', 'max' or 'min', got {reduce!r}")
        if weights is not None and reduce in ("max", "min"):
            raise ValueError(f"{reduce} aggregation takes no edge weights")
        dst, src = edge_index[1].long(), edge_index[0].long()
        vals = torch.ones(dst.numel(), dtype=dtype, device=dst.device) if weights is None else weights.to(dtype)
        key = dst * n_src + src
        order = torch.argsort(key, stable=True)  # stable: equal keys keep their order, sums are reproducible
        key, vals = key[order], vals[order]
        uniq, inverse = torch.unique_consecutive(key, return_inverse=True)
        summed = torch.zeros(uniq.numel(), dtype=dtype, device=dst.device).index_add_(0, inverse, vals)
        row = torch.div(uniq, n_src, rounding_mode="floor")
        nnz = torch.bincount(row, minlength=n_dst)
        if reduce in ("max", "min"):
            summed = torch.ones_like(summed)
        elif reduce == "mean":
            deg = torch.bincount(dst, minlength=n_dst).clamp(min=1)
            summed = summed * (nnz.to(dtype) / deg.to(dtype))[row]
        crow = torch.zeros(n_dst + 1, dtype=torch.long, device=dst.device)
        crow[1:] = torch.cumsum(nnz, 0)
        col = uniq - row * n_src
        if max(n_dst, n_src, uniq.numel()) < 2**31 - 1:  # int32 ids: half the pattern's bytes, kernels alike
            crow, col = crow.to(torch.int32), col.to(torch.int32)
        return FusedAdjacency.wrap(csr(crow, col, summed, (n_dst, n_src)))

    @staticmethod
    def from_csr(
        crow: Tensor,
        col: Tensor,
        values: Tensor,
        size: tuple[int, int],
        transpose: Optional[tuple[Tensor, Tensor, Tensor]] = None,
    ) -> FusedAdjacency:
        r"""An adjacency from sorted, duplicate-free CSR parts, with its transpose's pattern if known.

        Args:
            crow (Tensor): ``[n_dst + 1]`` row offsets.
            col (Tensor): ``[nnz]`` sources, sorted within each row (``crow``'s dtype).
            values (Tensor): ``[nnz]`` values, as :meth:`build` would compute them.
            size (tuple): ``(n_dst, n_src)``.
            transpose (tuple, optional): ``(t_crow, t_col, t_perm)``: the transpose's row offsets
                ``[n_src + 1]``, its columns ``[nnz]`` and, for each of its entries, the entry of
                this matrix it holds. Given, the backward's transpose is this pattern with the
                values permuted instead of a conversion at first use.
        """
        adj = FusedAdjacency.wrap(csr(crow, col, values, size))
        if transpose is not None:
            adj.__dict__["_transpose"] = transpose
        return adj

    @staticmethod
    def wrap(a: Tensor) -> FusedAdjacency:
        """View a ``torch.sparse_csr`` tensor as a :class:`FusedAdjacency` (no copy)."""
        if a.layout != torch.sparse_csr:
            raise ValueError(f"FusedAdjacency needs a torch.sparse_csr tensor, got layout {a.layout}")
        return make_subclass(FusedAdjacency, a)  # type: ignore[return-value]

    def plain(self) -> Tensor:
        """The underlying CSR tensor (the subclass' torch function handling stripped)."""
        with plain_dispatch():
            return make_subclass(Tensor, self)

    def _pair(self, reduce: str, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
        """The product's CSR and its transpose for ``(reduce, dtype, device)``, built on first use."""
        kernels = self.__dict__.setdefault("_kernels", {})
        key = (reduce, dtype, device)
        hit = kernels.get(key)
        if hit is None:
            with plain_dispatch():
                base = make_subclass(Tensor, self).to(device)
                crow, col, val = base.crow_indices(), base.col_indices(), base.values()
                if reduce == "mean":  # torch's mean divides by the stored entries of the row
                    nnz = (crow[1:] - crow[:-1]).clamp(min=1)
                    val = val / torch.repeat_interleave(nnz.to(val.dtype), crow[1:] - crow[:-1])
                a = csr(crow, col, val.to(dtype), tuple(base.shape))  # type: ignore[arg-type]
                hit = (a, self._transposed(a, device))
            kernels[key] = hit
        return hit

    def _transposed(self, a: Tensor, device: torch.device) -> Tensor:
        """:math:`A^\top` of the product's CSR ``a``: from the known pattern if there is one, else converted."""
        pattern = self.__dict__.get("_transpose")
        if pattern is None:
            return transpose_csr(a)
        t_crow, t_col, t_perm = (t.to(device) for t in pattern)
        n_dst, n_src = a.shape
        return csr(t_crow, t_col, a.values()[t_perm.long()], (n_src, n_dst))

    def transpose_pattern(self) -> Optional[tuple[Tensor, Tensor, Tensor]]:
        """The transpose's pattern ``(t_crow, t_col, t_perm)`` given to :meth:`from_csr`, or ``None``."""
        return self.__dict__.get("_transpose")

    def as_operator(self) -> FusedAdjacency:
        r"""Mark the values as the final linear operator: ``mean`` products then take them as they are.

        An adjacency with halo partial sums (:mod:`lightning_halo.layers.reduction`) has a column
        per partial sum standing for several edges, so no row count can give the mean; its values
        are :math:`S_{ij}/\deg_i` already, and a layer's ``mean`` product is a plain sum with them.
        """
        self.__dict__["_operator"] = True
        return self

    def matmul_reduce(self, x: Tensor, reduce: Optional[str] = "sum") -> Tensor:
        """``torch.sparse.mm(self, x, reduce)`` with the cached-transpose backward for sum/mean."""
        reduce = "sum" if reduce in (None, "add") else reduce
        if self.__dict__.get("_operator"):
            if reduce not in ("sum", "mean"):
                raise ValueError(f"an adjacency with partial sums is a linear operator; {reduce} aggregation cannot use it")
            reduce = "sum"
        if reduce in ("sum", "mean"):
            a, a_t = self._pair(reduce, x.dtype, x.device)
            return CachedSpMM.apply(x, a, a_t)
        with plain_dispatch():  # max/min: torch's kernels and backward
            return torch.sparse.mm(self.plain().to(x.dtype), x, reduce)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if func in _SPMM_FUNCS and len(args) >= 2 and isinstance(args[0], FusedAdjacency) and (
            isinstance(args[1], Tensor) and args[1].layout == torch.strided
        ):
            reduce = args[2] if len(args) > 2 else kwargs.get("reduce", "sum")
            return args[0].matmul_reduce(args[1], reduce)
        with plain_dispatch():
            return func(*args, **kwargs)
