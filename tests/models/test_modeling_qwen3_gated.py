import json

import pytest
import torch
from conftest import tiny_config, write_released_checkpoint
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, Qwen3Config, Qwen3ForCausalLM

from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM, Qwen3GatedForSequenceClassification
from gated_qwen.errors import CheckpointError


def load(folder, **kwargs):
    return Qwen3GatedForCausalLM.from_pretrained(folder, **kwargs).eval()


def ids(batch=2, length=9, vocab=96, seed=0):
    return torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kwargs", [{}, {"qkv_bias": True, "tie_word_embeddings": True}, {"num_key_value_heads": 4}])
def test_no_gate_equals_transformers_qwen3(kwargs):
    torch.manual_seed(0)
    gated = Qwen3GatedForCausalLM(tiny_config(gate="none", **kwargs)).eval()
    stock_config = Qwen3Config(
        **{k: v for k, v in gated.config.to_dict().items() if k in Qwen3Config.__dataclass_fields__}
    )
    stock = Qwen3ForCausalLM(stock_config).eval()
    assert set(stock.state_dict()) == set(gated.state_dict())
    stock.load_state_dict(gated.state_dict())
    with torch.no_grad():
        assert torch.equal(gated(ids()).logits, stock(ids()).logits)


def reference_without_gate(spec, layer_input_config):
    """transformers' own Qwen3 holding only the query rows of the spec: it computes the ungated SDPA output."""
    cfg = spec["config"]
    stock = Qwen3ForCausalLM(
        Qwen3Config(**{k: v for k, v in layer_input_config.to_dict().items() if k in Qwen3Config.__dataclass_fields__})
    ).eval()
    state = {k: v for k, v in spec["tensors"].items() if "q_proj" not in k}
    for i, layer in enumerate(spec["layers"]):
        state[f"model.layers.{i}.self_attn.q_proj.weight"] = torch.cat(layer["query_rows"])
        if cfg["qkv_bias"]:
            state[f"model.layers.{i}.self_attn.q_proj.bias"] = torch.cat(layer["query_bias"])
    if not cfg["use_qk_norm"]:
        for layer in stock.model.layers:
            layer.self_attn.q_norm, layer.self_attn.k_norm = nn.Identity(), nn.Identity()
    missing, unexpected = stock.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    if cfg["tie_word_embeddings"]:
        stock.tie_weights()
    return stock


def o_proj_input(model, inputs):
    captured = {}

    def keep(name):
        def hook(module, args):
            captured[name] = args[0]  # returns None: the forward is left as it is

        return hook

    attn = model.model.layers[0].self_attn
    hooks = [attn.q_proj.register_forward_pre_hook(keep("x")), attn.o_proj.register_forward_pre_hook(keep("o_in"))]
    with torch.no_grad():
        model(inputs)
    for hook in hooks:
        hook.remove()
    return captured["x"], captured["o_in"]


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
@pytest.mark.parametrize("num_key_value_heads", [2, 4])  # 2 query heads per kv head, and 1
@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("use_qk_norm", [True, False])
@pytest.mark.parametrize("tie_word_embeddings", [False, True])
def test_applied_gate_is_sigmoid_of_the_written_rows(
    released_checkpoint, gate, num_key_value_heads, qkv_bias, use_qk_norm, tie_word_embeddings
):
    folder, spec = released_checkpoint(
        gate=gate,
        num_key_value_heads=num_key_value_heads,
        qkv_bias=qkv_bias,
        use_qk_norm=use_qk_norm,
        tie_word_embeddings=tie_word_embeddings,
        num_hidden_layers=1,
        gate_scale=2.0,
    )
    model = load(folder, attn_implementation="eager")
    assert model.config.gate_type == gate
    inputs = ids()
    x, gated_out = o_proj_input(model, inputs)  # (B, T, hidden), (B, T, H*D)
    _, ungated_out = o_proj_input(reference_without_gate(spec, model.config), inputs)

    layer = spec["layers"][0]
    H, D = model.config.num_attention_heads, model.config.head_dim
    for h in range(H):
        logits = x @ layer["gate_rows"][h].T  # (B, T, g)
        if qkv_bias:
            logits = logits + layer["gate_bias"][h]
        expected = ungated_out[..., h * D : (h + 1) * D] * torch.sigmoid(logits)
        torch.testing.assert_close(gated_out[..., h * D : (h + 1) * D], expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(gated_out, ungated_out * 0.5, atol=1e-3)  # the gate is not trivial here


@pytest.fixture
def headwise(released_checkpoint):
    folder, _ = released_checkpoint(gate="headwise", gate_scale=2.0)
    return folder


def test_attention_implementations_agree(headwise):
    model = load(headwise)
    inputs = ids()
    outputs = {}
    with torch.no_grad():
        for implementation in ("eager", "sdpa", "flex_attention"):
            model.set_attn_implementation(implementation)
            outputs[implementation] = model(inputs).logits
    torch.testing.assert_close(outputs["sdpa"], outputs["eager"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outputs["flex_attention"], outputs["eager"], rtol=1e-5, atol=1e-5)


def test_output_attentions_returns_causal_probabilities(headwise):
    model = load(headwise, attn_implementation="eager")
    with torch.no_grad():
        attentions = model(ids(), output_attentions=True).attentions
    assert len(attentions) == model.config.num_hidden_layers
    assert attentions[0].shape == (2, model.config.num_attention_heads, 9, 9)
    torch.testing.assert_close(attentions[0].sum(-1), torch.ones(2, 4, 9))
    assert torch.all(attentions[0].triu(1) == 0)


def uncached_greedy(model, inputs, steps):
    sequence = inputs
    with torch.no_grad():
        for _ in range(steps):
            next_token = model(sequence, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, next_token], dim=-1)
    return sequence


@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_cached_greedy_decoding_equals_uncached_forward(headwise, cache_implementation):
    model = load(headwise)
    inputs = ids(batch=1, length=5)
    generated = model.generate(
        inputs,
        max_new_tokens=8,
        do_sample=False,
        cache_implementation=cache_implementation,
        pad_token_id=0,
        eos_token_id=None,
    )
    assert torch.equal(generated, uncached_greedy(model, inputs, 8))


@pytest.mark.parametrize("keyword", ["cache", "past_key_values"])
def test_attention_reads_the_cache_under_either_keyword(headwise, keyword):
    # transformers before 5.24 hands the attention its cache as past_key_values, 5.24 and later as cache;
    # a cache under the name the attention did not read would be left empty and decoding silently wrong.
    from transformers import DynamicCache

    model = load(headwise, attn_implementation="sdpa")
    attention = model.model.layers[0].self_attn
    x = torch.randn(1, 6, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    cos, sin = model.model.rotary_emb(x, torch.arange(6)[None])
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        whole, _ = attention(x, (cos, sin), None)
        attention(x[:, :5], (cos[:, :5], sin[:, :5]), None, **{keyword: cache})
        step, _ = attention(x[:, 5:], (cos[:, 5:], sin[:, 5:]), None, **{keyword: cache})
    assert cache.get_seq_length() == 6
    torch.testing.assert_close(step, whole[:, 5:], rtol=1e-5, atol=1e-6)


def test_the_old_cache_keyword_warns_exactly_when_qwen3s_attention_warns(headwise):
    """transformers' deprecate_kwarg renames `past_key_values`: a FutureWarning where Qwen3's own attention gives one
    (5.24 and later, where it is the user's call), none before (where transformers' decoder layers pass it)."""
    import warnings

    from transformers import DynamicCache
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

    model = load(headwise, attn_implementation="sdpa")
    x = torch.randn(1, 3, model.config.hidden_size)
    cos, sin = model.model.rotary_emb(x, torch.arange(3)[None])
    stock = Qwen3Attention(model.config, layer_idx=0)
    stock.config._attn_implementation = "sdpa"
    warned = {}
    for name, attention in (("gated", model.model.layers[0].self_attn), ("qwen3", stock)):
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            attention(x, (cos, sin), None, past_key_values=DynamicCache(config=model.config))
        warned[name] = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert bool(warned["gated"]) == bool(warned["qwen3"]), warned
    assert all("Use `cache` instead" in message for message in warned["gated"]), warned


def sdpa_returning_tokens_by_heads(module, query, key, value, attention_mask, **kwargs):
    """sdpa, its output laid out as vLLM's attention interface returns it: (B*T, H*D), not (B, T, H, D)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    output, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return output.reshape(-1, output.shape[-2] * output.shape[-1]), weights


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_gate_applies_per_head_whatever_layout_the_attention_interface_returns(released_checkpoint, gate):
    from transformers import AttentionInterface

    AttentionInterface.register("sdpa_tokens_by_heads", sdpa_returning_tokens_by_heads)
    folder, _ = released_checkpoint(gate=gate, gate_scale=2.0)
    inputs = ids(batch=1)  # vLLM runs a batch as one sequence of tokens
    with torch.no_grad():
        reference = load(folder, attn_implementation="sdpa")(inputs).logits
        flat = load(folder, attn_implementation="sdpa_tokens_by_heads")(inputs).logits
    assert torch.equal(flat, reference)


def test_left_padded_batch_equals_each_row_alone(headwise):
    model = load(headwise)
    rows = [ids(1, 7, seed=1)[0], ids(1, 4, seed=2)[0]]
    width = max(len(r) for r in rows)
    batch = torch.stack([torch.cat([torch.zeros(width - len(r), dtype=torch.long), r]) for r in rows])
    mask = torch.stack([torch.cat([torch.zeros(width - len(r)), torch.ones(len(r))]) for r in rows]).long()
    with torch.no_grad():
        batched = model(batch, attention_mask=mask).logits
        for i, row in enumerate(rows):
            alone = model(row[None]).logits[0]
            torch.testing.assert_close(batched[i, width - len(row) :], alone, rtol=1e-4, atol=1e-5)
    generated = model.generate(
        batch, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=None
    )
    for i, row in enumerate(rows):
        alone = model.generate(row[None], max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=None)
        assert torch.equal(generated[i, width:], alone[0, len(row) :])


def test_save_and_reload_through_auto_model(headwise, tmp_path):
    model = load(headwise)
    model.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert saved["model_type"] == "qwen3_gated" and saved["headwise_attn_output_gate"] is True
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    assert type(reloaded) is Qwen3GatedForCausalLM
    with torch.no_grad():
        assert torch.equal(reloaded(ids()).logits, model(ids()).logits)


def test_sequence_classification_through_auto_classes(headwise):
    config = Qwen3GatedConfig.from_pretrained(headwise)
    config.pad_token_id = 0
    classifier = AutoModelForSequenceClassification.from_config(config)
    assert type(classifier) is Qwen3GatedForSequenceClassification
    assert classifier(ids()).logits.shape == (2, 2)
    # from a causal-LM checkpoint: the decoder loads exactly, the score head starts fresh
    loaded = Qwen3GatedForSequenceClassification.from_pretrained(headwise, pad_token_id=0)
    assert type(loaded) is Qwen3GatedForSequenceClassification
    assert torch.equal(loaded.model.embed_tokens.weight, load(headwise).model.embed_tokens.weight)


@pytest.mark.parametrize(
    "written,declared",
    [("headwise", "elementwise"), ("headwise", "none"), ("elementwise", "headwise"), ("none", "headwise")],
)
def test_a_q_proj_that_does_not_fit_the_config_is_refused(tmp_path, written, declared):
    write_released_checkpoint(tmp_path, gate=written)
    config = json.loads((tmp_path / "config.json").read_text())
    config["headwise_attn_output_gate"] = declared == "headwise"
    config["elementwise_attn_output_gate"] = declared == "elementwise"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        load(tmp_path)
    message = str(error.value)
    rows = {"none": 32, "headwise": 36, "elementwise": 64}
    assert "model.layers.0.self_attn.q_proj.weight" in message
    assert f"({rows[written]}, 32)" in message and f"({rows[declared]}, 32)" in message
    assert f"a {written!r} gate" in message


@pytest.mark.parametrize(
    "written,declared,kind",
    [
        ({"use_qk_norm": True}, {"use_qk_norm": False}, "no place for"),
        ({"use_qk_norm": False}, {"use_qk_norm": True}, "lacks"),
        ({"qkv_bias": True}, {"qkv_bias": False}, "no place for"),
        ({"tie_word_embeddings": True}, {"tie_word_embeddings": False}, "lacks"),
    ],
)
def test_no_weight_is_silently_dropped_or_initialised(tmp_path, written, declared, kind):
    write_released_checkpoint(tmp_path, **written)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(declared)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=kind):
        load(tmp_path)


def test_code_beside_the_weights_is_never_imported(headwise):
    assert "raise RuntimeError" in (headwise / "modeling_qwen3.py").read_text()
    assert load(headwise).config.gate_type == "headwise"
    with pytest.raises(CheckpointError, match="trust_remote_code"):
        load(headwise, trust_remote_code=True)


def test_bf16_forward_stays_close_to_fp32(headwise):
    fp32 = load(headwise)
    bf16 = load(headwise, dtype=torch.bfloat16)
    assert bf16.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    with torch.no_grad():
        reference, low = fp32(ids()).logits, bf16(ids()).logits.float()
    assert (low - reference).abs().max() < 0.05 * reference.abs().max()
    assert (
        torch.equal(low.argmax(-1), reference.argmax(-1))
        or (low.argmax(-1) == reference.argmax(-1)).float().mean() > 0.9
    )


def test_gradient_checkpointing_gives_the_same_gradients(headwise):
    grads = []
    for checkpointing in (False, True):
        model = load(headwise).train()
        if checkpointing:
            # transformers 5.24 renamed gradient_checkpointing_enable; the floor has only the old name.
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
        inputs = ids()
        model(inputs, labels=inputs).loss.backward()
        grads.append(model.model.layers[0].self_attn.q_proj.weight.grad)
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[1], grads[0])


def test_device_map_keeps_decoder_layers_whole(released_checkpoint, tmp_path):
    from accelerate import infer_auto_device_map, init_empty_weights
    from accelerate.utils import compute_module_sizes

    folder, _ = released_checkpoint(gate="headwise", hidden_size=64, num_hidden_layers=4)
    with init_empty_weights():
        empty = Qwen3GatedForCausalLM(Qwen3GatedConfig.from_pretrained(folder))
    sizes = compute_module_sizes(empty)
    # room on "cpu" for the embedding and 2.5 layers: the rest goes to disk, cut at a layer boundary
    budget = {"cpu": sizes["model.embed_tokens"] + 2.5 * sizes["model.layers.0"], "disk": 10**9}
    device_map = infer_auto_device_map(empty, max_memory=budget, no_split_module_classes=empty._no_split_modules)
    assert set(device_map.values()) == {"cpu", "disk"}
    assert all(key.count(".") <= 2 for key in device_map if key.startswith("model.layers"))
    offloaded = load(folder, device_map=device_map, offload_folder=str(tmp_path / "offload"))
    with torch.no_grad():
        assert torch.equal(offloaded(ids()).logits, load(folder)(ids()).logits)


def test_tensor_parallel_plan_shards_q_proj_with_its_gate_rows():
    plan = Qwen3GatedConfig.base_model_tp_plan
    assert plan["layers.*.self_attn.q_proj"] == "colwise" and plan["layers.*.self_attn.o_proj"] == "rowwise"
    # A colwise shard of a headwise q_proj (K=2 over 2 ranks) holds whole kv groups: its local split,
    # with K read from its k_proj shard as the forward does, is the matching half of the global one.
    from gated_qwen.models.layout import split_query_and_gate

    weight = torch.randn(2 * (2 * 8 + 2), 32)  # K=2, G=2, D=8, g=1
    query, gate = split_query_and_gate(weight, 2, 8, 1, dim=0)
    for rank, shard in enumerate(weight.chunk(2, dim=0)):
        local_query, local_gate = split_query_and_gate(shard, 1, 8, 1, dim=0)
        assert torch.equal(local_query, query[rank : rank + 1]) and torch.equal(local_gate, gate[rank : rank + 1])


# ---------------------------------------------------------------------------------------------- the released layout


@pytest.mark.parametrize("gate", ["none", "headwise", "elementwise"])
def test_released_bin_gives_the_logits_of_the_same_weights_as_safetensors(tmp_path, gate):
    """The release as it is (model_type qwen2, one pytorch_model.bin, no head_dim) loads to the same model."""
    write_released_checkpoint(tmp_path / "bin", gate=gate, dtype=torch.bfloat16)
    write_released_checkpoint(tmp_path / "safetensors", gate=gate, dtype=torch.bfloat16, weights="safetensors")
    config = json.loads((tmp_path / "bin" / "config.json").read_text())
    assert (
        config["model_type"] == "qwen2"
        and "head_dim" not in config
        and sorted(p.name for p in (tmp_path / "bin").iterdir())
        == ["config.json", "configuration_qwen3.py", "modeling_qwen3.py", "pytorch_model.bin"]
    )
    from_bin, from_safetensors = load(tmp_path / "bin", dtype="auto"), load(tmp_path / "safetensors", dtype="auto")
    assert from_bin.dtype == torch.bfloat16 and from_bin.config.head_dim == 8 and from_bin.config.gate_type == gate
    with torch.no_grad():
        assert torch.equal(from_bin(ids()).logits, from_safetensors(ids()).logits)


def test_missing_head_dim_means_hidden_over_heads(tmp_path):
    """Not transformers' Qwen3 default of 128: the authors' code computes hidden_size / num_attention_heads."""
    write_released_checkpoint(tmp_path, hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=12)
    assert "head_dim" not in json.loads((tmp_path / "config.json").read_text())
    model = load(tmp_path)
    assert model.config.head_dim == 12 and model.model.layers[0].self_attn.q_proj.weight.shape == (4 * 12 + 4, 48)


def test_a_genuine_qwen2_checkpoint_is_refused(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).save_pretrained(tmp_path, safe_serialization=False)
    with pytest.raises(CheckpointError, match="is a Qwen2 model .*biases on q/k/v, no QK-norm.*Qwen2ForCausalLM"):
        load(tmp_path)


def test_a_headwise_bin_under_an_elementwise_config_names_layer_and_shapes_before_loading(tmp_path, monkeypatch):
    write_released_checkpoint(tmp_path, gate="headwise")
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(headwise_attn_output_gate=False, elementwise_attn_output_gate=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(k["map_location"]) or real_load(*a, **k))
    with pytest.raises(
        CheckpointError, match=r"q_proj.weight has shape \(36, 32\).*expects \(64, 32\).*'headwise' gate"
    ):
        load(tmp_path)
    assert loads == ["meta"]  # the shapes came from the pickle alone; no tensor data was read


class Payload:
    """Unpickling this runs code: it makes the folder it names."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        import os

        return (os.mkdir, (self.path,))


def test_a_bin_whose_pickle_would_run_code_is_refused_in_one_line(tmp_path):
    spec = write_released_checkpoint(tmp_path / "arm")
    torch.save(
        {**spec["tensors"], "model.norm.weight": Payload(tmp_path / "payload-ran")},
        tmp_path / "arm" / "pytorch_model.bin",
    )
    with pytest.raises(CheckpointError, match="pytorch_model.bin holds a pickle that is not plain tensors") as error:
        load(tmp_path / "arm")
    assert "\n" not in str(error.value) and not (tmp_path / "payload-ran").exists()


def test_hub_subfolder_fetches_only_what_loading_needs(tmp_path, monkeypatch):
    """from_pretrained("QwQZh/gated_attention", subfolder=...) against a hub cache laid out like the real repo:
    config, weights and generation config are fetched; the authors' .py files beside them never are."""
    import huggingface_hub.constants
    import transformers.utils.hub as transformers_hub
    from conftest import write_released_arm

    commit = "aad415c45ec6b4fa727ef3ff3f4e9f62f958d49b"
    repo = tmp_path / "cache" / "models--QwQZh--gated_attention"
    spec = write_released_arm(repo / "snapshots" / commit / "1B_gate_headwise", vocab_size=300)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    asked = []  # every file transformers resolves, from the cache or by download
    for name in ("try_to_load_from_cache", "hf_hub_download"):
        real = getattr(transformers_hub, name)
        monkeypatch.setattr(
            transformers_hub,
            name,
            lambda repo_id, filename, _real=real, **k: asked.append(filename) or _real(repo_id, filename, **k),
        )
    monkeypatch.setattr(
        transformers_hub,
        "snapshot_download",
        lambda *a, **k: pytest.fail(f"snapshot_download {k.get('allow_patterns')}"),
    )
    model = load("QwQZh/gated_attention", subfolder="1B_gate_headwise", cache_dir=tmp_path / "cache")
    assert model.config.gate_type == "headwise"
    assert torch.equal(model.model.norm.weight, spec["tensors"]["model.norm.weight"])
    asked = {name.rpartition("/")[2] for name in asked}
    assert {"config.json", "pytorch_model.bin"} <= asked and not [name for name in asked if name.endswith(".py")], (
        asked
    )


# Loading follows transformers' conventions for task heads, explicit state dicts and ignore_mismatched_sizes,
# and stays strict where a mismatch means the config does not describe the weights.


def test_causal_lm_generates_through_qwen3s_generation_mixin():
    from transformers import GenerationMixin

    from gated_qwen import Qwen3MoeGatedForCausalLM

    for causal_lm in (Qwen3GatedForCausalLM, Qwen3MoeGatedForCausalLM):
        assert issubclass(causal_lm, GenerationMixin) and causal_lm.can_generate()
        assert GenerationMixin not in causal_lm.__bases__  # inherited through Qwen3's causal LM, not listed again


def test_a_bare_model_checkpoint_loads_into_the_causal_lm_with_a_fresh_head(tmp_path):
    from gated_qwen import Qwen3GatedModel

    bare = Qwen3GatedModel(tiny_config(gate="headwise"))
    bare.save_pretrained(tmp_path)
    model, info = Qwen3GatedForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert set(info["missing_keys"]) == {"lm_head.weight"}
    assert torch.equal(model.model.layers[1].self_attn.q_proj.weight, bare.layers[1].self_attn.q_proj.weight)


def test_a_causal_lm_checkpoint_without_its_head_is_refused(tmp_path):
    write_released_checkpoint(tmp_path, tie_word_embeddings=True)  # no lm_head.weight in the file
    config = json.loads((tmp_path / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"lacks weights the model needs: lm_head\.weight"):
        load(tmp_path)


def test_an_explicit_state_dict_is_loaded_as_transformers_does():
    config = tiny_config(gate="elementwise")
    model, info = Qwen3GatedForCausalLM.from_pretrained(None, config=config, state_dict={}, output_loading_info=True)
    assert set(info["missing_keys"]) == set(model.state_dict())  # everything initialised, and reported
    source = Qwen3GatedForCausalLM(config)
    partial = {k: v for k, v in source.state_dict().items() if ".layers.1." not in k}
    model, info = Qwen3GatedForCausalLM.from_pretrained(
        None, config=config, state_dict=partial, output_loading_info=True
    )
    assert info["missing_keys"] and all(".layers.1." in key for key in info["missing_keys"])
    assert torch.equal(model.model.layers[0].self_attn.q_proj.weight, source.model.layers[0].self_attn.q_proj.weight)


def test_a_checkpoint_of_none_of_the_model_weights_is_reported_not_refused(tmp_path):
    from safetensors.torch import save_file

    Qwen3GatedForCausalLM(tiny_config()).save_pretrained(tmp_path)
    save_file({"tensor": torch.tensor([1, 2])}, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    model, info = Qwen3GatedForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert set(info["unexpected_keys"]) == {"tensor"}
    assert set(info["missing_keys"]) == set(model.state_dict())


def test_a_released_arm_missing_part_of_its_decoder_is_refused(tmp_path):
    write_released_checkpoint(tmp_path, gate="headwise")  # one pytorch_model.bin, as released
    tensors = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    del tensors["model.layers.1.mlp.down_proj.weight"], tensors["model.layers.1.input_layernorm.weight"]
    torch.save(tensors, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"lacks weights the model needs: model\.layers\.1\.input_layernorm"):
        load(tmp_path)


def test_task_heads_follow_transformers(tmp_path):
    from gated_qwen import Qwen3GatedModel

    config = tiny_config(gate="headwise")
    config.pad_token_id = 0
    Qwen3GatedForSequenceClassification(config).save_pretrained(tmp_path / "classifier")
    # a classifier checkpoint into the bare model: the score head is dropped and reported
    bare, info = Qwen3GatedModel.from_pretrained(tmp_path / "classifier", output_loading_info=True)
    assert set(info["unexpected_keys"]) == {"score.weight"} and not info["missing_keys"]
    # ... into a classifier with another number of labels: an error, unless ignore_mismatched_sizes
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        Qwen3GatedForSequenceClassification.from_pretrained(tmp_path / "classifier", num_labels=5)
    resized, info = Qwen3GatedForSequenceClassification.from_pretrained(
        tmp_path / "classifier", num_labels=5, ignore_mismatched_sizes=True, output_loading_info=True
    )
    assert resized.score.weight.shape == (5, 32)
    assert [key for key, *_ in info["mismatched_keys"]] == ["score.weight"]


def test_ignore_mismatched_sizes_does_not_reinitialise_gate_rows(tmp_path):
    write_released_checkpoint(tmp_path, gate="headwise")
    with pytest.raises(CheckpointError, match="q_proj"):
        load(
            tmp_path, headwise_attn_output_gate=False, elementwise_attn_output_gate=True, ignore_mismatched_sizes=True
        )


def test_strict_false_loads_as_transformers_does(tmp_path):
    write_released_checkpoint(tmp_path, qkv_bias=True)
    config = json.loads((tmp_path / "config.json").read_text())
    config["qkv_bias"] = False
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="strict=False"):
        load(tmp_path)
    model, info = Qwen3GatedForCausalLM.from_pretrained(tmp_path, strict=False, output_loading_info=True)
    assert "model.layers.0.self_attn.q_proj.bias" in info["unexpected_keys"]
    assert model.model.layers[0].self_attn.q_proj.bias is None
