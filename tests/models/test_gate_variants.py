"""The gate design space (docs/design-space.md): every variant builds, computes what its config says, saves and
reloads exactly, generates with the cache as without, and is refused where it has no meaning."""

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_moe_config_dict
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM, Qwen3MoeGatedConfig, Qwen3MoeGatedForCausalLM
from gated_qwen.errors import CheckpointError


SIZES = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
}

# The rows of the paper's comparison (docs/design-space.md), each as config keys.
VARIANTS = {
    "G1 elementwise": {"gate_type": "elementwise"},
    "G1 headwise": {"gate_type": "headwise"},
    "G2 elementwise": {"gate_type": "elementwise", "gate_position": "value"},
    "G2 headwise": {"gate_type": "headwise", "gate_position": "value"},
    "G3 elementwise": {"gate_type": "elementwise", "gate_position": "key"},
    "G4 elementwise": {"gate_type": "elementwise", "gate_position": "query"},
    "G4 headwise": {"gate_type": "headwise", "gate_position": "query"},
    "G5 elementwise": {"gate_type": "elementwise", "gate_position": "dense_output"},
    "G1 shared elementwise": {"gate_type": "elementwise", "gate_shared_across_heads": True},
    "G1 shared headwise": {"gate_type": "headwise", "gate_shared_across_heads": True},
    "G2 shared headwise": {"gate_type": "headwise", "gate_position": "value", "gate_shared_across_heads": True},
    "G1 additive silu": {"gate_type": "elementwise", "gate_activation": "silu", "gate_combination": "additive"},
    "G1 multiplicative silu": {"gate_type": "elementwise", "gate_activation": "silu"},
    "G1 additive sigmoid": {"gate_type": "elementwise", "gate_combination": "additive"},
    "G3 headwise additive silu": {
        "gate_type": "headwise",
        "gate_position": "key",
        "gate_activation": "silu",
        "gate_combination": "additive",
    },
    # the paper's mechanism rows (Tables 3 and 4)
    "G1 additive identity": {
        "gate_type": "elementwise",
        "gate_activation": "identity",
        "gate_combination": "additive",
    },
    "G1 NS-sigmoid": {"gate_type": "elementwise", "gate_activation": "ns_sigmoid"},
    "G1 input-independent": {"gate_type": "elementwise", "gate_input": "none"},
    "G2 headwise input-independent": {"gate_type": "headwise", "gate_position": "value", "gate_input": "none"},
    "G1 headwise bilinear": {"gate_type": "headwise", "gate_activation": "identity"},
}
# The rows that change the attention or the layer with or without a gate (Table 3 rows 5-6, Table 2 row 7).
UNGATED_ROWS = {
    "SDPA SiLU": {"attn_output_transform": "silu"},
    "SDPA RMSNorm": {"attn_output_transform": "rmsnorm"},
    "sandwich norm": {"sandwich_norm": True},
    "G1 headwise, SDPA RMSNorm, sandwich norm": {
        "gate_type": "headwise",
        "attn_output_transform": "rmsnorm",
        "sandwich_norm": True,
    },
}
ROWS = {**VARIANTS, **UNGATED_ROWS}


def gate_parameter(attention) -> torch.Tensor:
    """The gate's trainable tensor: g_proj's weight, an input-independent gate's scores, or q_proj's weight."""
    if hasattr(attention, "gate_logits"):
        return attention.gate_logits
    return getattr(attention, "g_proj", attention.q_proj).weight


def build(variant: dict, seed: int = 0, **overrides) -> Qwen3GatedForCausalLM:
    torch.manual_seed(seed)
    model = Qwen3GatedForCausalLM(Qwen3GatedConfig(**SIZES, **variant, **overrides)).eval()
    with torch.no_grad():  # gates far from their initial 0.5, so that a gate in the wrong place shows
        for attention in (layer.self_attn for layer in model.model.layers):
            gate_parameter(attention).normal_(0, 0.5)
    return model


def input_ids(batch=2, length=9, seed=0):
    return torch.randint(3, SIZES["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


def reference_attention(attention, config, hidden, cos, sin):
    """The gated attention written out from the definition, for a gate with its own projection."""
    B, T, _ = hidden.shape
    H, K, D = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    act = {
        "sigmoid": torch.sigmoid,
        "silu": F.silu,
        "ns_sigmoid": lambda logits: 0.5 + 0.5 * torch.sigmoid(logits),
        "identity": lambda logits: logits,
    }[config.gate_activation]

    def combine(states, gate):
        return states * gate if config.gate_combination == "multiplicative" else states + gate

    if config.gate_input == "none":  # the same scores at every token
        gate = act(attention.gate_logits.flatten().expand(B, T, -1))
    else:
        gate = act(attention.g_proj(hidden))  # (B, T, scores)
    position = config.gate_position
    query = attention.q_norm(attention.q_proj(hidden).view(B, T, H, D))
    key = attention.k_norm(attention.k_proj(hidden).view(B, T, K, D))
    value = attention.v_proj(hidden).view(B, T, K, D)
    if position == "dense_output":
        gate = gate.view(B, T, config.hidden_size)
    else:
        width = D if config.gate_type == "elementwise" else 1
        gate = gate.view(B, T, -1, width)  # (B, T, heads or 1, width): broadcast over heads when shared
    if position == "query":
        query = combine(query, gate)
    if position == "key":
        key = combine(key, gate)
    if position == "value":
        value = combine(value, gate)
    query, key = apply_rotary_pos_emb(query.transpose(1, 2), key.transpose(1, 2), cos, sin)  # (B, H|K, T, D)
    key = key.repeat_interleave(H // K, dim=1)
    value = value.transpose(1, 2).repeat_interleave(H // K, dim=1)
    scores = query @ key.transpose(-1, -2) * D**-0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    output = (scores.softmax(-1) @ value).transpose(1, 2)  # (B, T, H, D)
    if position == "sdpa_output":
        output = combine(output, gate)
    output = attention.o_proj(output.reshape(B, T, H * D))
    return combine(output, gate) if position == "dense_output" else output


OWN_PROJECTION = [name for name, variant in VARIANTS.items() if not Qwen3GatedConfig(**variant).gate_in_q_proj]


@pytest.mark.parametrize("name", OWN_PROJECTION)
def test_each_gate_acts_where_its_config_says(name):
    model = build(VARIANTS[name], attn_implementation="eager")
    attention, config = model.model.layers[0].self_attn, model.config
    hidden = torch.randn(2, 7, SIZES["hidden_size"], generator=torch.Generator().manual_seed(1))
    position_ids = torch.arange(7)[None].expand(2, -1)
    cos, sin = model.model.rotary_emb(hidden, position_ids)
    mask = torch.zeros(7, 7).masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))[None, None]
    with torch.no_grad():
        found, _ = attention(hidden, (cos, sin), mask.expand(2, 1, 7, 7))
        expected = reference_attention(attention, config, hidden, cos, sin)
    torch.testing.assert_close(found, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(ROWS))
def test_every_variant_saves_reloads_and_generates_exactly(name, tmp_path):
    model = build(ROWS[name])
    ids = input_ids()
    with torch.no_grad():
        logits = model(ids).logits
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    for key, value in ROWS[name].items():
        assert saved[key] == value
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is Qwen3GatedForCausalLM
    reloaded_weights = reloaded.state_dict()
    assert all(torch.equal(reloaded_weights[key], value) for key, value in model.state_dict().items())
    with torch.no_grad():  # bit-equal weights; memory-mapped ones may take another SIMD path (last-bit differences)
        torch.testing.assert_close(reloaded(ids).logits, logits, atol=1e-6, rtol=0)
    # the cache holds what the full forward computes (a value gate before the cache, key and query before RoPE)
    generated = reloaded.generate(ids[:1, :4], max_new_tokens=5, do_sample=False)
    with torch.no_grad():
        assert torch.equal(reloaded(generated).logits[0, 3:-1].argmax(-1), generated[0, 4:])


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_trains_its_gate(name):
    model = build(VARIANTS[name]).train()
    ids = input_ids()
    model(ids, labels=ids).loss.backward()
    for attention in (layer.self_attn for layer in model.model.layers):
        gradient = gate_parameter(attention).grad
        assert gradient is not None and gradient.abs().sum() > 0


def test_parameters_added_are_those_of_the_gate():
    baseline = sum(p.numel() for p in Qwen3GatedForCausalLM(Qwen3GatedConfig(**SIZES)).parameters())
    added = {
        name: sum(p.numel() for p in build(variant).parameters()) - baseline for name, variant in VARIANTS.items()
    }
    hidden, layers, H, K, D = 32, 2, 4, 2, 8
    assert added["G1 elementwise"] == added["G4 elementwise"] == layers * hidden * H * D
    assert added["G1 headwise"] == layers * hidden * H
    assert added["G2 elementwise"] == added["G3 elementwise"] == layers * hidden * K * D
    assert added["G5 elementwise"] == layers * hidden * hidden
    assert added["G1 shared elementwise"] == layers * hidden * D and added["G1 shared headwise"] == layers * hidden
    # input-independent: one score per head and channel, no projection of the input
    assert added["G1 input-independent"] == layers * H * D and added["G2 headwise input-independent"] == layers * K
    assert added["G1 NS-sigmoid"] == added["G1 additive identity"] == layers * hidden * H * D
    extra = {name: sum(p.numel() for p in build(row).parameters()) - baseline for name, row in UNGATED_ROWS.items()}
    assert extra["SDPA SiLU"] == 0 and extra["SDPA RMSNorm"] == layers * D
    assert extra["sandwich norm"] == layers * 2 * hidden


def test_an_input_independent_gate_starts_at_zero_scores_and_ignores_the_input():
    model = Qwen3GatedForCausalLM(Qwen3GatedConfig(**SIZES, **VARIANTS["G1 input-independent"])).eval()
    attention = model.model.layers[0].self_attn
    assert attention.gate_logits.shape == (4, 8) and not attention.gate_logits.any()  # (heads, head_dim), zero
    assert not hasattr(attention, "g_proj")
    seen = []
    attention.gate_override = lambda gate: seen.append(gate) or gate
    try:
        with torch.no_grad():
            model(input_ids())
    finally:
        attention.gate_override = None
    assert seen[0].shape == (2, 9, 4, 8) and torch.equal(seen[0], torch.full_like(seen[0], 0.5))


def test_ns_sigmoid_scores_lie_between_a_half_and_one():
    model = build(VARIANTS["G1 NS-sigmoid"])
    seen = []
    attention = model.model.layers[0].self_attn
    attention.gate_override = lambda gate: seen.append(gate) or gate
    try:
        with torch.no_grad():
            model(input_ids())
    finally:
        attention.gate_override = None
    assert seen[0].min() >= 0.5 and seen[0].max() <= 1 and seen[0].std() > 0.01


def _attention_inputs(model, length=7):
    hidden = torch.randn(2, length, SIZES["hidden_size"], generator=torch.Generator().manual_seed(1))
    position_ids = torch.arange(length)[None].expand(2, -1)
    causal = torch.ones(length, length, dtype=torch.bool).triu(1)
    mask = torch.zeros(length, length).masked_fill(causal, float("-inf"))[None, None].expand(2, 1, -1, -1)
    return hidden, model.model.rotary_emb(hidden, position_ids), mask


@pytest.mark.parametrize("transform", ["silu", "rmsnorm"])
def test_the_sdpa_output_transform_acts_on_each_head_before_o_proj(transform):
    model = build({"attn_output_transform": transform}, attn_implementation="eager")
    plain = build({}, attn_implementation="eager")
    attention, reference = model.model.layers[0].self_attn, plain.model.layers[0].self_attn
    reference.load_state_dict(attention.state_dict(), strict=False)  # the same projections
    if transform == "rmsnorm":
        with torch.no_grad():
            attention.attn_output_transform.weight.normal_(1, 0.5)

    def by_definition(states):  # (B, T, H*D): each head's D channels
        heads = states.unflatten(-1, (4, 8))
        if transform == "silu":
            return F.silu(heads).flatten(-2)
        variance = heads.pow(2).mean(-1, keepdim=True)
        normed = heads * torch.rsqrt(variance + model.config.rms_norm_eps)
        return (attention.attn_output_transform.weight * normed).flatten(-2)

    reference.o_proj.register_forward_pre_hook(lambda module, args: (by_definition(args[0]),))
    hidden, position_embeddings, mask = _attention_inputs(model)
    with torch.no_grad():
        found, _ = attention(hidden, position_embeddings, mask)
        expected, _ = reference(hidden, position_embeddings, mask)
    torch.testing.assert_close(found, expected, atol=1e-5, rtol=1e-5)


def test_the_sandwich_norm_normalises_each_block_output_before_the_residual_add():
    model = build(UNGATED_ROWS["sandwich norm"], attn_implementation="eager")
    layer = model.model.layers[0]
    with torch.no_grad():
        for norm in (layer.attn_output_layernorm, layer.mlp_output_layernorm):
            norm.weight.normal_(1, 0.5)
    hidden, position_embeddings, mask = _attention_inputs(model)
    with torch.no_grad():
        found = layer(hidden, attention_mask=mask, position_embeddings=position_embeddings)
        attended, _ = layer.self_attn(layer.input_layernorm(hidden), position_embeddings, mask)
        middle = hidden + layer.attn_output_layernorm(attended)
        expected = middle + layer.mlp_output_layernorm(layer.mlp(layer.post_attention_layernorm(middle)))
    torch.testing.assert_close(found, expected, atol=1e-6, rtol=1e-6)
    plain = Qwen3GatedForCausalLM(Qwen3GatedConfig(**SIZES))
    assert not hasattr(plain.model.layers[0], "attn_output_layernorm")  # off: transformers' layer, unchanged


def test_a_shared_gate_gives_every_head_the_same_scores():
    model = build(VARIANTS["G1 shared headwise"])
    seen = []
    attention = model.model.layers[0].self_attn
    attention.gate_override = lambda gate: seen.append(gate) or gate
    try:
        with torch.no_grad():
            model(input_ids())
    finally:
        attention.gate_override = None
    assert seen[0].shape == (2, 9, 1, 1)  # (B, T, one set for all heads, headwise)


@pytest.mark.parametrize(
    "keys,named",
    [
        ({"gate_type": "headwise", "gate_position": "dense_output"}, "no heads"),
        ({"gate_type": "elementwise", "gate_position": "dense_output", "gate_shared_across_heads": True}, "no heads"),
        ({"gate_type": "elementwise", "gate_position": "output"}, "unknown gate_position 'output'"),
        ({"gate_type": "elementwise", "gate_activation": "tanh"}, "unknown gate_activation 'tanh'"),
        ({"gate_type": "elementwise", "gate_combination": "gated"}, "unknown gate_combination 'gated'"),
        ({"gate_type": "per-channel"}, "unknown gate_type 'per-channel'"),
        ({"gate_position": "value"}, "gate_type is 'none'"),
        ({"gate_input": "none"}, "gate_input='none' describe a gate, but gate_type is 'none'"),
        ({"gate_type": "headwise", "gate_input": "x"}, "unknown gate_input 'x'; expected one of hidden_states, none"),
        ({"attn_output_transform": "gelu"}, "unknown attn_output_transform 'gelu'; expected one of none, silu"),
        ({"sandwich_norm": "yes"}, "sandwich_norm must be true or false"),
    ],
)
def test_a_gate_without_meaning_is_refused_in_one_line(keys, named):
    with pytest.raises(ValueError, match=named) as error:
        Qwen3GatedConfig(**SIZES, **keys)
    assert "\n" not in str(error.value)


def test_the_released_flags_are_written_only_for_the_released_gate():
    for name, variant in VARIANTS.items():
        saved = Qwen3GatedConfig(**SIZES, **variant).to_dict()
        released = name in ("G1 elementwise", "G1 headwise")
        assert saved[f"{variant['gate_type']}_attn_output_gate"] is released, name


def test_loading_refuses_a_gate_its_config_does_not_describe(tmp_path):
    build(VARIANTS["G2 elementwise"]).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    # the same weights said to be the released gate: g_proj has no place, q_proj lacks the gate rows
    (tmp_path / "config.json").write_text(json.dumps({**config, "gate_position": "sdpa_output"}))
    with pytest.raises(CheckpointError, match=r"q_proj\.weight has shape \(32, 32\).*expects \(64, 32\).*2 more"):
        Qwen3GatedForCausalLM.from_pretrained(tmp_path)
    # said to be a headwise value gate: g_proj's rows are those of an elementwise one
    (tmp_path / "config.json").write_text(json.dumps({**config, "gate_type": "headwise"}))
    with pytest.raises(CheckpointError, match=r"g_proj\.weight is \(16, 32\), not \(2, 32\)"):
        Qwen3GatedForCausalLM.from_pretrained(tmp_path)
    # the gate's weights missing altogether
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if "g_proj" not in k}, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="lacks weights the model needs: .*g_proj"):
        Qwen3GatedForCausalLM.from_pretrained(tmp_path)


def test_a_released_flag_gives_the_granularity_and_the_other_keys_the_rest():
    edited = {**Qwen3GatedConfig(**SIZES, gate_type="headwise").to_dict(), "gate_position": "key"}
    config = Qwen3GatedConfig.from_dict(edited)
    assert (config.gate_type, config.gate_position, config.headwise_attn_output_gate) == ("headwise", "key", False)


def test_auto_config_builds_every_key():
    config = AutoConfig.for_model("qwen3_gated", **SIZES, **VARIANTS["G3 headwise additive silu"])
    assert (config.gate_position, config.gate_activation, config.gate_combination) == ("key", "silu", "additive")


@pytest.mark.parametrize(
    "name",
    ["G2 headwise", "G5 elementwise", "G1 additive silu", "G1 input-independent", "SDPA RMSNorm", "sandwich norm"],
)
def test_the_moe_takes_every_variant(name, tmp_path):
    config = Qwen3MoeGatedConfig(**{**tiny_moe_config_dict(), **ROWS[name]})
    torch.manual_seed(0)
    model = Qwen3MoeGatedForCausalLM(config).eval()
    own_gate = config.gate_type != "none" and not config.gate_in_q_proj
    assert hasattr(model.model.layers[0].self_attn, "g_proj") is (own_gate and config.gate_input == "hidden_states")
    assert hasattr(model.model.layers[0], "mlp_output_layernorm") is config.sandwich_norm
    ids = input_ids()
    with torch.no_grad():
        logits = model(ids).logits
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, logits, atol=1e-6, rtol=0)
