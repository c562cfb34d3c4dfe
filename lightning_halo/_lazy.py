"""Module attributes imported on first access (PEP 562), so that importing a package stays cheap."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_module_attributes(
    package: str, exports: dict[str, list[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` for a package whose names live in submodules.

    Args:
        package (str): the package's ``__name__``.
        exports (dict): submodule name to the public names it defines.

    Example:
        >>> __getattr__, __dir__, __all__ = lazy_module_attributes(__name__, {"pkg.mod": ["Thing"]})
    """
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(importlib.import_module(package), name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(where))

    return __getattr__, __dir__, sorted(where)
