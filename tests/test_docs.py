"""The docs name only what exists: every dotted ``gated_qwen...`` name in README.md and docs/ resolves.

A name resolves when its longest prefix that is a module imports (or, for a module that needs an optional
library not installed here, such as vLLM, is found) and the rest are attributes of it, one after the other.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DOTTED = re.compile(r"(?<![\w./-])gated_qwen(?:\.[A-Za-z_]\w*)+")
FROM_IMPORT = re.compile(r"from (gated_qwen[\w.]*) import (\([^)]*\)|[^\n;`]*)")
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def dotted_names(text: str) -> set[str]:
    """The dotted names ``gated_qwen.x.y`` in ``text`` (a path ``gated_qwen/x.py`` is not one), and for each
    ``from gated_qwen.x import a, b`` the names ``gated_qwen.x.a`` and ``gated_qwen.x.b``.

    >>> sorted(dotted_names("`gated_qwen.tools.generation.generate`, gated_qwen/cli/bench.py, gated_qwen"))
    ['gated_qwen.tools.generation.generate']
    >>> sorted(dotted_names("from gated_qwen.errors import (\\n    CheckpointError,\\n    GatedQwenError as E,\\n)"))
    ['gated_qwen.errors', 'gated_qwen.errors.CheckpointError', 'gated_qwen.errors.GatedQwenError']
    """
    names = {match.group().rstrip(".") for match in DOTTED.finditer(text)}
    for match in FROM_IMPORT.finditer(text):
        imported = match.group(2).strip("()").split("#")[0]
        for alias in imported.split(","):
            if alias.split() and IDENTIFIER.fullmatch(alias.split()[0]):  # not prose: "import ..."
                names.add(f"{match.group(1)}.{alias.split()[0]}")
    return names


def _module_prefix(name: str) -> tuple[str, list[str]]:
    """The longest prefix of ``name`` that is a module, and the attribute names after it."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        module = ".".join(parts[:end])
        try:
            if importlib.util.find_spec(module) is not None:
                return module, parts[end:]
        except ModuleNotFoundError:  # a parent that is not a package
            continue
    raise AssertionError(f"{name}: no module of it exists")


def _defined_in_source(module: str, attributes: list[str]) -> bool:
    """Whether the source of ``module`` defines ``attributes`` (a top-level name, then names in its class body)."""
    body = ast.parse(Path(importlib.util.find_spec(module).origin).read_text()).body
    for attribute in attributes:
        found = None
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == attribute:
                found = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == attribute for t in targets):
                    found = node
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                if any((alias.asname or alias.name) == attribute for alias in node.names):
                    found = node
        if found is None:
            return False
        body = getattr(found, "body", [])
    return True


def resolves(name: str) -> bool:
    module, attributes = _module_prefix(name)
    try:
        value = importlib.import_module(module)
    except ImportError as error:  # an optional library (vLLM) missing here: read the module's source instead
        if error.name and error.name.split(".")[0] == "gated_qwen":
            raise
        return _defined_in_source(module, attributes)
    for attribute in attributes:
        if not hasattr(value, attribute):
            return False
        value = getattr(value, attribute)
    return True


NAMES = sorted(
    {(name, page.relative_to(ROOT).as_posix()) for page in PAGES for name in dotted_names(page.read_text())}
)


def test_the_docs_name_dotted_names():
    assert len(NAMES) > 20  # the pattern finds the names the pages hold


@pytest.mark.parametrize("name, page", NAMES, ids=[f"{page}:{name}" for name, page in NAMES])
def test_every_dotted_name_in_the_docs_resolves(name, page):
    assert resolves(name), f"{page} names {name}, which does not exist"


def test_a_missing_name_does_not_resolve():
    assert resolves("gated_qwen.tools.generation") and resolves("gated_qwen.errors.GatedQwenError")
    assert not resolves("gated_qwen.errors.NoSuchError")
    with pytest.raises(AssertionError, match="no module"):
        resolves("gated_qwen_missing.x")
