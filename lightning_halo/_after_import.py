"""Run a function when a module is first imported (now, if it already is): a post-import hook.

``import lightning_halo`` registers the strategy names with Lightning's ``StrategyRegistry``.
Importing Lightning for that costs seconds (it imports torch), which ``lightning-halo --help``
and any verb that never builds a Trainer should not pay. A Trainer can only look a name up once
``lightning.pytorch.strategies`` is imported, so registering right after that module loads is as
good as registering at once, and costs nothing when Lightning is never imported.

Example:
    >>> import sys
    >>> seen = []
    >>> when_imported("json", lambda module: seen.append(module.__name__))
    >>> seen
    ['json']
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Optional, Sequence

Hook = Callable[[ModuleType], None]


class _AfterLoader(importlib.abc.Loader):
    """The module's own loader; once it has executed the module, the hook runs."""

    def __init__(self, loader: Any, hook: Hook) -> None:
        self._loader, self._hook = loader, hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The import system stored this wrapper as the module's loader: give it its own back, so that
        # reload() and resource readers see the real one.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._hook(module)

    def __getattr__(self, name: str) -> Any:  # get_code, get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class _AfterFinder(importlib.abc.MetaPathFinder):
    """Finds ``name`` through the other finders and wraps its loader; removes itself once used."""

    def __init__(self, name: str, hook: Hook) -> None:
        self.name, self.hook = name, hook
        self._lock = threading.Lock()

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != self.name:
            return None
        with self._lock:
            if self not in sys.meta_path:
                return None
            sys.meta_path.remove(self)  # once: the spec below is the module's only first import
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _AfterLoader(spec.loader, self.hook)
                return spec
        return None


def when_imported(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once module ``name`` is imported: at once if it already is.

    Args:
        name (str): the module's full dotted name.
        hook (callable): called with the module object, after the module has executed.

    Example:
        >>> when_imported("lightning.pytorch.strategies", lambda m: print("registry ready"))  # doctest: +SKIP
    """
    module = sys.modules.get(name)
    if module is not None:
        hook(module)
        return
    sys.meta_path.insert(0, _AfterFinder(name, hook))
