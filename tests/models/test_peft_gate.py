"""PEFT on the attention gate alone (issue 36): gated_qwen.models.peft_gate, dense and MoE, released layout (gate
rows of q_proj) and a gate with a projection of its own (g_proj); the bare target ``gate`` is refused, not taken
for the MoE router."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_config_dict, tiny_moe_config_dict

import gated_qwen
from gated_qwen.models.layout import split_query_and_gate
from gated_qwen.models.peft_gate import gate_target_modules, get_gate_peft_model, keep_queries_frozen


peft = pytest.importorskip("peft")


def dense(**config_kwargs):
    torch.manual_seed(0)
    config = gated_qwen.Qwen3GatedConfig.from_dict({**tiny_config_dict(), **config_kwargs})
    return gated_qwen.Qwen3GatedForCausalLM(config)


def moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    stock = Qwen3MoeForCausalLM(Qwen3MoeConfig.from_dict(tiny_moe_config_dict(vocab_size=96)))
    return gated_qwen.convert_qwen3_to_gated(stock, gate="headwise")


def train_steps(model, steps: int = 3) -> None:
    """A few steps of plain language-model training on random tokens, with weight decay."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05, weight_decay=0.1)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(0, 96, (2, 12), generator=generator)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def merged_weights(peft_model) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in peft_model.merge_and_unload().state_dict().items()}


def attention_of(model, name: str):
    return model.get_submodule(name.rsplit(".", 2)[0])  # "...self_attn.q_proj.weight" -> "...self_attn"


@pytest.mark.parametrize("family", ["dense", "moe"])
def test_a_gate_adapter_changes_the_gate_rows_alone(family):
    base = dense() if family == "dense" else moe()
    before = {name: t.detach().clone() for name, t in base.state_dict().items()}
    adapted = get_gate_peft_model(copy.deepcopy(base), r=2, lora_alpha=4)
    trainable = [name for name, p in adapted.named_parameters() if p.requires_grad]
    assert trainable and all("self_attn.q_proj.lora_" in name for name in trainable)
    train_steps(adapted)
    after = merged_weights(adapted)
    assert after.keys() == before.keys()
    changed_gates = 0
    for name, weight in before.items():
        if not name.endswith("self_attn.q_proj.weight"):
            assert torch.equal(after[name], weight), name  # router, experts, k/v/o, norms: as they were
            continue
        attention = attention_of(base, name)
        query_before, gate_before = split_query_and_gate(
            weight, base.config.num_key_value_heads, attention.head_dim, attention.gate_dim, dim=0
        )
        query_after, gate_after = split_query_and_gate(
            after[name], base.config.num_key_value_heads, attention.head_dim, attention.gate_dim, dim=0
        )
        assert torch.equal(query_after, query_before), name  # the queries exactly
        changed_gates += not torch.equal(gate_after, gate_before)
    assert changed_gates == base.config.num_hidden_layers  # every layer's gate rows moved


def test_the_gate_adapter_leaves_the_query_outputs_and_the_router_outputs():
    # The same through outputs, on the MoE: layer 0's q_proj (it reads the embeddings, unchanged) writes the base
    # model's queries and other gate logits; every router maps the same hidden states to the same logits.
    base = moe()
    adapted = get_gate_peft_model(copy.deepcopy(base), r=2, lora_alpha=4)
    train_steps(adapted)
    ids = torch.arange(10).unsqueeze(0)
    outputs = {}
    for key, model in (("base", base), ("adapted", adapted)):
        q_proj = next(m for n, m in model.named_modules() if n.endswith("layers.0.self_attn.q_proj"))
        hook = q_proj.register_forward_hook(lambda module, inputs, output, key=key: outputs.setdefault(key, output))
        with torch.no_grad():
            model(input_ids=ids)
        hook.remove()
    attention = base.model.layers[0].self_attn
    (query, gate), (query_adapted, gate_adapted) = (
        split_query_and_gate(outputs[key], base.config.num_key_value_heads, attention.head_dim, attention.gate_dim)
        for key in ("base", "adapted")
    )
    assert torch.equal(query_adapted, query)
    assert not torch.allclose(gate_adapted, gate)
    hidden = torch.randn(10, base.config.hidden_size, generator=torch.Generator().manual_seed(2))
    routers = [(n, m) for n, m in adapted.named_modules() if n.endswith("mlp.gate")]
    assert len(routers) == base.config.num_hidden_layers
    with torch.no_grad():
        for name, router in routers:
            base_router = base.get_submodule(name.removeprefix("base_model.model."))
            assert torch.equal(router(hidden)[0], base_router(hidden)[0]), name


def test_a_gate_with_its_own_projection_is_adapted_through_g_proj():
    base = dense(gate_type="headwise", gate_position="value", headwise_attn_output_gate=False)
    assert gate_target_modules(base.config) == ["self_attn.g_proj"]
    before = {name: t.detach().clone() for name, t in base.state_dict().items()}
    adapted = get_gate_peft_model(copy.deepcopy(base), r=2, lora_alpha=4)
    train_steps(adapted)
    after = merged_weights(adapted)
    for name, weight in before.items():
        assert torch.equal(after[name], weight) != name.endswith("self_attn.g_proj.weight"), name


def test_a_reloaded_gate_adapter_trains_the_gate_alone_again(tmp_path):
    base = dense()
    adapted = get_gate_peft_model(copy.deepcopy(base), r=2, lora_alpha=4)
    train_steps(adapted, steps=1)
    adapted.save_pretrained(tmp_path / "adapter")
    reloaded = keep_queries_frozen(
        peft.PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "adapter", is_trainable=True)
    )
    train_steps(reloaded)
    name = "model.layers.1.self_attn.q_proj.weight"
    attention = attention_of(base, name)
    query_before, _ = split_query_and_gate(base.state_dict()[name], 2, attention.head_dim, attention.gate_dim, dim=0)
    query_after, _ = split_query_and_gate(
        merged_weights(reloaded)[name], 2, attention.head_dim, attention.gate_dim, dim=0
    )
    assert torch.equal(query_after, query_before)


@pytest.mark.parametrize("family", ["dense", "moe"])
def test_the_bare_target_gate_is_refused_naming_both_meanings(family):
    model = dense() if family == "dense" else moe()
    with pytest.raises(ValueError, match=r"ambiguous.*'mlp\.gate' for the router.*get_gate_peft_model"):
        peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["gate"]))


def test_the_router_is_still_reached_as_mlp_gate():
    lora = peft.get_peft_model(moe(), peft.LoraConfig(r=2, target_modules=["mlp.gate"]))
    trainable = [name for name, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all(".mlp.gate." in name for name in trainable)


def test_what_changes_the_queries_is_refused():
    for kwargs in (
        {"use_dora": True},
        {"bias": "all"},
        {"target_modules": ["q_proj"]},
        {"init_lora_weights": "pissa"},
    ):
        with pytest.raises(ValueError):
            get_gate_peft_model(dense(), r=2, **kwargs)
    with pytest.raises(ValueError, match="no attention gate"):
        get_gate_peft_model(dense(gate_type="none", headwise_attn_output_gate=False), r=2)
