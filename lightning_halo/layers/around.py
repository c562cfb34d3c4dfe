"""A pre- and a post-forward hook on one module, installed and removed together.

Hooks that change or mark one call of a module (a quantile aggregation's padding, a recomputed block's
marker) need the pair: the post-hook runs even when the forward raises (``always_call``), so what the
pre-hook started is always ended.
"""

from __future__ import annotations

from typing import Any

from torch.nn import Module


class AroundForward:
    """Installs ``self._pre`` (with the call's keyword arguments if :attr:`with_kwargs`) and ``self._post`` on
    ``module``; :meth:`remove` takes both off.

    Example:
        >>> class Count(AroundForward):
        ...     calls = 0
        ...     def _pre(self, module, args): self.calls += 1
        ...     def _post(self, module, args, output): return None
        >>> m = torch.nn.Identity(); hook = Count(m).install(); _ = m(torch.ones(1)); hook.remove(); _ = m(torch.ones(1))
        >>> hook.calls
        1
    """

    #: whether ``_pre`` takes ``(module, args, kwargs)`` and may return new ``(args, kwargs)``
    with_kwargs = False

    def __init__(self, module: Module) -> None:
        self.module = module
        self._handles: list[Any] = []

    def install(self) -> Any:
        self._handles = [
            self.module.register_forward_pre_hook(self._pre, with_kwargs=self.with_kwargs),
            self.module.register_forward_hook(self._post, always_call=True),
        ]
        return self

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _pre(self, module: Module, *args: Any) -> Any:
        raise NotImplementedError

    def _post(self, module: Module, args: tuple, output: Any) -> Any:
        raise NotImplementedError
