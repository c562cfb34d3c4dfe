r"""Batch normalisation over the nodes of *all* partitions: exact on every backend.

A batch norm (``torch.nn.BatchNorm1d``, and through it PyG's
:class:`~torch_geometric.nn.norm.BatchNorm` and ``norm="batch_norm"`` in
``torch_geometric.nn.models``) normalises with the mean and variance of the rows it is given.
On a partition those are the rank's own nodes; the whole graph's statistics are sums over
every rank's rows. :func:`global_batch_norm` gathers them with one all-reduce of
:math:`(n, \sum (x-k), \sum (x-k)^2)` per channel (:math:`k` the running mean, the same on
every rank, so the sums do not cancel), normalises, and keeps the running statistics as one
process would (unbiased variance for ``running_var``, as torch does). Its backward needs the
global sums of :math:`\partial\hat x` and :math:`\partial\hat x \cdot \hat x` too: one
more all-reduce (`Ioffe and Szegedy <https://arxiv.org/abs/1502.03167>`_, eq. in Sec. 3).

The rows must be each counted once over the ranks: a partition's inner nodes (or a per-node
subset of them, e.g. ``h[batch.train_mask]``) or its edges. A call on the inner *and* halo
rows is refused. :class:`BatchNormHook` makes every batch norm of a model run this way while
a partition is bound (:class:`~lightning_halo.HaloQuantStrategy` installs it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor
from torch.nn import Module

from lightning_halo._compat.torch import BATCH_NORM_BASE
from lightning_halo.layers.registry import UnsupportedLayerError

#: ``all_sum(values, name)``: ``values`` summed over all ranks (one all-reduce, with a timeout).
AllSum = Callable[[Tensor, str], Tensor]


class _AllSum(torch.autograd.Function):
    """``values`` summed over all ranks; the gradient of each rank's copy summed back (every rank reads the sum)."""

    @staticmethod
    def forward(ctx: Any, values: Tensor, all_sum: AllSum, name: str) -> Tensor:  # type: ignore[override]
        ctx.all_sum, ctx.name = all_sum, name
        return all_sum(values.detach().clone(), name)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], None, None]:  # type: ignore[override]
        # the sum is linear: its backward is the sum again, through this function, so it differentiates once more
        return _AllSum.apply(grad.contiguous(), ctx.all_sum, ctx.name), None, None


def global_sum(values: Tensor, all_sum: AllSum, name: str) -> Tensor:
    """``values`` summed over all ranks, differentiable: the gradient of every rank's copy is summed back."""
    return _AllSum.apply(values, all_sum, name)


@dataclass(frozen=True)
class NormCall:
    """One batch-norm call: its name, ``eps`` and how to sum over the ranks."""

    name: str
    eps: float
    all_sum: AllSum


def _dims(x: Tensor) -> list[int]:
    """The dimensions a batch norm reduces over: all but the channels (dim 1)."""
    return [0, *range(2, x.dim())]


def _per_channel(v: Tensor, x: Tensor) -> Tensor:
    """A ``[C]`` tensor shaped to broadcast against ``x`` (``[N, C, *]``)."""
    return v.reshape(1, -1, *([1] * (x.dim() - 2)))


def global_statistics(x: Tensor, shift: Optional[Tensor], call: NormCall) -> tuple[Tensor, Tensor, int]:
    r"""Mean, biased variance (``[C]``, float64) and row count of ``x`` over all ranks.

    Args:
        x (Tensor): the rank's rows, ``[n, C, *]``.
        shift (Tensor, optional): ``[C]``, equal on every rank (the running mean): the sums are
            taken of :math:`x - k`, so they do not cancel. (default: ``None``, i.e. 0)
        call (NormCall): the call.
    """
    xs = x.detach().to(torch.float64)
    k = torch.zeros(x.size(1), dtype=torch.float64, device=x.device) if shift is None else shift.detach().double()
    centred = xs - _per_channel(k, x)
    count = torch.tensor([x.numel() // max(1, x.size(1))], dtype=torch.float64, device=x.device)
    sums = torch.cat([count, centred.sum(_dims(x)), centred.square().sum(_dims(x))])
    sums = call.all_sum(sums, call.name)
    n, c = int(sums[0]), x.size(1)
    if n <= 1:
        raise ValueError(
            f"batch norm '{call.name}': expected more than 1 value per channel when training, got {n} over all ranks "
            f"(input size {list(x.shape)} on this rank)"
        )
    d_mean = sums[1 : 1 + c] / n
    var = (sums[1 + c :] / n - d_mean.square()).clamp_min(0.0)
    return k + d_mean, var, n


class _GlobalBatchNorm(torch.autograd.Function):
    """Normalise with the global statistics; backward with the global sums of the gradient terms."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], mean: Tensor, var: Tensor, n: int,
        call: NormCall,
    ) -> Tensor:
        invstd = (var + call.eps).rsqrt()
        xhat = (x - _per_channel(mean.to(x.dtype), x)) * _per_channel(invstd.to(x.dtype), x)
        ctx.save_for_backward(x, mean, invstd, weight, bias)  # x, as torch saves it: a double backward needs it
        ctx.n, ctx.call = n, call
        y = xhat if weight is None else xhat * _per_channel(weight, x)
        return y if bias is None else y + _per_channel(bias, x)

    @staticmethod
    def backward(ctx: Any, gy: Tensor) -> tuple[Optional[Tensor], ...]:  # type: ignore[override]
        x, mean, invstd, weight, bias = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a backward that differentiates again, through global sums
            return (*_differentiable_grads(x, weight, bias, gy, ctx.needs_input_grad[:3], ctx.n, ctx.call), None, None, None, None)
        xhat = (x - _per_channel(mean.to(x.dtype), x)) * _per_channel(invstd.to(x.dtype), x)
        dims = _dims(gy)
        g_weight = (gy * xhat).sum(dims) if ctx.needs_input_grad[1] else None
        g_bias = gy.sum(dims) if ctx.needs_input_grad[2] else None
        g_x = None
        if ctx.needs_input_grad[0]:
            g_hat = gy if weight is None else gy * _per_channel(weight, gy)
            sums = torch.cat([g_hat.double().sum(dims), (g_hat.double() * xhat.double()).sum(dims)])
            sums = ctx.call.all_sum(sums, ctx.call.name) / ctx.n
            c = gy.size(1)
            mean_g, mean_gx = (_per_channel(s.to(gy.dtype), gy) for s in (sums[:c], sums[c:]))
            g_x = (g_hat - mean_g - xhat * mean_gx) * _per_channel(invstd.to(gy.dtype), gy)
        return g_x, g_weight, g_bias, None, None, None, None


def _differentiable_grads(
    x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], gy: Tensor, needs: tuple[bool, ...], n: int,
    call: NormCall,
) -> tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """The batch norm's gradients as a graph of their own (``create_graph=True``): the normalisation recomputed from
    ``x`` (``n`` rows over all ranks) with its statistics as differentiable global sums, then differentiated, so that
    a second derivative reaches every rank's rows as one process's does. The saved tensors carry their history here:
    the gradients are functions of them, in the outer graph."""
    dims = _dims(x)
    inputs = (x, weight, bias)
    with torch.enable_grad():
        mean = global_sum(x.double().sum(dims), call.all_sum, call.name) / n
        centred = x - _per_channel(mean.to(x.dtype), x)
        var = global_sum(centred.double().square().sum(dims), call.all_sum, call.name) / n
        y = centred * _per_channel((var + call.eps).rsqrt().to(x.dtype), x)
        y = y if weight is None else y * _per_channel(weight, x)
        y = y if bias is None else y + _per_channel(bias, x)
        wanted = [t for t, need in zip(inputs, needs) if t is not None and need]
        grads = iter(torch.autograd.grad(y, wanted, gy, create_graph=True))
    return tuple(next(grads) if t is not None and need else None for t, need in zip(inputs, needs))  # type: ignore[return-value]


def global_batch_norm(x: Tensor, module: Module, call: NormCall) -> Tensor:
    """``module`` (a torch batch norm) applied to ``x`` with the statistics of every rank's rows.

    Follows ``torch.nn.modules.batchnorm._BatchNorm.forward``: batch statistics in training (or
    without running statistics), running statistics otherwise (no collective then); running
    statistics updated with ``momentum`` (``None``: a cumulative average) and the unbiased
    variance. Every rank must call it alike: it is one collective forward, one backward.

    Args:
        x (Tensor): the rank's rows, ``[n, C]`` or ``[n, C, *]``.
        module (Module): a ``BatchNorm1d/2d/3d`` (its parameters and buffers are used and updated).
        call (NormCall): the name, ``eps`` and the all-reduce.
    """
    running_mean, running_var = module.running_mean, module.running_var
    use_batch = module.training or (running_mean is None and running_var is None)
    if not use_batch:
        return torch.nn.functional.batch_norm(
            x, running_mean, running_var, module.weight, module.bias, False, 0.0, module.eps
        )
    mean, var, n = global_statistics(x, running_mean if module.training else None, call)
    if module.training and module.track_running_stats and running_mean is not None:
        factor = _momentum(module)
        with torch.no_grad():
            running_mean.mul_(1 - factor).add_(mean.to(running_mean.dtype), alpha=factor)
            running_var.mul_(1 - factor).add_((var * n / (n - 1)).to(running_var.dtype), alpha=factor)
    return _GlobalBatchNorm.apply(x, module.weight, module.bias, mean, var, n, call)


def _momentum(module: Module) -> float:
    """The running statistics' update factor of this call (and the batch counted), as torch computes it."""
    tracked = module.num_batches_tracked
    if tracked is not None:
        tracked.add_(1)
        if module.momentum is None:
            return 1.0 / float(tracked)
    return 0.0 if module.momentum is None else float(module.momentum)


@dataclass(frozen=True)
class BoundRows:
    """What a norm needs while a partition is bound: the all-reduce, and the row counts that tell a call on a node
    set's inner rows (each counted once over the ranks) from one on its inner *and* halo rows (counted twice).

    Args:
        all_sum (AllSum): sums over all ranks.
        inner (frozenset): each node set's inner row count (one set on a homogeneous partition, one per node type
            on a heterogeneous one).
        local (dict): inner and halo row count -> the node set's name, for each node set with halo rows.
    """

    all_sum: AllSum
    inner: frozenset[int]
    local: dict[int, str]

    def check(self, rows: int, what: str) -> None:
        """Refuse a call of ``what`` on ``rows`` rows that are, or may be, a node set's inner and halo rows."""
        owner = self.local.get(rows)
        if owner is None:
            return
        if rows in self.inner:
            raise UnsupportedLayerError(
                f"{what} was called on {rows} rows: on this rank that is the inner row count of one node type and the "
                f"inner and halo row count of {owner} alike, so lightning-halo cannot tell whether halo rows, which "
                "belong to other ranks, would be counted twice. Use another number of processes, or a node-wise norm "
                "(LayerNorm(mode='node'))"
            )
        raise UnsupportedLayerError(
            f"{what} was called on {rows} rows, the partition's inner and halo nodes{owner and ' of ' + owner}: the "
            "halo rows belong to other ranks, so they would be counted twice. Apply it to the inner rows (a layer's "
            "output, batch.x, or a per-node subset of them)."
        )


#: ``rows()`` of a norm hook: ``None`` when no partition is bound (or one process), else :class:`BoundRows`.
NormRows = Callable[[], Optional[BoundRows]]


class NormHook:
    """Runs one norm of a model with the statistics of every partition's rows while ``rows()`` says a partition is
    bound (a subclass's ``_forward``).

    The module's ``forward`` is replaced on the instance (its parameters, buffers and state
    dict stay what they are) and put back by :meth:`remove`.

    Args:
        module (Module): the norm.
        name (str): its qualified name (for errors and traffic).
        rows (callable): ``None`` when no partition is bound (the module runs as it is), else its
            :class:`BoundRows`.
    """

    def __init__(self, module: Module, name: str, rows: NormRows) -> None:
        self.module, self.name, self.rows = module, name, rows

    def install(self) -> NormHook:
        self.module.forward = self._forward
        return self

    def remove(self) -> None:
        self.module.__dict__.pop("forward", None)

    def _forward(self, *args: Any, **kwargs: Any) -> Tensor:
        raise NotImplementedError


class BatchNormHook(NormHook):
    """A :class:`NormHook` for a torch batch norm (``BATCH_NORM_BASE``): :func:`global_batch_norm`."""

    def _forward(self, x: Tensor) -> Tensor:
        module, bound = self.module, self.rows()
        if bound is None:
            return type(module).forward(module, x)
        bound.check(x.size(0), f"batch norm '{self.name}'")
        return global_batch_norm(x, module, NormCall(self.name, float(module.eps), bound.all_sum))


def find_batch_norms(model: Module) -> dict[str, Module]:
    """Every torch batch norm of ``model`` by qualified name (PyG's ``BatchNorm`` holds one as ``.module``)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, BATCH_NORM_BASE)}
