"""Converting stock Qwen3-MoE models and checkpoints into gated ones (issue 23)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import routed_experts, tensors_of, write_stock_moe_checkpoint
from transformers import AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM, Qwen3MoeForSequenceClassification

from gated_qwen import Qwen3MoeGatedForCausalLM, convert_checkpoint, convert_qwen3_to_gated
from gated_qwen.cli import main
from gated_qwen.errors import CheckpointError, GatedQwenError
from gated_qwen.models.qwen3_moe_gated.modeling_qwen3_moe_gated import Qwen3MoeGatedForSequenceClassification


IDS = torch.randint(320, (2, 24), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_cli_convert_of_a_stock_moe_computes_the_source_bit_for_bit(stock_moe_dense_layer, tmp_path, gate):
    target = tmp_path / "gated"
    assert main(["convert", str(stock_moe_dense_layer), str(target), "--gate", gate, "--verify", "--quiet"]) == 0
    stock = Qwen3MoeForCausalLM.from_pretrained(stock_moe_dense_layer, dtype=torch.float32).eval()
    gated = AutoModelForCausalLM.from_pretrained(target).eval()
    assert type(gated) is Qwen3MoeGatedForCausalLM and gated.config.gate_type == gate
    assert len(set().union(*routed_experts(stock, IDS).values())) > 2  # the routers spread the tokens
    with torch.no_grad():
        assert torch.equal(stock(IDS).logits, gated(IDS).logits)
        assert torch.equal(
            stock.generate(IDS[:1], max_new_tokens=8, do_sample=False),
            gated.generate(IDS[:1], max_new_tokens=8, do_sample=False),
        )
    config = json.loads((target / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe_gated" and config["architectures"] == ["Qwen3MoeGatedForCausalLM"]
    assert config["mlp_only_layers"] == [1]
    # every MoE tensor (router, experts, the dense layer's MLP) unchanged under its name; q_proj grown, o_proj doubled
    source, converted = tensors_of(stock_moe_dense_layer), tensors_of(target)
    assert converted.keys() == source.keys()
    moe_names = [name for name in source if ".mlp." in name]
    assert any("mlp.experts.3.down_proj" in n for n in moe_names) and "model.layers.1.mlp.up_proj.weight" in moe_names
    assert all(torch.equal(source[name], converted[name]) for name in moe_names)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert converted[q].shape[0] == source[q].shape[0] + 4 * (1 if gate == "headwise" else 8)
    o = "model.layers.2.self_attn.o_proj.weight"
    assert torch.equal(converted[o], 2 * source[o])
    assert (target / "tokenizer.json").is_file()


def test_random_init_starts_gates_that_are_not_one_half(stock_moe, tmp_path):
    convert_checkpoint(stock_moe, tmp_path / "random", gate="headwise", init="random", progress=False)
    source, converted = tensors_of(stock_moe), tensors_of(tmp_path / "random")
    q = "model.layers.1.self_attn.q_proj.weight"
    assert converted[q].abs().sum() > source[q].abs().sum()  # gate rows drawn, not zero
    assert all(torch.equal(source[n], converted[n]) for n in source if ".mlp." in n)


def test_a_checkpoint_saved_with_fused_experts_is_written_one_tensor_per_expert(tmp_path):
    source = write_stock_moe_checkpoint(tmp_path / "per_expert", seed=4)
    fused = tmp_path / "fused"
    model = Qwen3MoeForCausalLM.from_pretrained(source)
    model.save_pretrained(fused, save_original_format=False)
    assert any(name.endswith("mlp.experts.gate_up_proj") for name in tensors_of(fused))
    result = convert_checkpoint(fused, tmp_path / "gated", gate="elementwise", verify=True, progress=False)
    assert result.max_difference == 0.0
    converted = tensors_of(tmp_path / "gated")
    assert not any(name.endswith(("experts.gate_up_proj", "experts.down_proj")) for name in converted)
    per_expert = tensors_of(source)
    assert all(torch.equal(per_expert[n], converted[n]) for n in per_expert if ".mlp.experts." in n)


def test_bfloat16_identity_conversion_is_bit_exact(stock_moe, tmp_path):
    convert_checkpoint(stock_moe, tmp_path / "bf16", gate="headwise", dtype="bfloat16", progress=False)
    stock = Qwen3MoeForCausalLM.from_pretrained(stock_moe, dtype=torch.bfloat16)
    gated = Qwen3MoeGatedForCausalLM.from_pretrained(tmp_path / "bf16")
    assert gated.dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.equal(stock(IDS).logits, gated(IDS).logits)


def test_a_loaded_moe_converts_in_memory_sharing_its_experts(stock_moe):
    stock = Qwen3MoeForCausalLM.from_pretrained(stock_moe, dtype=torch.float32)
    gated = convert_qwen3_to_gated(stock, gate="elementwise")
    assert type(gated) is Qwen3MoeGatedForCausalLM
    assert gated.model.layers[0].mlp.experts.gate_up_proj is stock.model.layers[0].mlp.experts.gate_up_proj
    with torch.no_grad():
        out, reference = gated(IDS, output_router_logits=True), stock(IDS, output_router_logits=True)
    assert torch.equal(out.logits, reference.logits) and torch.equal(out.router_logits[1], reference.router_logits[1])


@pytest.mark.parametrize(
    "variant",
    [{"gate_input": "none"}, {"gate_activation": "identity", "gate_combination": "additive"}],
    ids=["input-independent", "additive-identity"],
)
def test_the_paper_rows_with_an_identity_convert_a_moe_bit_for_bit(stock_moe, tmp_path, variant):
    result = convert_checkpoint(
        stock_moe, tmp_path / "gated", gate="elementwise", verify=True, progress=False, **variant
    )
    assert result.max_difference == 0.0
    gated = Qwen3MoeGatedForCausalLM.from_pretrained(tmp_path / "gated")
    assert all(getattr(gated.config, key) == value for key, value in variant.items())
    with pytest.raises(GatedQwenError, match="sandwich norm"):
        convert_checkpoint(stock_moe, tmp_path / "sandwich", gate="headwise", sandwich_norm=True, progress=False)
    assert not (tmp_path / "sandwich").exists()


def test_a_moe_classifier_converts_in_memory():
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        num_labels=3,
        pad_token_id=0,
    )
    stock = Qwen3MoeForSequenceClassification(config).eval()
    gated = convert_qwen3_to_gated(stock, gate="headwise")
    assert type(gated) is Qwen3MoeGatedForSequenceClassification
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.equal(stock(ids).logits, gated(ids).logits)


def test_gate_keep_resaves_a_gated_moe_unchanged(stock_moe, tmp_path):
    torch.manual_seed(0)
    convert_checkpoint(stock_moe, tmp_path / "gated", gate="elementwise", init="random", progress=False)
    result = convert_checkpoint(tmp_path / "gated", tmp_path / "kept", gate="keep", verify=True, progress=False)
    assert result.gate == "elementwise" and result.max_difference == 0.0
    kept, gated = tensors_of(tmp_path / "kept"), tensors_of(tmp_path / "gated")
    assert kept.keys() == gated.keys() and all(torch.equal(kept[name], gated[name]) for name in kept)


def test_refusals_name_what_is_wrong(stock_moe, tmp_path):
    gated = tmp_path / "gated"
    convert_checkpoint(stock_moe, gated, gate="headwise", progress=False)
    with pytest.raises(CheckpointError, match="already gated \\(headwise\\)"):
        convert_checkpoint(gated, tmp_path / "again", gate="elementwise", progress=False)
    mislabelled = tmp_path / "mislabelled"
    shutil.copytree(stock_moe, mislabelled)
    config = json.loads((mislabelled / "config.json").read_text())
    (mislabelled / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen3ForCausalLM"]}))
    with pytest.raises(CheckpointError, match="is a Qwen3ForCausalLM"):
        convert_checkpoint(mislabelled, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    with pytest.raises(GatedQwenError, match="cannot convert a Linear"):
        convert_qwen3_to_gated(torch.nn.Linear(2, 2))
