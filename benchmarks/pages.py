"""The generated sections of the docs pages that the benchmarks' ``report`` commands rewrite.

A section sits between ``<!-- BEGIN GENERATED: name -->`` and ``<!-- END GENERATED: name -->``
(the same markers ``tools/gen_docs.py`` rewrites for the sections built from the code).
"""

from __future__ import annotations

import re
from pathlib import Path


def write_section(page: Path, name: str, body: str) -> None:
    """Replace the generated section ``name`` of ``page`` with ``body`` (a newline is added if missing).

    Example:
        >>> write_section(Path("docs/benchmarks.md"), "reduction", "| a | b |\\n")  # doctest: +SKIP
    """
    text = Path(page).read_text()
    pattern = re.compile(rf"(<!-- BEGIN GENERATED: {re.escape(name)} -->\n).*?(<!-- END GENERATED: {re.escape(name)} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{page} has no GENERATED: {name} markers; add them where the section belongs")
    body = body if body.endswith("\n") else body + "\n"
    Path(page).write_text(pattern.sub(lambda m: m.group(1) + body + m.group(2), text))


def section_body(page: Path, name: str) -> str:
    """The text of the generated section ``name`` of ``page`` (between its markers).

    Example:
        >>> section_body(Path("docs/benchmarks.md"), "summary")  # doctest: +SKIP
        '| target | Tolokers | cornell5 | met? |\\n...'
    """
    text = Path(page).read_text()
    match = re.search(rf"<!-- BEGIN GENERATED: {re.escape(name)} -->\n(.*?)<!-- END GENERATED: {re.escape(name)} -->", text, re.S)
    if match is None:
        raise SystemExit(f"{page} has no GENERATED: {name} markers; add them where the section belongs")
    return match.group(1)
