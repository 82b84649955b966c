"""gate_parameter_groups, the public function any optimizer takes: the gate rows of q_proj as their own parameter
(the outputs unchanged), their own rate or alone, merged back as saved; dense and MoE gated models alike."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config

from gated_qwen import Qwen3GatedForCausalLM, convert_qwen3_to_gated
from gated_qwen.tools.training import TrainingError, gate_parameter_groups, merge_gate_rows


def gated_model(gate: str = "elementwise"):
    torch.manual_seed(0)
    return Qwen3GatedForCausalLM(tiny_config(gate=gate))


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_groups_keep_the_outputs_and_give_the_gate_rows_their_rate(gate):
    model = gated_model(gate)
    ids = torch.randint(0, model.config.vocab_size, (2, 8))
    before_logits = model(input_ids=ids).logits
    before_state = {k: v.clone() for k, v in model.state_dict().items()}
    groups = gate_parameter_groups(model, lr=1e-3, gate_lr_scale=10.0, weight_decay=0.1)
    assert torch.equal(model(input_ids=ids).logits, before_logits)
    assert [(g["lr"], g["weight_decay"]) for g in groups][-1][0] == pytest.approx(1e-2)
    gate_params = [p for g in groups if g["lr_scale"] == 10.0 for p in g["params"]]
    config = model.config
    gate_dim = 1 if gate == "headwise" else config.head_dim
    assert (
        sum(p.numel() for p in gate_params)
        == config.num_hidden_layers * config.num_attention_heads * gate_dim * config.hidden_size
    )
    all_params = {id(p) for g in groups for p in g["params"]}
    assert all_params == {id(p) for p in model.parameters()}  # every parameter in exactly one group
    merge_gate_rows(model)
    after = model.state_dict()
    assert after.keys() == before_state.keys() and all(torch.equal(after[k], before_state[k]) for k in after)


def test_trainable_gate_freezes_everything_else_and_an_optimizer_moves_only_the_gate():
    model = gated_model("headwise")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    groups = gate_parameter_groups(model, lr=1e-2, weight_decay=0.1, trainable="gate")
    optimizer = torch.optim.AdamW(groups)
    ids = torch.randint(0, model.config.vocab_size, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    merge_gate_rows(model)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed and all(".q_proj." in k for k in changed)


def test_the_moe_gated_model_has_its_gate_rows_apart_too(stock_moe):
    from transformers import Qwen3MoeForCausalLM

    model = convert_qwen3_to_gated(
        Qwen3MoeForCausalLM.from_pretrained(stock_moe, dtype=torch.float32), gate="headwise"
    )
    groups = gate_parameter_groups(model, lr=1e-3, gate_lr_scale=4.0)
    assert sum(p.numel() for g in groups if g["lr_scale"] == 4.0 for p in g["params"]) == 2 * 4 * 32


def test_a_model_without_a_gate_has_no_gate_rows_to_train_apart():
    torch.manual_seed(0)
    model = Qwen3GatedForCausalLM(tiny_config(gate="none"))
    assert len(gate_parameter_groups(model, lr=1e-3)) == 2  # matrices and vectors
    with pytest.raises(TrainingError, match="no gate rows"):
        gate_parameter_groups(model, lr=1e-3, gate_lr_scale=2.0)
