"""Quantized checkpoints (transformers' TorchAoConfig) load back under strict loading, and a config that does
not describe their weights is still refused."""

from __future__ import annotations

import json

import pytest
import torch

from gated_qwen import Qwen3GatedForCausalLM
from gated_qwen.errors import WeightShapeMismatchError
from tests.conftest import tiny_config


torchao = pytest.importorskip("torchao")
from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, IntxWeightOnlyConfig  # noqa: E402
from torchao.quantization.granularity import PerGroup  # noqa: E402
from transformers import TorchAoConfig  # noqa: E402


TOKENS = torch.arange(12).unsqueeze(0)
# Linear dims torchao's int8 and group-32 int4 accept: multiples of 32.
SIZES = {"hidden_size": 64, "head_dim": 16, "num_attention_heads": 4, "vocab_size": 128}
QUANTIZERS = {
    "int8": (Int8WeightOnlyConfig, 0.05),
    "int4": (lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)), 0.5),
}


def _quantize(tmp_path, gate, quant_type):
    torch.manual_seed(0)
    model = Qwen3GatedForCausalLM(tiny_config(gate=gate, **SIZES)).eval()
    model.save_pretrained(tmp_path / "float")
    quantized = Qwen3GatedForCausalLM.from_pretrained(
        tmp_path / "float", quantization_config=TorchAoConfig(quant_type)
    ).eval()
    quantized.save_pretrained(tmp_path / "quantized")
    return model, quantized, tmp_path / "quantized"


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
@pytest.mark.parametrize("quant", sorted(QUANTIZERS))
def test_quantized_checkpoint_loads_back(tmp_path, gate, quant):
    make, tolerance = QUANTIZERS[quant]
    model, quantized, folder = _quantize(tmp_path, gate, make())
    keys = json.loads((folder / "config.json").read_text())
    assert "quantization_config" in keys
    reloaded = Qwen3GatedForCausalLM.from_pretrained(folder)
    assert type(reloaded.model.layers[0].self_attn.q_proj.weight) is type(
        quantized.model.layers[0].self_attn.q_proj.weight
    )
    with torch.no_grad():
        fp32, in_memory, loaded = (m(TOKENS).logits for m in (model, quantized, reloaded))
    torch.testing.assert_close(loaded, in_memory, rtol=0, atol=0)
    assert (loaded - fp32).abs().max() < tolerance


@pytest.mark.parametrize("quant", sorted(QUANTIZERS))
def test_quantized_checkpoint_with_wrong_gate_type_is_refused(tmp_path, quant):
    _, _, folder = _quantize(tmp_path, "headwise", QUANTIZERS[quant][0]())
    config = json.loads((folder / "config.json").read_text())
    config.update(headwise_attn_output_gate=False, elementwise_attn_output_gate=True)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightShapeMismatchError, match=r"q_proj\.weight has shape \(68, 64\).*'headwise' gate"):
        Qwen3GatedForCausalLM.from_pretrained(folder)


def test_quantized_weights_without_quantization_config_are_refused(tmp_path):
    # The config must describe the weights: torchao's parts without its quantization_config are not weights.
    _, _, folder = _quantize(tmp_path, "headwise", Int8WeightOnlyConfig())
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightShapeMismatchError, match="lacks weights the model needs"):
        Qwen3GatedForCausalLM.from_pretrained(folder)


def test_int4_weight_only_where_it_runs(tmp_path):
    try:
        model, quantized, folder = _quantize(tmp_path, "headwise", Int4WeightOnlyConfig(group_size=32))
    except (RuntimeError, ImportError, AssertionError, ValueError) as error:
        pytest.skip(f"torchao's Int4WeightOnlyConfig does not run here (needs CUDA or mslk kernels): {error}")
    reloaded = Qwen3GatedForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(TOKENS).logits, quantized(TOKENS).logits, rtol=0, atol=0)
