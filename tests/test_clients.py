"""Clients of the model (issue 28): PEFT adapts on the gated MoE what it adapts on stock Qwen3-MoE, and TRL's
trainers take a path to a saved gated model, dense or MoE."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_config_dict, tiny_moe_config_dict, write_tiny_tokenizer

import gated_qwen
from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM


peft = pytest.importorskip("peft")

R = 2
HEADS, HEAD_DIM, LAYERS = 4, 8, 2


@pytest.fixture(scope="module")
def stock_and_gated_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    stock = Qwen3MoeForCausalLM(Qwen3MoeConfig.from_dict(tiny_moe_config_dict()))
    gated = gated_qwen.convert_qwen3_to_gated(copy.deepcopy(stock), gate="headwise")
    assert gated.config.model_type == "qwen3_moe_gated"
    return stock, gated


def adapted(model, **lora_kwargs) -> dict[str, int]:
    """The trainable (adapter) parameters PEFT adds to a copy of ``model``: name -> number of values."""
    lora = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=R, lora_alpha=2 * R, **lora_kwargs))
    return {name: p.numel() for name, p in lora.named_parameters() if p.requires_grad}


def q_proj_gate_extra(names) -> int:
    """The adapter values the gate rows add: lora_B of each adapted q_proj has HEADS more output rows (headwise)."""
    return sum(R * HEADS for name in names if "q_proj.lora_B" in name)


TARGETS = {
    "all-linear": {"target_modules": "all-linear"},
    # the router as "mlp.gate": the bare "gate" is refused on a gated model (tests/models/test_peft_gate.py)
    "module names (v4 experts and router)": {
        "target_modules": ["q_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "mlp.gate"]
    },
    "module regex": {"target_modules": r".*\.(q_proj|gate_proj|up_proj|down_proj)"},
    "target_parameters": {"target_modules": [], "target_parameters": ["experts.gate_up_proj", "experts.down_proj"]},
}


@pytest.mark.parametrize("targets", TARGETS.values(), ids=TARGETS.keys())
def test_peft_adapts_on_the_gated_moe_what_it_adapts_on_stock(stock_and_gated_moe, targets):
    stock, gated = stock_and_gated_moe
    on_stock, on_gated = adapted(stock, **targets), adapted(gated, **targets)
    assert any(".experts." in name for name in on_stock)  # the check means something: stock reaches the experts
    assert on_gated.keys() == on_stock.keys()
    # the same shapes except q_proj's lora_B, which also spans the gate rows
    assert sum(on_gated.values()) == sum(on_stock.values()) + q_proj_gate_extra(on_gated)
    assert {k: v for k, v in on_gated.items() if "q_proj" not in k} == {
        k: v for k, v in on_stock.items() if "q_proj" not in k
    }


def test_peft_defaults_on_the_gated_moe_are_stock_qwen3s(stock_and_gated_moe):
    """Stock Qwen3-MoE has no PEFT default (PEFT asks for target modules); the gated MoE takes stock Qwen3's, which
    on stock Qwen3-MoE adapt the same modules."""
    stock, gated = stock_and_gated_moe
    on_gated = adapted(gated)
    on_stock = adapted(stock, target_modules=["q_proj", "v_proj"])
    assert on_gated.keys() == on_stock.keys()
    assert sum(on_gated.values()) == sum(on_stock.values()) + q_proj_gate_extra(on_gated)


def test_the_fused_expert_table_is_registered_when_peft_loads_it():
    conversion = pytest.importorskip("peft.utils.transformers_weight_conversion")
    table = conversion._MODEL_TO_CONVERSION_PATTERN
    assert table["qwen3_moe_gated"] == table["qwen3_moe"]


# ----------------------------------------------------------------------------------------------
# TRL from a path


def save_dense(folder):
    config = Qwen3GatedConfig.from_dict(tiny_config_dict(vocab_size=320))
    config.eos_token_id, config.pad_token_id = 0, 1
    torch.manual_seed(0)
    Qwen3GatedForCausalLM(config).save_pretrained(folder)
    write_tiny_tokenizer(folder)
    return str(folder)


def save_moe(folder):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    stock = Qwen3MoeForCausalLM(Qwen3MoeConfig.from_dict(tiny_moe_config_dict(pad_token_id=1)))
    gated_qwen.convert_qwen3_to_gated(stock, gate="headwise").save_pretrained(folder)
    write_tiny_tokenizer(folder)
    return str(folder)


SAVERS = {"dense": save_dense, "moe": save_moe}


def trainer_args(config_class, tmp_path, **kwargs):
    return config_class(
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        **kwargs,
    )


def assert_trained(trainer):
    trainer.train()
    assert trainer.state.global_step == 1
    assert type(trainer.model).__name__.endswith("GatedForCausalLM")


@pytest.mark.parametrize("family", SAVERS)
def test_sft_trainer_takes_a_path(tmp_path, family):
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    path = SAVERS[family](tmp_path / "model")
    dataset = Dataset.from_dict({"text": ["Hello gated attention.", "The quick brown fox jumps."] * 2})
    trainer = SFTTrainer(model=path, train_dataset=dataset, args=trainer_args(SFTConfig, tmp_path, max_length=16))
    assert_trained(trainer)


@pytest.mark.parametrize("family", SAVERS)
def test_dpo_trainer_takes_a_path_without_a_reference_model(tmp_path, family):
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    path = SAVERS[family](tmp_path / "model")
    dataset = Dataset.from_dict(
        {
            "prompt": ["Hello", "The quick"] * 2,
            "chosen": [" gated attention.", " brown fox."] * 2,
            "rejected": [" world.", " lazy dog."] * 2,
        }
    )
    trainer = DPOTrainer(model=path, train_dataset=dataset, args=trainer_args(DPOConfig, tmp_path, max_length=16))
    assert_trained(trainer)


@pytest.mark.parametrize("family", SAVERS)
def test_grpo_trainer_takes_a_path(tmp_path, family):
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    path = SAVERS[family](tmp_path / "model")
    dataset = Dataset.from_dict({"prompt": ["Hello", "The quick"]})

    def reward_length(completions, **kwargs):
        return [float(len(completion)) for completion in completions]

    args = trainer_args(GRPOConfig, tmp_path, num_generations=2, max_completion_length=4)
    trainer = GRPOTrainer(model=path, reward_funcs=reward_length, train_dataset=dataset, args=args)
    assert_trained(trainer)


@pytest.mark.slow
def test_peft_imported_before_gated_qwen_gets_the_fused_expert_table_too():
    import json
    import subprocess
    import sys

    code = (
        "import json, peft.utils.transformers_weight_conversion as w, gated_qwen\n"
        "print(json.dumps(w._MODEL_TO_CONVERSION_PATTERN.get('qwen3_moe_gated')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == "qwen2_moe"


def test_peft_on_a_gate_variant_takes_qwen3s_defaults_and_all_linear_reaches_g_proj():
    from peft import LoraConfig, get_peft_model

    config = Qwen3GatedConfig(**{**tiny_config_dict(gate="none"), "gate_type": "headwise", "gate_position": "value"})
    adapted = {}
    for targets in (None, "all-linear"):
        torch.manual_seed(0)
        model = get_peft_model(Qwen3GatedForCausalLM(config), LoraConfig(r=2, target_modules=targets))
        adapted[targets] = {name.split(".")[-2] for name, _ in model.named_modules() if name.endswith("lora_A")}
    assert adapted[None] == {"q_proj", "v_proj"}  # transformers' Qwen3 defaults, as on stock
    assert "g_proj" in adapted["all-linear"] and {"q_proj", "k_proj", "v_proj", "o_proj"} <= adapted["all-linear"]
