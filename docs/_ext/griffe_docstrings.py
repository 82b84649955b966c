"""A griffe extension (mkdocs.yml, mkdocstrings' ``extensions``): the package's docstrings as Markdown.

The docstrings are written for Sphinx and doctest; mkdocstrings renders their prose as Markdown. Before
it does, this rewrites, in each docstring:

* doctest examples (``>>>`` lines, their ``...`` continuations and expected output) into fenced
  ``pycon`` code blocks, which Markdown would otherwise run together into a paragraph or a blockquote;
* Sphinx roles (``:func:`~gated_qwen.x.f```) into code spans (`` `f` ``), as Sphinx would print them;
* a paragraph ending in ``::`` before an indented literal block into one ending in ``:`` (the block
  itself is already a Markdown code block).

It changes nothing in the package: only what the documentation shows.
"""

from __future__ import annotations

import re

import griffe


ROLE = re.compile(r":(?:py:)?(?:func|meth|class|mod|attr|data|exc|obj|const|ref):`(~?)([^`]+)`")


def _role(match: re.Match) -> str:
    short, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


def fence_doctests(text: str) -> str:
    """Wrap each run of doctest lines (prompt, continuation, expected output) in a ``pycon`` fence."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        match = re.match(r"(\s*)>>>( |$)", lines[i])
        if not match:
            out.append(lines[i])
            i += 1
            continue
        indent = match.group(1)
        block = []
        while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
            block.append(lines[i][len(indent) :])
            i += 1
        if out and out[-1].strip():
            out.append("")
        out += [f"{indent}```pycon", *(f"{indent}{line}" for line in block), f"{indent}```"]
        if i < len(lines) and lines[i].strip():
            out.append("")
    return "\n".join(out)


def to_markdown(text: str) -> str:
    text = ROLE.sub(_role, text)
    text = re.sub(r"::\n(\n[ \t]+\S)", r":\n\1", text)
    return fence_doctests(text)


class SphinxDocstringsAsMarkdown(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
