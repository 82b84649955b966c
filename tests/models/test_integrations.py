"""gated_qwen.models.auto: registration with transformers' Auto classes and PEFT, without importing them early."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import tiny_config

from gated_qwen import Qwen3GatedForCausalLM
from gated_qwen.models.layout import split_query_and_gate


pytestmark = pytest.mark.slow


AUTO_AFTER_IMPORT = """
import json, sys, tempfile
import gated_qwen
lazy = {"torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.for_model("qwen3_gated", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, headwise_attn_output_gate=True)
model = AutoModelForCausalLM.from_config(config)
with tempfile.TemporaryDirectory() as folder:
    model.save_pretrained(folder)
    reloaded = AutoModelForCausalLM.from_pretrained(folder)
print(json.dumps({"lazy": lazy, "class": type(reloaded).__name__}))
"""


def run_python(code: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_import_gated_qwen_then_auto_classes():
    report = run_python(AUTO_AFTER_IMPORT)
    assert report == {"lazy": {"torch": False, "transformers": False}, "class": "Qwen3GatedForCausalLM"}


MODELING_MODULE_ALONE = """
import json
import {module}
from transformers import AutoConfig, AutoModelForCausalLM
print(json.dumps({{t: AutoModelForCausalLM._model_mapping[type(AutoConfig.for_model(t))].__name__
                  for t in ("qwen3_gated", "qwen3_moe_gated")}}))
"""


@pytest.mark.parametrize("module", ["qwen3_gated.modeling_qwen3_gated", "qwen3_moe_gated.modeling_qwen3_moe_gated"])
def test_importing_a_modeling_module_alone_registers_every_family(module):
    report = run_python(MODELING_MODULE_ALONE.format(module=f"gated_qwen.models.{module}"))
    assert report == {"qwen3_gated": "Qwen3GatedForCausalLM", "qwen3_moe_gated": "Qwen3MoeGatedForCausalLM"}


def test_the_modeling_modules_do_not_import_the_registration():
    """No cycle: models.auto imports the modeling modules (to register them), never the other way round."""
    from pathlib import Path

    models = Path(__file__).resolve().parents[2] / "gated_qwen" / "models"
    for path in models.rglob("modeling_*.py"):
        source = path.read_text()
        assert "from ..auto import" not in source and "models.auto" not in source, path


@pytest.fixture
def peft():
    return pytest.importorskip("peft")


def test_lora_defaults_work_and_adapt_the_gate_rows(peft):
    from peft import LoraConfig, get_peft_model

    model = Qwen3GatedForCausalLM(tiny_config(gate="headwise"))  # H=4, K=2, D=8: q_proj has 4*8 + 4 rows
    lora = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=4))  # no target_modules: PEFT's defaults
    targeted = {name.rsplit(".", 1)[-1] for name, module in lora.named_modules() if hasattr(module, "lora_A")}
    assert targeted == {"q_proj", "v_proj"}
    q_proj = lora.base_model.model.model.layers[0].self_attn.q_proj
    assert q_proj.lora_B["default"].weight.shape == (36, 4)  # the adapter's output spans the gate rows too
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(0))
    lora(input_ids=ids, labels=ids).loss.backward()
    _, gate_grad = split_query_and_gate(q_proj.lora_B["default"].weight.grad, 2, 8, 1, dim=0)
    assert gate_grad.abs().sum() > 0  # training the adapter trains the gate logits


def test_peft_imported_before_gated_qwen_gets_the_defaults_too(peft):
    report = run_python(
        "import json, peft.utils.constants as c, gated_qwen\n"
        "print(json.dumps(c.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING['qwen3_gated']))"
    )
    assert report == ["q_proj", "v_proj"]
