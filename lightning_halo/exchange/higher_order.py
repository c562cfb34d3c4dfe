"""Second derivatives through lightning-halo's collectives (``create_graph=True``).

Gradient penalties, Hessian-vector products and second-order meta-learning differentiate a backward
pass. The halo fetch and the all-reduce are linear maps, so their backward is linear in the incoming
gradient and differentiates again (:mod:`lightning_halo.exchange.exchanger`,
:func:`lightning_halo.layers.batchnorm.global_sum`); the global batch norm recomputes its backward from
those sums under ``create_graph``. A collective whose backward is not written to be differentiated
(the link gather's) marks what it returns with :func:`refuse_second_order`: differentiating through it
raises, naming the collective, instead of silently leaving out the terms that crossed the wire.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor


class _Refused(torch.autograd.Function):
    """Identity forward; a backward that raises ``why`` (the second derivative it would have to give)."""

    @staticmethod
    def forward(ctx: Any, t: Tensor, why: str) -> Tensor:  # type: ignore[override]
        ctx.why = why
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, None]:  # type: ignore[override]
        raise RuntimeError(ctx.why)


def refuse_second_order(t: Optional[Tensor], what: str) -> Optional[Tensor]:
    """``t`` (a gradient a custom backward returns), made to raise if a second derivative flows through it.

    Only where the backward runs with ``create_graph=True`` (grad mode on inside backward) and ``t`` is part of a
    graph; otherwise ``t`` unchanged.

    Args:
        t (Tensor, optional): the gradient.
        what (str): the collective, as the error names it (e.g. ``"the gather of link endpoints' rows"``).

    Example:
        >>> g = torch.ones(2, requires_grad=True)
        >>> r = refuse_second_order(g * 2, "the example")
        >>> torch.autograd.grad(r.sum(), g)
        Traceback (most recent call last):
        ...
        RuntimeError: lightning-halo: second derivatives (create_graph=True) through the example are not supported on partitions; ...
    """
    if t is None or not torch.is_grad_enabled() or not t.requires_grad:
        return t
    why = (f"lightning-halo: second derivatives (create_graph=True) through {what} are not supported on partitions; "
           "its backward crosses the ranks and is not differentiated again, so the result would miss those terms. "
           "Compute the penalty without it (e.g. on a model without that module), or take first derivatives only")  # fmt: skip
    return _Refused.apply(t, why)
