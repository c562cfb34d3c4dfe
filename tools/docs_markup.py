"""Render our PyG-style docstrings on the mkdocs site: reStructuredText roles to Markdown, TeX to MathML.

Our docstrings follow PyG's conventions (``:class:`~pkg.Name```, ``:math:`x_i```,
``.. math::`` blocks, ```Paper <url>`_``, Google "Args:" sections). mkdocstrings parses the
Google sections but passes the rest through as Markdown, where the roles would show raw.
Two build-time steps, wired in ``mkdocs.yml``:

- :class:`RstRoles`, a griffe extension, rewrites each docstring before it is parsed: roles
  naming Python objects become code spans that link to the API page where the object is
  documented (mkdocs-autorefs, optional: no warning for outside objects), links become
  Markdown links, math becomes ``$...$`` / ``$$...$$`` for pymdownx.arithmatex, and ``::``
  literal blocks become code blocks.
- :func:`on_page_content`, a mkdocs hook, turns arithmatex's TeX spans into MathML
  (latex2mathml), which browsers render natively: no MathJax, nothing fetched by the reader.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(class|func|meth|attr|mod|data|obj|exc|const):`([^`]+)`")
_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_LINK = re.compile(r"`([^`<]+?)\s*<([^>`]+)>`__?")
_PACKAGE = "lightning_halo"


def _object_ref(match: re.Match) -> str:
    target = match.group(2).strip()
    titled = re.fullmatch(r"(.+?)\s*<(.+)>", target)
    if titled:
        title, target = titled.group(1), titled.group(2)
    else:
        title = target.split(".")[-1] if target.startswith("~") else target
    target = target.lstrip("~").removesuffix("()")
    if "." not in target:  # our docstrings name the package's own objects without a module
        target = f"{_PACKAGE}.{target}"
    return f'<autoref identifier="{html.escape(target)}" optional><code>{html.escape(title)}</code></autoref>'


def _math_block(lines: list[str], start: int) -> tuple[list[str], int]:
    """The ``.. math::`` directive at ``lines[start]`` as a ``$$`` block; returns it and the next line."""
    indent = len(lines[start]) - len(lines[start].lstrip())
    body: list[str] = []
    i = start + 1
    while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
        body.append(lines[i].strip())
        i += 1
    while body and not body[-1]:
        body.pop()
    pad = " " * indent
    return ["", f"{pad}$$", *(f"{pad}{line}" for line in body if line), f"{pad}$$", ""], i


def rst_to_markdown(text: str) -> str:
    r"""Convert the reStructuredText markup of a PyG-style docstring to Markdown.

    Example:
        >>> rst_to_markdown("See :class:`~torch_geometric.nn.GCNConv` and :math:`x_i` (`Paper <https://x.org>`_).")
        'See <autoref identifier="torch_geometric.nn.GCNConv" optional><code>GCNConv</code></autoref> and $x_i$ ([Paper](https://x.org)).'
    """
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == ".. math::":
            block, i = _math_block(lines, i)
            out.extend(block)
            continue
        if line.strip() in ("Example:", "Examples:") and i + 1 < len(lines) and lines[i + 1].lstrip().startswith((">>>", "$")):
            # griffe parses doctest code under "Examples:" only; PyG-style docstrings say "Example:"
            line = line.replace("Example:", "Examples:") if line.strip() == "Example:" else line
        elif line.rstrip().endswith("::") and not line.strip().startswith(".."):
            # "text::" introduces an indented literal block; Markdown shows the indented block as code
            line = line.rstrip()[:-1] if line.strip() != "::" else ""
        out.append(line)
        i += 1
    text = "\n".join(out)
    text = _MATH_ROLE.sub(lambda m: f"${m.group(1)}$", text)
    text = _ROLE.sub(_object_ref, text)
    return _LINK.sub(lambda m: f"[{m.group(1).strip()}]({m.group(2).strip()})", text)


class RstRoles(griffe.Extension):
    """Griffe extension: rewrite every docstring with :func:`rst_to_markdown` before it is parsed."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)


_ARITHMATEX = re.compile(r'<(span|div) class="arithmatex">\\[(\[](.*?)\\[)\]]</\1>', re.S)


def tex_to_mathml(page_html: str) -> str:
    r"""Replace pymdownx.arithmatex's generic TeX spans (``\(..\)``, ``\[..\]``) by MathML.

    Example:
        >>> tex_to_mathml('<span class="arithmatex">\\(x_i\\)</span>')[:50]
        '<math xmlns="http://www.w3.org/1998/Math/MathML" d'
    """
    from latex2mathml.converter import convert

    def replace(match: re.Match) -> str:
        display = "block" if match.group(1) == "div" else "inline"
        return convert(html.unescape(match.group(2)).strip(), display=display)

    return _ARITHMATEX.sub(replace, page_html)


def on_page_content(html_text: str, **kwargs: Any) -> str:
    """mkdocs hook: math of every page as MathML."""
    return tex_to_mathml(html_text)
