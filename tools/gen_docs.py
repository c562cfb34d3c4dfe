"""Regenerate the generated sections of docs/ from the code and the tests' own cases.

    python tools/gen_docs.py          # rewrite
    python tools/gen_docs.py --check  # exit 1 if a page is out of date (run by the tests)

Generated sections sit between ``<!-- BEGIN GENERATED: name -->`` and ``<!-- END GENERATED: name -->``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

def layers_table() -> str:
    from lightning_halo.layers.registry import layer_table

    lines = ["| layer | on a partition | fused sparse aggregation |", "|---|---|---|"]
    lines += [f"| `{name}` | {how} | {fused} |" for name, how, fused in layer_table()]
    return "\n".join(lines)


def errors_table() -> str:
    from tests.support.error_cases import all_cases

    lines = ["| # | bad input | error | message (excerpt) |", "|---|---|---|---|"]
    for i, (case, err, msg) in enumerate(all_cases(), 1):
        msg = msg.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {i} | {case} | `{err}` | {msg} |")
    return "\n".join(lines)


SECTIONS: dict[str, tuple[str, Callable[[], str]]] = {
    "layers": ("docs/layers.md", layers_table),
    "errors": ("docs/errors.md", errors_table),
}


def render(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- BEGIN GENERATED: {name} -->\n).*?(<!-- END GENERATED: {name} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"no generated section {name!r}")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for name, (path, make) in SECTIONS.items():
        file = ROOT / path
        old = file.read_text()
        new = render(old, name, make())
        if new != old:
            stale.append(path)
            if not args.check:
                file.write_text(new)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run python tools/gen_docs.py")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
