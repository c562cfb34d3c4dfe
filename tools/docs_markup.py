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

import ast
import html
import re
from typing import Any, Optional

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


_ENTRY = re.compile(r"^\s+\**(\w+)(?: \([^)]*\))?:(?:\s|$)")  # a Google "Args:" entry: name (type): text
_STATED_DEFAULT = re.compile(r"(\s*)\(default:\s*((?:``[^`]*``|[^)`])*)\)")
_LEADING_VALUE = re.compile(r"``([^`]*)``\s*(?:[,;]\s*(.*))?$", re.S)


def _same_value(stated: str, signature: str) -> bool:
    if stated.replace("'", '"') == signature.replace("'", '"'):
        return True
    try:
        return bool(ast.literal_eval(stated) == ast.literal_eval(signature))
    except (ValueError, SyntaxError):
        return False


def _restated(match: re.Match, signature: str) -> str:
    space, stated = match.group(1), match.group(2).strip()
    lead = _LEADING_VALUE.match(stated)
    if lead and _same_value(lead.group(1), signature):
        return f"{space}(``{lead.group(1)}``: {lead.group(2)})" if lead.group(2) else ""
    if signature == "None":  # the signature's None stands for what the docstring says
        return f"{space}(``None``: {stated})"
    return match.group(0)


def drop_repeated_defaults(text: str, defaults: dict[str, str]) -> str:
    r"""Remove ``(default: ``x``)`` from an Args entry when ``x`` is the signature's default.

    The API page lists each parameter as ``name (type, default: x)`` from the signature; the
    PyG-style docstring says it again at the end of the description. A stated default that
    differs from a signature's ``None`` says what ``None`` stands for, and stays as that:
    ``(default: ``bits``)`` becomes ``(``None``: ``bits``)``; an explanation after the repeated
    value stays too: ``(default: ``None``, never)`` becomes ``(``None``: never)``.

    Example:
        >>> drop_repeated_defaults("Args:\n    bits (int): bits. (default: ``1``)\n    grad_bits (int): (default: ``bits``)",
        ...                        {"bits": "1", "grad_bits": "None"})
        'Args:\n    bits (int): bits.\n    grad_bits (int): (``None``: ``bits``)'
        >>> drop_repeated_defaults("Args:\n    k (int): k. (default: ``None``, never)", {"k": "None"})
        'Args:\n    k (int): k. (``None``: never)'
    """
    lines = text.split("\n")
    blocks: list[tuple[Optional[str], list[str]]] = [(None, [])]
    for line in lines:
        entry = _ENTRY.match(line)
        if entry and entry.group(1) in defaults:
            blocks.append((entry.group(1), [line]))
        else:
            if blocks[-1][0] is not None and line.strip() and not line.startswith(" "):
                blocks.append((None, []))  # a new section ends the entry
            blocks[-1][1].append(line)

    def keep(block: tuple[Optional[str], list[str]]) -> str:
        name, body = block
        joined = "\n".join(body)
        if name is None:
            return joined
        return _STATED_DEFAULT.sub(lambda m: _restated(m, defaults[name]), joined)

    return "\n".join(keep(b) for b in blocks if b[1] or b[0] is not None)


def _signature_defaults(obj: griffe.Object) -> dict[str, str]:
    function = obj.all_members.get("__init__") if obj.is_class else obj  # inherited too (the zoo models)
    if function is None or not getattr(function, "is_function", False):
        return {}
    return {p.name: str(p.default) for p in function.parameters if p.default is not None}


class RstRoles(griffe.Extension):
    """Griffe extension: rewrite every docstring with :func:`rst_to_markdown` before it is parsed.

    Defaults the docstring repeats from the signature are dropped (:func:`drop_repeated_defaults`):
    the page shows each parameter's default from the signature already.
    """

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = drop_repeated_defaults(obj.docstring.value, _signature_defaults(obj))
            obj.docstring.value = rst_to_markdown(text)


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
