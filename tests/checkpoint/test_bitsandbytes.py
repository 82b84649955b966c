"""bitsandbytes checkpoints (8-bit and 4-bit, ``save_pretrained`` of a model loaded with BitsAndBytesConfig) load
back under strict loading, dense and MoE; a config that does not describe their weights is still refused; 4-bit
inference on the CPU runs on a headwise model, whose q_proj rows are not a multiple of bitsandbytes' block of 32."""

from __future__ import annotations

import json

import pytest
import torch

from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM, Qwen3MoeGatedConfig, Qwen3MoeGatedForCausalLM
from gated_qwen.errors import WeightShapeMismatchError


pytest.importorskip("bitsandbytes")
from transformers import BitsAndBytesConfig  # noqa: E402


TOKENS = torch.arange(1, 9).unsqueeze(0)
SIZES = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
SIZES.update(num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # headwise q_proj: 4 * 16 + 4 = 68 rows


def quantization(bits: int) -> BitsAndBytesConfig:
    if bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)


def model_class_and_config(family: str, gate: str = "headwise"):
    if family == "moe":
        config = Qwen3MoeGatedConfig(**SIZES, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)
        config.gate_type, config.mlp_only_layers = gate, [1]  # a dense layer among the sparse ones
        return Qwen3MoeGatedForCausalLM, Qwen3MoeGatedConfig(**config.to_dict())
    return Qwen3GatedForCausalLM, Qwen3GatedConfig(**SIZES, gate_type=gate)


def quantized_checkpoint(tmp_path, family: str, bits: int):
    model_class, config = model_class_and_config(family)
    torch.manual_seed(0)
    model_class(config).save_pretrained(tmp_path / "float")
    quantized = model_class.from_pretrained(
        tmp_path / "float", quantization_config=quantization(bits), device_map="cpu"
    )
    quantized.save_pretrained(tmp_path / "quantized")
    return model_class, quantized, tmp_path / "quantized"


@pytest.mark.parametrize("family", ["dense", "moe"])
@pytest.mark.parametrize("bits", [8, 4])
def test_bitsandbytes_checkpoint_loads_back(tmp_path, family, bits):
    model_class, quantized, folder = quantized_checkpoint(tmp_path, family, bits)
    assert "quantization_config" in json.loads((folder / "config.json").read_text())
    reloaded = model_class.from_pretrained(folder, device_map="cpu")  # strict: refused before this change
    q_proj = reloaded.model.layers[0].self_attn.q_proj
    assert type(q_proj) is type(quantized.model.layers[0].self_attn.q_proj)
    assert type(q_proj).__name__ == ("Linear8bitLt" if bits == 8 else "Linear4bit")
    with torch.no_grad():  # inference: on a CPU with AVX512-BF16 bitsandbytes' fast 4-bit kernel path
        torch.testing.assert_close(reloaded(TOKENS).logits, quantized(TOKENS).logits, rtol=0, atol=0)
        generated = reloaded.generate(TOKENS, max_new_tokens=4, do_sample=False)
    assert generated.shape == (1, TOKENS.shape[1] + 4)


@pytest.mark.parametrize("family", ["dense", "moe"])
@pytest.mark.parametrize("bits", [8, 4])
def test_bitsandbytes_checkpoint_with_wrong_gate_type_is_refused(tmp_path, family, bits):
    model_class, _, folder = quantized_checkpoint(tmp_path, family, bits)
    config = json.loads((folder / "config.json").read_text())
    config.update(gate_type="elementwise", headwise_attn_output_gate=False, elementwise_attn_output_gate=True)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightShapeMismatchError, match=r"q_proj\.weight has shape \(68, 64\).*'headwise' gate"):
        model_class.from_pretrained(folder, device_map="cpu")


def test_bitsandbytes_parts_without_quantization_config_are_refused(tmp_path):
    model_class, _, folder = quantized_checkpoint(tmp_path, "dense", 4)
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightShapeMismatchError):
        model_class.from_pretrained(folder)


def test_a_fresh_4bit_load_runs_on_the_cpu_without_grad(tmp_path):
    """Quantized on load (not from a saved checkpoint): the rows of q_proj still keep the plain 4-bit path."""
    model_class, config = model_class_and_config("dense")
    torch.manual_seed(0)
    model_class(config).save_pretrained(tmp_path / "float")
    model = model_class.from_pretrained(tmp_path / "float", quantization_config=quantization(4), device_map="cpu")
    with torch.no_grad():
        without_grad = model(TOKENS).logits
    torch.testing.assert_close(without_grad, model(TOKENS).logits.detach(), rtol=0, atol=0)
