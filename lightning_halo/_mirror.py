r"""``lightning_halo.pytorch_lightning``: the same adapters, built on the ``pytorch_lightning`` namespace.

Lightning ships two namespaces with separate class hierarchies: ``lightning.pytorch`` (which
lightning-halo is written against) and the classic ``pytorch_lightning`` (which PyG's Lightning
examples import as ``pl``). A ``pytorch_lightning.Trainer`` accepts only ``pytorch_lightning``
strategies, data modules and callbacks, and vice versa. So, as Lightning itself generated one
namespace from the other, the modules of lightning-halo that import Lightning (the strategy,
the data module, the callbacks, the models, the CLI: found by scanning their sources) are
loaded a second time under ``lightning_halo.pytorch_lightning.*`` with ``lightning.pytorch``
read as ``pytorch_lightning`` and ``lightning.fabric`` as ``lightning_fabric``; everything
without Lightning (partitioning, exchange, layers, codec) is shared by both.

    import pytorch_lightning as pl
    from lightning_halo.pytorch_lightning import HaloDataModule, HaloQuantStrategy
    trainer = pl.Trainer(strategy=HaloQuantStrategy(bits=32), devices=2)  # or strategy="halo_exact"
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Optional, Sequence

PACKAGE = "lightning_halo"
MIRROR = "lightning_halo.pytorch_lightning"
_ROOT = Path(__file__).resolve().parent
_LIGHTNING = re.compile(r"\blightning(\\?)\.(pytorch|fabric)\b")
_REFERENCE = re.compile(r"\blightning_halo(?:\.[A-Za-z_]\w*)*")


def _source(module: str) -> Optional[Path]:
    """The file of ``module`` (``lightning_halo.x.y``), package ``__init__`` included, or None."""
    rel = Path(*module.split(".")[1:])
    for candidate in (_ROOT / rel / "__init__.py", (_ROOT / rel).with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _longest_module(dotted: str) -> Optional[str]:
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if _source(name) is not None:
            return name
    return None


@lru_cache(maxsize=None)
def mirrored() -> frozenset[str]:
    """The modules that use Lightning, directly or through another such module (a fixpoint)."""
    sources = {}
    for path in _ROOT.rglob("*.py"):
        rel = path.relative_to(_ROOT).with_suffix("")
        parts = [PACKAGE, *rel.parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        sources[".".join(parts)] = path.read_text()
    imports = {name: _imports(text) for name, text in sources.items()}
    uses = {name for name, found in imports.items() if any(i.split(".")[0] in ("lightning", "pytorch_lightning") for i in found)}
    refs = {name: {m for i in found if (m := _longest_module(i)) and m != name} for name, found in imports.items()}
    changed = True
    while changed:
        changed = False
        for name, targets in refs.items():
            if name not in uses and targets & uses:
                uses.add(name)
                changed = True
    uses.discard(f"{PACKAGE}._mirror")
    return frozenset(uses)


def _imports(text: str) -> set[str]:
    """Modules a source imports (anywhere in it), plus string constants naming one of ours (lazy maps, and
    ``"module:attribute"`` entry points such as the command's verbs)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            named = node.value.partition(":")[0]
            if _REFERENCE.fullmatch(named):
                found.add(named)
    return found


def rewrite(text: str) -> str:
    """``text`` with Lightning's classic namespace and the mirrored modules' names.

    Example:
        >>> rewrite("from lightning.pytorch.strategies import DDPStrategy")
        'from pytorch_lightning.strategies import DDPStrategy'
    """
    targets = mirrored()

    def lightning(m: re.Match) -> str:
        return "pytorch_lightning" if m.group(2) == "pytorch" else "lightning_fabric"

    def ours(m: re.Match) -> str:
        ref = m.group(0)
        if ref == MIRROR or ref.startswith(MIRROR + "."):
            return ref
        module = _longest_module(ref)
        if module is None or module not in targets:
            return ref
        return MIRROR + module[len(PACKAGE) :] + ref[len(module) :]

    return _REFERENCE.sub(ours, _LIGHTNING.sub(lightning, text))


class _Loader(importlib.abc.Loader):
    def __init__(self, original: str, path: Path) -> None:
        self.original, self.path = original, path

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__file__ = str(self.path)
        code = compile(rewrite(self.path.read_text()), str(self.path), "exec")
        exec(code, module.__dict__)  # noqa: S102 - our own source, rewritten


class MirrorFinder(importlib.abc.MetaPathFinder):
    """Finds ``lightning_halo.pytorch_lightning[.x]``: the mirrored modules, loaded from our sources."""

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != MIRROR and not fullname.startswith(MIRROR + "."):
            return None
        original = PACKAGE + fullname[len(MIRROR) :]
        source = _source(original)
        if source is None or original not in mirrored():
            raise ModuleNotFoundError(
                f"{fullname}: lightning_halo.pytorch_lightning mirrors only the modules that use Lightning; "
                f"import {original} itself (it does not depend on the Lightning namespace)."
            )
        if importlib.util.find_spec("pytorch_lightning") is None:
            raise ModuleNotFoundError(
                f"{fullname} needs the classic `pytorch_lightning` package (pip install pytorch-lightning); "
                "with `lightning` alone, import lightning_halo instead."
            )
        package = source.name == "__init__.py"
        spec = importlib.util.spec_from_loader(fullname, _Loader(original, source), is_package=package)
        if spec is not None and package:
            spec.submodule_search_locations = []
        return spec


def install() -> None:
    """Put :class:`MirrorFinder` on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, MirrorFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MirrorFinder())
