"""Strict loading lives in the I/O layer (gated_qwen.checkpoint.loading) and reaches every model class.

The modeling module computes only; ``import gated_qwen`` puts the strict ``from_pretrained`` on each model
family's base class as its modeling module loads (``STRICT_LOADING``). These tests pin that wiring: the
rules themselves are tested through ``from_pretrained`` in tests/models/test_modeling_qwen3_gated.py.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import write_released_checkpoint
from transformers import Qwen3ForCausalLM, Qwen3PreTrainedModel

import gated_qwen
from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM
from gated_qwen.checkpoint.loading import install_strict_loading
from gated_qwen.errors import CheckpointError


REPO = Path(__file__).resolve().parents[2]
MODELING = REPO / "gated_qwen" / "models" / "qwen3_gated" / "modeling_qwen3_gated.py"


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, relative imports resolved against its package."""
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)  # `from . import checkpoint`
    return names


def test_the_modeling_module_imports_no_checkpoint_code():
    imported = imported_modules(MODELING)
    assert "gated_qwen.models.layout" in imported  # the resolution above works: it sees the module's own imports
    io_layer = ("gated_qwen.checkpoint", "gated_qwen.errors", "gated_qwen.transforms", "gated_qwen.tools")
    assert not [name for name in imported if name.startswith(io_layer)], imported


def test_every_model_family_listed_gets_the_strict_loader():
    from importlib import import_module

    assert gated_qwen.STRICT_LOADING  # an empty table would make the loop below vacuous
    for module_name, class_name in gated_qwen.STRICT_LOADING.items():
        model_class = getattr(import_module(module_name), class_name)
        assert model_class.from_pretrained.__func__._gated_qwen_strict_loading
        assert model_class.from_pretrained.__module__ == "gated_qwen.checkpoint.loading"


def edited(folder: Path, **changes) -> Path:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# transformers imported (and the model reached through the Auto classes) before gated_qwen: the post-import
# hook on transformers imports the modeling module from inside `import gated_qwen`, which must still leave
# the class strict.
AUTO_FIRST = """
import sys, transformers
from transformers import AutoModelForCausalLM
import gated_qwen
from gated_qwen.errors import CheckpointError
try:
    AutoModelForCausalLM.from_pretrained(sys.argv[1])
except CheckpointError as error:
    print("refused:", error)
else:
    print("loaded")
"""


@pytest.mark.slow
def test_the_strict_loader_is_installed_when_transformers_was_imported_first(tmp_path):
    write_released_checkpoint(tmp_path, gate="headwise")
    edited(tmp_path, model_type="qwen3_gated", headwise_attn_output_gate=False, elementwise_attn_output_gate=True)
    result = subprocess.run(
        [sys.executable, "-c", AUTO_FIRST, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "refused:" in result.stdout and "'headwise' gate" in result.stdout, result.stdout


class FamilyPreTrainedModel(Qwen3PreTrainedModel):
    """A stand-in for another model family (built from transformers' Qwen3 classes, no gate)."""

    config_class = Qwen3GatedConfig


class FamilyForCausalLM(FamilyPreTrainedModel, Qwen3ForCausalLM):
    pass


def test_one_call_gives_another_family_the_same_strict_loader(tmp_path):
    write_released_checkpoint(tmp_path, gate="none")
    tensors = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    del tensors["model.layers.1.mlp.down_proj.weight"]
    torch.save(tensors, tmp_path / "pytorch_model.bin")
    # Without the strict loader, transformers initialises the missing weight and reports it.
    _, info = FamilyForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert set(info["missing_keys"]) == {"model.layers.1.mlp.down_proj.weight"}
    install_strict_loading(FamilyPreTrainedModel)
    install_strict_loading(FamilyPreTrainedModel)  # a second call changes nothing (no loader wrapped twice)
    with pytest.raises(CheckpointError, match=r"lacks weights the model needs: model\.layers\.1\.mlp\.down_proj"):
        FamilyForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="trust_remote_code is not needed for Family and is refused"):
        FamilyForCausalLM.from_pretrained(tmp_path, trust_remote_code=True)
    model, info = FamilyForCausalLM.from_pretrained(tmp_path, strict=False, output_loading_info=True)
    assert type(model) is FamilyForCausalLM and set(info["missing_keys"]) == {"model.layers.1.mlp.down_proj.weight"}


def test_the_strict_loader_keeps_its_keyword_and_documentation():
    import inspect

    parameters = inspect.signature(Qwen3GatedForCausalLM.from_pretrained).parameters
    assert parameters["strict"].default is True and parameters["strict"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "strict=False" in Qwen3GatedForCausalLM.from_pretrained.__doc__
