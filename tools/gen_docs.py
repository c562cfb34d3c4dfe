"""Regenerate the generated sections of docs/ from the code and the tests' own cases.

    python tools/gen_docs.py          # rewrite
    python tools/gen_docs.py --check  # exit 1 if a page is out of date (run by the tests)

Generated sections sit between ``<!-- BEGIN GENERATED: name -->`` and ``<!-- END GENERATED: name -->``:
tables built from the code and the tests' own cases, and the output of the ``lightning-halo``
commands written in the page.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.launch import run_forked  # noqa: E402  (the repository root is on the path now)
#: The kernel rates `lightning-halo plan` examples use (this repository's calibration, not the
#: machine's that regenerates the page), so that the pages are the same everywhere.
RATES = ROOT / "benchmarks" / "results" / "calibration.json"
#: What the ``lightning-halo`` commands import, once for all of them (:func:`benchmarks.launch.run_forked`).
PRELOAD = ("torch", "lightning", "torch_geometric", "lightning_halo.cli", "lightning_halo.planner", "jsonargparse")

def layers_table() -> str:
    from lightning_halo.layers.registry import layer_table

    lines = ["| layer | on a partition | fused sparse aggregation (and halo partial sums) |", "|---|---|---|"]
    lines += [f"| `{name}` | {how} | {fused} |" for name, how, fused in layer_table()]
    return "\n".join(lines)


def graph_norms_table() -> str:
    from lightning_halo.layers.registry import graph_norm_table

    lines = ["| PyG norm | why a partition's rows alone would differ | on partitions |", "|---|---|---|"]
    lines += [f"| `{name}` | {why} | {handling} |" for name, why, handling in graph_norm_table()]
    return "\n".join(lines)


def modes_table() -> str:
    from lightning_halo.exchange.policy import MODE_TABLE

    lines = ["| mode | forward uses | backward applies | traffic | exactness | follows |", "|---|---|---|---|---|---|"]
    for row in MODE_TABLE:
        name = f"`{row.mode}`" + (f", `{row.option}`" if row.option else "")
        lines.append(f"| {name} | {row.forward} | {row.backward} | {row.traffic} | {row.exactness} | {row.method} |")
    return "\n".join(lines)


def errors_table() -> str:
    from tests.support.error_cases import all_cases

    lines = ["| # | bad input | error | message (excerpt) |", "|---|---|---|---|"]
    for i, (case, err, msg) in enumerate(all_cases(), 1):
        msg = msg.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {i} | {case} | `{err}` | {msg} |")
    return "\n".join(lines)


def console(old: str) -> str:
    """Re-run every ``$ lightning-halo ...`` line of a console block and put its real output under it.

    The commands live in the page (edit them there); what they print is generated, so the page
    shows what the installed command prints today. Runs in a fresh cache and working directory,
    80 columns wide; the temporary cache path is shown as the default one.
    """
    commands = [line[2:] for line in old.splitlines() if line.startswith("$ lightning-halo")]
    if not commands:
        raise SystemExit("a console section needs at least one '$ lightning-halo ...' line")
    out = ["```console"]
    with tempfile.TemporaryDirectory(prefix="gen-docs-") as tmp:
        env = dict(os.environ, LIGHTNING_HALO_CACHE=str(Path(tmp) / "cache"), COLUMNS="80", OMP_NUM_THREADS="1",
                   PYTHONPATH=str(ROOT), LIGHTNING_HALO_RATES=str(RATES))  # fmt: skip
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_NTASKS"):
            env.pop(key, None)
        for command in commands:
            args = shlex.split(command)[1:]
            # forked from one preloaded server: each command prints what a fresh interpreter would,
            # without paying its imports again (a fresh one each: LIGHTNING_HALO_FRESH_WORKERS=1)
            run = run_forked(["-m", "lightning_halo.cli", *args], env, Path(tmp), PRELOAD, timeout=600)
            if run.returncode != 0:
                raise SystemExit(f"'{command}' failed:\n{run.stdout}{run.stderr}")
            text = (run.stdout + run.stderr).replace(str(Path(tmp) / "cache"), "~/.cache/lightning_halo")
            out += [*([""] if len(out) > 1 else []), f"$ {command}", *(line.rstrip() for line in text.rstrip().splitlines())]
    return "\n".join([*out, "```"])


SECTIONS: dict[str, tuple[str, Callable[[str], str]]] = {
    "layers": ("docs/layers.md", lambda old: layers_table()),
    "graph-norms": ("docs/layers.md", lambda old: graph_norms_table()),
    "errors": ("docs/errors.md", lambda old: errors_table()),
    "modes": ("docs/modes.md", lambda old: modes_table()),
    "cli-help": ("docs/cli.md", console),
    "cli-partition": ("docs/cli.md", console),
    "cli-plan": ("docs/cli.md", console),
    "plan-papers100m": ("docs/large-graphs.md", console),
}


def section(text: str, name: str) -> re.Match:
    match = re.search(rf"(<!-- BEGIN GENERATED: {name} -->\n)(.*?)(<!-- END GENERATED: {name} -->)", text, re.S)
    if match is None:
        raise SystemExit(f"no generated section {name!r}")
    return match


def render(text: str, name: str, body: str) -> str:
    match = section(text, name)
    return text[: match.start(2)] + body + "\n" + text[match.end(2) :]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    stale = []
    for name, (path, make) in SECTIONS.items():
        file = ROOT / path
        old = file.read_text()
        new = render(old, name, make(section(old, name).group(2)))
        if new != old:
            stale.append(f"{path} ({name})")
            if not args.check:
                file.write_text(new)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run python tools/gen_docs.py")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
