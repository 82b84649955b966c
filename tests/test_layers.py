"""Imports run one way through the package's layers: cli -> tools -> serving/transforms -> checkpoint -> models.

Read from the source (every ``import`` and ``from ... import``, at module level or inside functions), so
a lazy import that goes the wrong way fails too. ``errors`` and ``utils`` are below every layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest


PACKAGE = Path(__file__).resolve().parents[1] / "gated_qwen"

# layer -> the layers it may import (besides itself and the foundation)
FOUNDATION = {"errors", "utils", "default_models", "configs"}
ALLOWED = {
    "models": set(),
    "checkpoint": {"models"},
    "transforms": {"checkpoint", "models"},
    "serving": {"checkpoint", "models"},
    "tools": {"transforms", "checkpoint", "models"},
    "cli": {"tools", "serving", "transforms", "checkpoint", "models"},
    "utils": set(),
}


def imported_layers(path: Path) -> set[str]:
    """The gated_qwen sub-packages (first component after ``gated_qwen``) that the file at ``path`` imports."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module.split(".")[:-1] if path.name != "__init__.py" else module.split(".")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] + (
                [f"{target}.{alias.name}" for alias in node.names] if not node.module or node.level else []
            )
        for name in names:
            parts = name.split(".")
            if parts[0] == "gated_qwen" and len(parts) > 1 and parts[1] != "__version__":
                found.add(parts[1])  # a legacy alias (gated_qwen.analysis) counts as a layer of its own: refused
    return found


LAYER_FILES = [(layer, path) for layer in ALLOWED for path in sorted((PACKAGE / layer).rglob("*.py"))]


@pytest.mark.parametrize("layer, path", LAYER_FILES, ids=[str(p.relative_to(PACKAGE)) for _, p in LAYER_FILES])
def test_imports_run_down_the_layers(layer, path):
    wrong = imported_layers(path) - ALLOWED[layer] - FOUNDATION - {layer}
    assert not wrong, f"{path.relative_to(PACKAGE)} ({layer}) imports {sorted(wrong)}"


def test_the_model_files_import_no_io():
    for path in (PACKAGE / "models").rglob("modeling_*.py"):
        assert imported_layers(path) <= {"models", "errors", "utils"}, path


def test_the_check_sees_a_wrong_way_import(tmp_path, monkeypatch):
    """The parser resolves relative imports: a model file importing the checkpoint layer is caught."""
    fake = PACKAGE / "models" / "qwen3_gated" / "modeling_qwen3_gated.py"
    source = tmp_path / "gated_qwen" / "models" / "qwen3_gated"
    source.mkdir(parents=True)
    (source / fake.name).write_text("from ...checkpoint import read_json\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path / "gated_qwen")
    assert imported_layers(source / fake.name) == {"checkpoint"}
