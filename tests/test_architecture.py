"""The package's shape, checked on its source: short functions where the logic changes most, no
reading of other objects' internals outside ``_compat``, option tuples derived from their types."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_halo"
MAX_FUNCTION_LINES = 60

#: Reads of other libraries' internals in modules that other work owns at the time of writing
#: (issue 29: the model zoo). Each is to move to ``_compat``
#: (``_compat.pyg.explicit_num_nodes``, ``memo.TensorMemo``); the test
#: below fails once an entry is gone, so the list only shrinks.
PENDING = {
    ("data/validation.py", "attribute", "_store"),
    ("models/node_classifier.py", "attribute", "_version"),
}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        yield rel, ast.parse(path.read_text(), filename=rel)


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def function_lengths(folders: tuple[str, ...] = ("layers", "exchange", "planner")) -> dict[str, int]:
    """``module:function`` -> lines from ``def`` to its last line (docstring included), in ``folders``."""
    out = {}
    for rel, tree in _modules():
        if rel.split("/")[0] in folders:
            for fn in _functions(tree):
                out[f"{rel}:{fn.name}:{fn.lineno}"] = fn.end_lineno - fn.lineno + 1  # type: ignore[operator]
    return out


def test_no_function_in_layers_exchange_or_planner_is_longer_than_sixty_lines() -> None:
    lengths = function_lengths()
    assert len(lengths) > 50, "the scan found the functions"
    too_long = {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES}
    assert not too_long, f"split these into smaller functions: {too_long}"


_ATTRIBUTE_FUNCTIONS = ("getattr", "hasattr", "setattr")


#: Public API spelled with an underscore so as not to clash with field names (namedtuple's).
_DOCUMENTED_UNDERSCORE = {"_fields", "_field_defaults", "_asdict", "_replace", "_make"}


def _private(name: str) -> bool:
    dunder = name.startswith("__") and name.endswith("__")
    return name.startswith("_") and not dunder and name not in _DOCUMENTED_UNDERSCORE


def internals_read(tree: ast.AST) -> set[tuple[str, str]]:
    """``("attribute", name)`` for every ``obj._name`` (or ``getattr(obj, "_name")``) whose ``obj`` is not
    ``self``/``cls``/``super()``, and ``("import", module)`` for every import of another package's private
    module or private name."""
    found: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            own = isinstance(owner, ast.Name) and owner.id in ("self", "cls")
            inherited = isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super"
            if not (own or inherited):
                found.add(("attribute", node.attr))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ATTRIBUTE_FUNCTIONS:
            owner, name = (node.args + [None, None])[:2]
            named = isinstance(name, ast.Constant) and isinstance(name.value, str) and _private(name.value)
            if named and not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.add(("attribute", name.value))  # type: ignore[union-attr]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            relative = getattr(node, "level", 0) > 0
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:  # a private module, or a private name of a public one
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names if _private(a.name)]
            for module in names:
                if not relative and not module.startswith("lightning_halo") and any(map(_private, module.split("."))):
                    found.add(("import", module))
    return found


def test_internals_read_finds_what_it_should() -> None:
    source = [
        "import torch._C", "from a._b import c", "x._y", "self._ok", "cls._ok", "super()._ok", "x.__dict__",
        "from ._k import k", "getattr(m, '_z', None)", "getattr(self, '_ok')", "getattr(m, name)",
        "from p.q import _r, s", "from lightning_halo._lazy import x", "point._fields", "hasattr(t, '_fields')",
    ]  # fmt: skip
    found = internals_read(ast.parse("\n".join(source)))
    assert found == {
        ("import", "torch._C"), ("import", "a._b"), ("import", "p.q._r"), ("attribute", "_y"), ("attribute", "_z")
    }


def test_no_module_reads_another_objects_internals_outside_compat() -> None:
    seen = set()
    for rel, tree in _modules():
        if rel.startswith("_compat/"):
            continue
        for what, name in internals_read(tree):
            seen.add((rel, what, name))
    assert seen - PENDING == set(), "read other libraries' internals through lightning_halo._compat (and pin them)"
    assert PENDING - seen == set(), "fixed: remove these entries from PENDING"


def test_every_compat_module_is_listed_and_pinned() -> None:
    from lightning_halo import _compat

    present = {f"lightning_halo._compat.{p.stem}" for p in (PACKAGE / "_compat").glob("*.py") if p.stem != "__init__"}
    assert set(_compat.MODULES) == present
    tests = Path(__file__).resolve().parent / "_compat"
    for module in _compat.MODULES:
        assert (tests / f"test_{module.rsplit('.', 1)[1]}.py").is_file(), f"{module} needs its pinning tests"


def _literal_values(node: ast.AST) -> tuple | None:
    """The values of ``Literal["a", "b"]`` (also inside ``Optional[...]``), else None."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if all(isinstance(e, ast.Constant) for e in elts):
            return tuple(e.value for e in elts)  # type: ignore[attr-defined]
    return None


def hand_written_choices(tree: ast.Module) -> list[str]:
    """Module-level tuples of constants that repeat a ``Literal`` of the same module (use ``get_args``)."""
    literals, tuples = [], {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            value = node.value
            if value is None or not isinstance(target, ast.Name):
                continue
            found = _literal_values(value)
            if found is not None:
                literals.append(set(found))
            elif isinstance(value, ast.Tuple) and value.elts and all(isinstance(e, ast.Constant) for e in value.elts):
                tuples[target.id] = {e.value for e in value.elts}  # type: ignore[attr-defined]
    return [name for name, values in tuples.items() if values in literals]


def test_hand_written_choices_finds_what_it_should() -> None:
    tree = ast.parse('M = Literal["a", "b"]\nMS = ("a", "b")\nOK = get_args(M)\nOTHER = ("a", "c")')
    assert hand_written_choices(tree) == ["MS"]


@pytest.mark.parametrize("rel", [rel for rel, _ in _modules()])
def test_option_tuples_are_derived_from_their_literal(rel: str) -> None:
    tree = ast.parse((PACKAGE / rel).read_text())
    assert hand_written_choices(tree) == [], f"{rel}: derive these from the Literal with typing.get_args"


def _pyg_class_names() -> set[str]:
    import torch_geometric.nn as pyg_nn
    import torch_geometric.nn.norm as pyg_norm

    return {n for n in (*dir(pyg_nn), *pyg_norm.__all__) if n[:1].isupper()} | {"LayerNorm", "BatchNorm"}


def layer_name_lists(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines of tuple/list/set literals (and dict keys) holding two or more of ``names``: hand-written layer lists."""
    exports = {id(a.value) for a in ast.walk(tree) if isinstance(a, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "__all__" for t in a.targets)}  # fmt: skip
    found = []
    for node in ast.walk(tree):
        if id(node) in exports:  # a module's own exports may share a PyG name (models.GCN)
            continue
        elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else node.keys if isinstance(node, ast.Dict) else []
        strings = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if sum(s in names for s in strings) >= 2:
            found.append(node.lineno)
    return found


def test_layer_name_lists_finds_what_it_should() -> None:
    tree = ast.parse('A = ("GraphNorm", "PairNorm")\nB = {"GCNConv": 1, "x": 2, "SAGEConv": 3}\nC = ("GraphNorm", "x")\n'
                     '__all__ = ["GCNConv", "SAGEConv"]')
    assert layer_name_lists(tree, {"GraphNorm", "PairNorm", "GCNConv", "SAGEConv"}) == [1, 2]


def test_layer_lists_live_only_in_the_registry() -> None:
    """The strategy once kept its own list of graph norms beside the registry that docs/layers.md is made from
    (issue 36): every list of PyG layer names is the registry's, and the rest of the package asks it."""
    names = _pyg_class_names()
    offenders = {rel: lines for rel, tree in _modules() if rel != "layers/registry.py"
                 if (lines := layer_name_lists(tree, names))}  # fmt: skip
    assert offenders == {}, "derive these from lightning_halo.layers.registry"


def test_reasons_are_compared_as_members_not_as_text() -> None:
    """call.py once branched on reason strings: rewording one would have changed what the report says."""
    from lightning_halo.layers.reasons import EdgeIndexReason, ReductionReason

    texts = {r.value for r in (*EdgeIndexReason, *ReductionReason)} | {"one process", "not on the fused path"}
    for rel in ("layers/call.py", "layers/reduction.py", "layers/reasons.py", "strategy.py"):
        tree = ast.parse((PACKAGE / rel).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                consts = [c for o in operands for c in ast.walk(o) if isinstance(c, ast.Constant)]
                assert not any(c.value in texts for c in consts), f"{rel}:{node.lineno} compares a reason's text"
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant):
                assert node.value.value not in texts, f"{rel}:{node.lineno} returns a reason as text"
