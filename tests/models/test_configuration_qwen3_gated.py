import json

import pytest
from conftest import tiny_config_dict
from transformers import AutoConfig, Qwen3Config

from gated_qwen import Qwen3GatedConfig
from gated_qwen.errors import CheckpointError


@pytest.mark.parametrize("gate", ["none", "headwise", "elementwise"])
def test_reads_every_key_of_a_released_config(gate):
    raw = tiny_config_dict(gate=gate, qkv_bias=True)
    raw["rope_theta"] = 123456.0
    config = Qwen3GatedConfig(**raw)
    assert config.gate_type == gate
    assert config.rope_parameters["rope_theta"] == 123456.0
    assert str(config.dtype) == "torch.float32"
    assert config.use_qk_norm is True
    # qkv_bias decides the biases, even when attention_bias says otherwise
    assert raw["attention_bias"] is False and config.qkv_bias is True and config.attention_bias is True
    assert config.auto_map == {}  # present (TRL reads it), always empty


def test_a_stock_qwen3_config_means_no_gate(tmp_path):
    Qwen3Config(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, attention_bias=True
    ).save_pretrained(tmp_path)
    config = Qwen3GatedConfig.from_pretrained(tmp_path)
    assert config.gate_type == "none" and config.qkv_bias is True and config.use_qk_norm is True


def test_gate_type_is_a_key_and_the_released_flags_follow_it(tmp_path):
    config = Qwen3GatedConfig()
    config.gate_type = "headwise"  # set after construction, as from_pretrained(..., gate_type=...) does
    assert config.headwise_attn_output_gate is True
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["gate_type"] == "headwise" and saved["headwise_attn_output_gate"] is True
    # the flags are still the released way to say it, before and after construction
    config.headwise_attn_output_gate = False
    config.elementwise_attn_output_gate = True
    assert config.gate_type == "elementwise"


@pytest.mark.parametrize(
    "kwargs,keys",
    [
        (
            {"headwise_attn_output_gate": True, "elementwise_attn_output_gate": True},
            ["headwise_attn_output_gate", "elementwise_attn_output_gate"],
        ),
        ({"num_attention_heads": 6, "num_key_value_heads": 4}, ["num_attention_heads", "num_key_value_heads"]),
    ],
)
def test_invalid_combinations_name_their_keys(kwargs, keys):
    with pytest.raises(ValueError) as error:
        Qwen3GatedConfig(**kwargs)
    assert all(key in str(error.value) for key in keys)


def test_save_writes_qwen3_gated_and_keeps_the_released_keys(tmp_path):
    config = Qwen3GatedConfig(**tiny_config_dict(gate="elementwise", use_qk_norm=False))
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "qwen3_gated"
    assert saved["headwise_attn_output_gate"] is False and saved["elementwise_attn_output_gate"] is True
    assert saved["use_qk_norm"] is False and saved["qkv_bias"] is False and saved["rope_theta"] == 10000.0
    assert "auto_map" not in saved
    reloaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(reloaded, Qwen3GatedConfig) and reloaded.gate_type == "elementwise"
    assert {**reloaded.to_dict(), "_name_or_path": ""} == {**config.to_dict(), "_name_or_path": ""}


def test_another_model_type_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match="'llama' model, not Qwen3 or Qwen3Gated"):
        Qwen3GatedConfig.from_pretrained(tmp_path)


def test_released_config_is_read_by_its_keys_whatever_its_model_type():
    released = {
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "headwise_attn_output_gate": True,
        "use_qk_norm": True,
        "use_sliding_window": False,
        "max_window_layers": 28,
    }
    config = Qwen3GatedConfig.from_dict(released)
    assert config.gate_type == "headwise" and config.head_dim == 16  # hidden / heads, not Qwen3's 128
    assert config.layer_types == ["full_attention"] * config.num_hidden_layers
    only_auto_map = {"model_type": "qwen2", "auto_map": {"AutoConfig": "configuration_qwen3.Qwen3Config"}}
    assert Qwen3GatedConfig.from_dict(only_auto_map).gate_type == "none"


def test_a_genuine_qwen2_config_is_refused_naming_what_it_is(tmp_path):
    from transformers import Qwen2Config

    Qwen2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="is a Qwen2 model .*no QK-norm.*Qwen2ForCausalLM"):
        Qwen3GatedConfig.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "name, gate, parameters",
    [
        ("1B_baseline", "none", 1720.8e6),
        ("1B_gate_headwise", "headwise", 1721.8e6),
        ("1B_gate_elementwise", "elementwise", 1728.2e6),
    ],
)
def test_released_arm_configs_give_the_measured_parameter_counts(name, gate, parameters):
    """configs/1B_*.json against the parameter counts measured on the downloaded arms (docs/released-format.md)."""
    from pathlib import Path

    import torch

    from gated_qwen import Qwen3GatedForCausalLM

    path = Path(__file__).resolve().parents[2] / "configs" / f"{name}.json"
    config = Qwen3GatedConfig.from_dict(json.loads(path.read_text()))
    assert config.gate_type == gate and config.vocab_size == 152064
    with torch.device("meta"):
        model = Qwen3GatedForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(parameters, abs=0.05e6)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"vocab_size": 0}, "says vocab_size 0, which makes no model"),
        ({"hidden_size": -64}, "says hidden_size -64, which makes no model"),
        ({"num_hidden_layers": 0}, "says num_hidden_layers 0, which makes no model"),
        (
            {"intermediate_size": 128.5},
            "says intermediate_size 128.5, which makes no model: it must be a positive integer",
        ),
        ({"num_attention_heads": 0}, "says num_attention_heads 0, which makes no model"),  # not a ZeroDivisionError
        ({"num_key_value_heads": "2"}, "says num_key_value_heads '2', which makes no model"),
        ({"head_dim": 0}, "says head_dim 0, which makes no model"),
        (
            {"num_attention_heads": 3, "num_key_value_heads": 1},
            "num_attention_heads 3, which does not divide hidden_size 32, and gives no head_dim",
        ),
        ({"num_key_value_heads": 3}, r"num_attention_heads \(4\) is not a multiple of num_key_value_heads \(3\)"),
    ],
    ids=[
        "zero vocab",
        "negative hidden",
        "no layers",
        "fractional MLP",
        "no heads",
        "text kv heads",
        "zero head_dim",
        "heads not dividing hidden",
        "kv heads not dividing heads",
    ],
)
def test_a_config_that_makes_no_model_is_refused_when_read_naming_the_key(tmp_path, changes, message):
    config = tiny_config_dict()  # hidden 32, 4 heads, no head_dim (derived: 8)
    config.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message) as error:
        Qwen3GatedConfig.from_pretrained(tmp_path)
    assert str(tmp_path) in str(error.value)  # which config.json


def test_a_config_built_from_keywords_is_checked_too():
    with pytest.raises(ValueError, match="says vocab_size -1, which makes no model"):
        Qwen3GatedConfig(vocab_size=-1)
