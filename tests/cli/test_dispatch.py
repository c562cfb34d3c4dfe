"""``lightning-halo``'s dispatcher: the verb table, a ``--help`` that imports no verb, exit statuses.

The dispatcher (:mod:`lightning_halo.cli.dispatch`) is argparse only: it names each verb's
``module:main`` and imports that module when the verb runs. No verb imports the dispatcher.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.noise import noise_lines

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "lightning_halo" / "cli"

# Run in a fresh interpreter: first the dispatcher's file alone (nothing of lightning_halo, torch or
# Lightning can come with it), then the console script's import path.
_HELP_PROBE = """
import importlib.util, io, contextlib, sys
spec = importlib.util.spec_from_file_location("standalone_dispatch", "lightning_halo/cli/dispatch.py")
alone = importlib.util.module_from_spec(spec)
spec.loader.exec_module(alone)
with contextlib.redirect_stdout(io.StringIO()) as text:
    try:
        alone.main(["--help"])
    except SystemExit as e:
        print("standalone exit", e.code, file=sys.stderr)
print("standalone imports:", sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "lightning", "lightning_halo")))
print("standalone help:", " ".join(text.getvalue().split()))
from lightning_halo.cli import main
try:
    main(["--help"])
except SystemExit as e:
    code = e.code
heavy = ("torch", "lightning", "pytorch_lightning", "torch_geometric", "numba", "jsonargparse")
own = ("lightning_halo.strategy", "lightning_halo.quant", "lightning_halo.exchange", "lightning_halo.data",
       "lightning_halo.cli.")
print("exit", code, "heavy", sorted(m for m in sys.modules if (m.split(".")[0] in heavy or m.startswith(own))
                                    and m not in ("lightning_halo.cli.dispatch", "lightning_halo.cli.status")))
"""


def test_top_level_help_lists_every_verb_and_imports_no_verb() -> None:
    """``lightning-halo --help``: the dispatcher alone imports nothing of torch or Lightning; through the console
    script's path (the package itself first), nothing of a verb, torch, Lightning, jsonargparse or PyG is imported:
    the package registers its strategy names once Lightning's strategies are imported, not before."""
    from lightning.pytorch.cli import LightningCLI

    run = subprocess.run([sys.executable, "-c", _HELP_PROBE], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert "standalone exit 0" in run.stderr, run.stderr
    assert lines[0] == "standalone imports: []"
    assert lines[-1] == "exit 0 heavy []"
    listed = re.search(r"\{([a-z,]+)\}", lines[1]).group(1).split(",")
    assert listed == [*LightningCLI.subcommands(), "partition", "verify", "plan", "link"]
    assert noise_lines(run.stdout + run.stderr) == []


def test_the_table_names_one_module_per_verb_and_its_main() -> None:
    from lightning_halo.cli.dispatch import VERBS

    for verb, (target, text) in VERBS.items():
        module, _, function = target.partition(":")
        assert module.startswith("lightning_halo.cli.") and function == "main", target
        assert callable(getattr(importlib.import_module(module), function)), target
        assert text.endswith(".") and "\n" not in text, verb
    modules = {target.partition(":")[0] for target, _ in VERBS.values()}
    assert modules == {f"lightning_halo.cli.{name}" for name in ("fit", "partition", "verify", "plan", "link")}


def test_the_lightning_verbs_are_lightnings_own_and_say_what_its_trainer_says() -> None:
    """The table holds the help of fit/validate/test/predict (no Lightning import for ``--help``): it must stay
    the first sentence of the Trainer's method of that name, and the verbs LightningCLI's."""
    import lightning.pytorch as pl
    from lightning.pytorch.cli import LightningCLI

    from lightning_halo.cli.dispatch import VERBS

    for verb in LightningCLI.subcommands():
        first_paragraph = " ".join((inspect.getdoc(getattr(pl.Trainer, verb)) or "").split("\n\n")[0].split())
        assert VERBS[verb][1] == first_paragraph.split(". ")[0].rstrip(".") + "."
        assert VERBS[verb][0] == "lightning_halo.cli.fit:main"


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_no_verb_imports_the_dispatcher_or_the_package() -> None:
    """The cycle cli <-> cli_verify/cli_link is gone: verbs import the helpers' own modules, never the
    dispatcher nor ``lightning_halo.cli`` itself; the dispatcher imports no module of the package."""
    modules = {p.stem: _imports(p) for p in CLI.glob("*.py")}
    assert {"dispatch", "status", "lightning_cli", "fit", "partition", "verify", "plan", "link"} <= set(modules)
    for name, imported in modules.items():
        if name in ("__init__", "__main__"):
            continue
        assert not imported & {"lightning_halo.cli", "lightning_halo.cli.dispatch"}, name
    assert {m for m in modules["dispatch"] | modules["status"] if m.split(".")[0] in ("lightning", "torch")} == set()
    assert {m for m in modules["dispatch"] if m.startswith("lightning_halo")} == {"lightning_halo.cli.status"}


def test_public_names_keep_their_import_path() -> None:
    from lightning_halo.cli import CommandError, HaloCLI, checkpoint_for, library_error, main, top_level_parser
    from lightning_halo.cli.lightning_cli import HaloCLI as Own

    assert HaloCLI is Own and callable(main) and callable(top_level_parser)
    assert checkpoint_for("test", "untrained") is None and library_error(ValueError("x")) is None
    assert issubclass(CommandError, Exception)
    from lightning_halo.cli import HaloLinkCLI

    assert issubclass(HaloLinkCLI, HaloCLI)


def test_num_features_is_defined_once() -> None:
    """The data module's sizes reach the model through one function (there were two ``_num_features``)."""
    found = []
    for path in (ROOT / "lightning_halo").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.lstrip("_") == "num_features":
                found.append(path.relative_to(ROOT).as_posix())
    assert found == ["lightning_halo/cli/lightning_cli.py"], found
