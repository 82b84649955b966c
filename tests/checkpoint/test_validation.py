"""Issue 21: a config that does not describe its weights is refused from the headers, before anything is built.

The arm is small and in the released layout (model_type "qwen2", one pytorch_model.bin unless said otherwise):
2 layers, hidden 64, vocabulary 320, MLP 128, 4 query heads on 2 kv heads of dim 16. Each row of the issue's
table edits one key of its config.json. Model construction is made to fail the test (``no_model_built``), so
a refusal that comes only after building (or a check that is gone) fails at once instead of allocating what
the config claims; ``deadline`` turns a hang into a failure.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
import torch
from conftest import write_released_checkpoint
from safetensors.torch import save_file

from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM, Qwen3MoeGatedConfig
from gated_qwen.checkpoint import TensorInfo, check_weights_match_config, weight_disagreements
from gated_qwen.errors import CheckpointError
from gated_qwen.models.qwen3_gated import modeling_qwen3_gated


REPO = Path(__file__).resolve().parents[2]
ARM = {
    "gate": "headwise",
    "hidden_size": 64,
    "vocab_size": 320,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}

# The issue's table: the key edited, its value, and what the message must say about it.
ROWS = {
    "20,000 layers": (
        {"num_hidden_layers": 20000},
        "config.json says num_hidden_layers 20000, but the checkpoint holds 2 layers",
    ),
    "vocabulary 500,000,000": (
        {"vocab_size": 500_000_000},
        "config.json says vocab_size 500000000, but model.embed_tokens.weight is (320, 64), not (500000000, 64)",
    ),
    "MLP 50,000,000": (
        {"intermediate_size": 50_000_000},
        "config.json says intermediate_size 50000000, but model.layers.0.mlp.down_proj.weight is (64, 128), not (64, 50000000)",
    ),
    "4 kv heads": (
        {"num_key_value_heads": 4},
        "config.json says num_key_value_heads 4 and head_dim 16, but model.layers.0.self_attn.k_proj.weight is (32, 64), not (64, 64)",
    ),
    "1 layer": (
        {"num_hidden_layers": 1},
        "config.json says num_hidden_layers 1, but the checkpoint holds 2 layers, up to model.layers.1",
    ),
}


def edit_config(folder: Path, **changes) -> Path:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def arm(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("arm") / "released"
    write_released_checkpoint(folder, **ARM)
    return folder


@pytest.fixture
def edited_arm(arm, tmp_path):
    """Factory: a copy of the arm with its config.json edited."""

    def make(**changes) -> Path:
        folder = tmp_path / "edited"
        shutil.copytree(arm, folder)
        return edit_config(folder, **changes)

    return make


@pytest.fixture
def no_model_built(monkeypatch):
    """Building the decoder fails the test unless on the meta device (where nothing is allocated: the check
    reads what the config implies from such a skeleton), and only with the layers the checkpoint holds: the
    refusal must come from the headers, before anything is allocated."""
    build = modeling_qwen3_gated.Qwen3GatedModel.__init__

    def refuse(self, config):
        if torch.get_default_device().type != "meta" or config.num_hidden_layers > 2:
            raise AssertionError(
                f"a model was built for {config.num_hidden_layers} layers, vocabulary {config.vocab_size}"
            )
        build(self, config)

    monkeypatch.setattr(modeling_qwen3_gated.Qwen3GatedModel, "__init__", refuse)


@pytest.fixture
def deadline():
    """A hang becomes a failure after 60 s (SIGALRM in the main thread, where pytest runs the test)."""

    def expire(signum, frame):
        raise TimeoutError("still running after 60 s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_the_arm_itself_loads(arm):
    """The rows below are refused because of their edit, not because the arm is unloadable."""
    model = Qwen3GatedForCausalLM.from_pretrained(arm)
    assert model.config.num_hidden_layers == 2 and model.model.embed_tokens.weight.shape == (320, 64)


@pytest.mark.parametrize("row", ROWS)
def test_each_row_of_the_issue_is_refused_by_from_pretrained_before_anything_is_built(
    edited_arm, row, no_model_built, deadline
):
    changes, message = ROWS[row]
    folder = edited_arm(**changes)
    with pytest.raises(CheckpointError) as error:
        Qwen3GatedForCausalLM.from_pretrained(folder)
    text = str(error.value)
    assert message in text, text
    assert text.startswith(f"{folder}: ") and "strict=False" in text and "\n" not in text


def test_strict_false_leaves_it_to_transformers(edited_arm):
    # transformers loads the first layer and drops the second, and says so
    model, info = Qwen3GatedForCausalLM.from_pretrained(
        edited_arm(num_hidden_layers=1), strict=False, output_loading_info=True
    )
    assert len(model.model.layers) == 1 and any(key.startswith("model.layers.1.") for key in info["unexpected_keys"])


def test_strict_false_gives_transformers_own_error_for_differing_sizes(edited_arm):
    # a vocabulary a little larger than the weights' (not 500,000,000: transformers would allocate it)
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes") as error:
        Qwen3GatedForCausalLM.from_pretrained(edited_arm(vocab_size=400), strict=False)
    assert "config.json says" not in str(error.value)  # the check did not run


def test_ignore_mismatched_sizes_re_initialises_a_differing_vocabulary_as_transformers_does(edited_arm):
    folder = edited_arm(vocab_size=400)
    model, info = Qwen3GatedForCausalLM.from_pretrained(folder, ignore_mismatched_sizes=True, output_loading_info=True)
    assert model.model.embed_tokens.weight.shape == (400, 64)
    assert {key for key, *_ in info["mismatched_keys"]} == {"model.embed_tokens.weight", "lm_head.weight"}


@pytest.mark.parametrize("weights", ["bin", "safetensors"])
def test_a_safetensors_arm_and_a_bin_arm_are_read_alike(tmp_path, weights, no_model_built):
    """The .bin's shapes come from its pickle read without data; the safetensors' from its header."""
    write_released_checkpoint(tmp_path, weights=weights, **ARM)
    edit_config(tmp_path, num_key_value_heads=4)
    with pytest.raises(
        CheckpointError,
        match=r"num_key_value_heads 4 and head_dim 16, but model\.layers\.0\.self_attn\.k_proj\.weight is \(32, 64\)",
    ):
        Qwen3GatedForCausalLM.from_pretrained(tmp_path)


def write_two_shards(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    """model.safetensors.index.json over two shards: layer 1 in the second, everything else in the first."""
    second = {k: v for k, v in tensors.items() if k.startswith("model.layers.1.")}
    first = {k: v for k, v in tensors.items() if k not in second}
    weight_map = {}
    for number, shard in enumerate((first, second), start=1):
        name = f"model-0000{number}-of-00002.safetensors"
        save_file(shard, str(folder / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_a_sharded_checkpoint_that_disagrees_in_its_second_shard_only(tmp_path, no_model_built):
    spec = write_released_checkpoint(tmp_path, **ARM)
    (tmp_path / "pytorch_model.bin").unlink()
    tensors = dict(spec["tensors"])
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(96, 64)  # the config says intermediate_size 128
    write_two_shards(tmp_path, tensors)
    with pytest.raises(
        CheckpointError,
        match=r"intermediate_size 128, but model\.layers\.1\.mlp\.up_proj\.weight is \(96, 64\), not \(128, 64\)",
    ):
        Qwen3GatedForCausalLM.from_pretrained(tmp_path)


def test_a_sharded_checkpoint_that_agrees_loads(tmp_path):
    spec = write_released_checkpoint(tmp_path, **ARM)
    (tmp_path / "pytorch_model.bin").unlink()
    write_two_shards(tmp_path, spec["tensors"])
    model = Qwen3GatedForCausalLM.from_pretrained(tmp_path)
    assert torch.equal(model.model.layers[1].mlp.up_proj.weight, spec["tensors"]["model.layers.1.mlp.up_proj.weight"])


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"qkv_bias": True},
            r"config.json says qkv_bias True, but the checkpoint lacks weights the model needs: model\.layers\.0\.self_attn\.k_proj\.bias",
        ),
        (
            {"use_qk_norm": False},
            r"config.json says use_qk_norm False, but the checkpoint has model\.layers\.0\.self_attn\.k_norm\.weight.*no place for",
        ),
        (
            {"head_dim": 8},
            r"q_proj\.weight has shape \(68, 64\) but the config \(gate type 'headwise', 4 heads of dim 8\) expects \(36, 64\)",
        ),
        (
            {"hidden_size": 128},
            r"config.json says hidden_size 128, but model\.embed_tokens\.weight is \(320, 64\), not \(320, 128\) \(and \d+ more disagreements\)",
        ),
        ({"num_hidden_layers": 3}, r"config.json says num_hidden_layers 3, but the checkpoint holds 2 layers\."),
    ],
    ids=["biases", "qk-norm", "head_dim", "hidden", "a layer short"],
)
def test_other_disagreements_name_their_key(edited_arm, changes, message, no_model_built):
    with pytest.raises(CheckpointError, match=message):
        Qwen3GatedForCausalLM.from_pretrained(edited_arm(**changes))


def test_a_layer_missing_in_the_middle_is_named(arm):
    tensors = {
        name: TensorInfo(tuple(t.shape), "F32")
        for name, t in torch.load(arm / "pytorch_model.bin", weights_only=True).items()
    }
    renamed = {name.replace("layers.1.", "layers.2."): info for name, info in tensors.items()}  # layers 0 and 2 of 3
    config = Qwen3GatedConfig.from_pretrained(arm, num_hidden_layers=3)
    assert (
        weight_disagreements(config, renamed)[0]
        == "config.json says num_hidden_layers 3, but the checkpoint holds 2 layers (none numbered 1)"
    )


def test_the_embedding_and_final_norm_are_required_from_the_headers(arm, no_model_built):
    tensors = {
        name: TensorInfo(tuple(t.shape), "F32")
        for name, t in torch.load(arm / "pytorch_model.bin", weights_only=True).items()
    }
    config = Qwen3GatedConfig.from_pretrained(arm)
    assert weight_disagreements(config, tensors) == []
    without = {k: v for k, v in tensors.items() if k not in ("model.embed_tokens.weight", "model.norm.weight")}
    assert weight_disagreements(config, without) == [
        "the checkpoint lacks weights the model needs: model.embed_tokens.weight, model.norm.weight"
    ]
    bare = {k.removeprefix("model."): v for k, v in without.items()}  # a bare model's names, no prefix
    assert "lacks weights the model needs: embed_tokens.weight, norm.weight" in weight_disagreements(config, bare)[0]
    # the embedding and the norm alone: part of the decoder, without its layers
    outside = {k: v for k, v in tensors.items() if ".layers." not in k}
    assert weight_disagreements(config, outside) == [
        "config.json says num_hidden_layers 2, but the checkpoint holds 0 layers"
    ]
    assert weight_disagreements(config, {"tensor": TensorInfo((2,), "I64")}) == []  # none of it: transformers says
    path = arm.parent / "no_norm"
    shutil.copytree(arm, path, dirs_exist_ok=True)
    torch.save(
        {
            k: v
            for k, v in torch.load(arm / "pytorch_model.bin", weights_only=True).items()
            if k != "model.norm.weight"
        },
        path / "pytorch_model.bin",
    )
    with pytest.raises(CheckpointError, match=r"lacks weights the model needs: model\.norm\.weight\. The config"):
        Qwen3GatedForCausalLM.from_pretrained(path)


# ---------------------------------------------------------------------------------------------- the real arms' configs


def released_header(config: dict) -> dict[str, TensorInfo]:
    """The tensor names and shapes of a released arm, written out from the released format (shared/RELEASED_FORMAT.md)
    by hand, not through the rule under test; no tensor is allocated."""
    H, K, D, h = (
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
        config["hidden_size"],
    )
    V, inner = config["vocab_size"], config["intermediate_size"]
    g = D if config["elementwise_attn_output_gate"] else int(config["headwise_attn_output_gate"])
    header = {"model.embed_tokens.weight": (V, h), "model.norm.weight": (h,)}
    if not config["tie_word_embeddings"]:
        header["lm_head.weight"] = (V, h)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        header.update({
            p + "self_attn.q_proj.weight": (H * D + H * g, h), p + "self_attn.k_proj.weight": (K * D, h),
            p + "self_attn.v_proj.weight": (K * D, h), p + "self_attn.o_proj.weight": (h, H * D),
            p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,),
            p + "mlp.gate_proj.weight": (inner, h), p + "mlp.up_proj.weight": (inner, h), p + "mlp.down_proj.weight": (h, inner),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        })  # fmt: skip
    return {name: TensorInfo(shape, "BF16") for name, shape in header.items()}


@pytest.mark.parametrize("name", ["1B_baseline", "1B_gate_headwise", "1B_gate_elementwise"])
def test_the_real_arms_configs_pass_against_their_own_headers(name):
    config_dict = json.loads((REPO / "gated_qwen" / "configs" / f"{name}.json").read_text())
    header = released_header(config_dict)
    config = Qwen3GatedConfig.from_dict(config_dict)
    assert sum(info.numel for info in header.values()) > 1.5e9  # the real size, from headers alone
    check_weights_match_config(config, header, name)
    # ... and the same header under a sibling arm's gate is refused (the check is not vacuous here)
    other = "elementwise" if config.gate_type != "elementwise" else "headwise"
    sibling = Qwen3GatedConfig.from_dict(
        {
            **config_dict,
            "headwise_attn_output_gate": other == "headwise",
            "elementwise_attn_output_gate": other == "elementwise",
        }
    )
    with pytest.raises(CheckpointError, match="q_proj"):
        check_weights_match_config(sibling, header, name)


# ---------------------------------------------------------------------------------------------- another model type


def test_another_model_type_adds_its_shapes_without_changing_the_check(arm):
    dense = Qwen3GatedConfig.from_pretrained(arm)
    tensors = {
        name: TensorInfo(tuple(t.shape), "F32")
        for name, t in torch.load(arm / "pytorch_model.bin", weights_only=True).items()
    }
    for layer in range(2):  # the dense MLP replaced by a router and two experts
        for part in ("gate_proj", "up_proj", "down_proj"):
            del tensors[f"model.layers.{layer}.mlp.{part}.weight"]
        tensors[f"model.layers.{layer}.mlp.gate.weight"] = TensorInfo((2, 64), "F32")
        for expert in range(2):
            for part, shape in (("gate_proj", (32, 64)), ("up_proj", (32, 64)), ("down_proj", (64, 32))):
                tensors[f"model.layers.{layer}.mlp.experts.{expert}.{part}.weight"] = TensorInfo(shape, "F32")
    # The dense type has no place for them: reported as such, not a crash on names it does not know.
    assert any("mlp.experts" in s and "no place for" in s for s in weight_disagreements(dense, tensors))

    # The MoE family's model reads the same tensors through the same check.
    values = {**dense.to_dict(), "moe_intermediate_size": 32, "num_experts": 2, "num_experts_per_tok": 1}
    moe = Qwen3MoeGatedConfig.from_dict({**values, "model_type": "qwen3_moe_gated", "mlp_only_layers": []})
    assert weight_disagreements(moe, tensors) == []
    # a third expert the config does not count, and a missing one, are both named
    extra = {**tensors, "model.layers.0.mlp.experts.2.up_proj.weight": TensorInfo((32, 64), "F32")}
    assert any("experts.2.up_proj" in s and "num_experts 2" in s for s in weight_disagreements(moe, extra))
    lacking = {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.experts.1.down_proj.weight"}
    assert any(
        "lacks" in s and "model.layers.1.mlp.experts.1.down_proj.weight" in s
        for s in weight_disagreements(moe, lacking)
    )
    # its attention is still the dense decoder's: a wrong kv head count is still found
    more_kv = Qwen3MoeGatedConfig.from_dict({**moe.to_dict(), "num_key_value_heads": 4})
    assert weight_disagreements(more_kv, tensors)[0].startswith(
        "config.json says num_key_value_heads 4 and head_dim 16"
    )


def test_a_billion_layers_is_refused_before_the_config_object_is_built(
    edited_arm, monkeypatch, no_model_built, deadline
):
    """transformers' config makes and validates a list of num_hidden_layers attention types (8 GB for a
    billion): the layer count is compared with the headers from config.json's number, before that."""

    def refuse(self, **kwargs):
        raise AssertionError(f"a config object was built for {self.num_hidden_layers} layers")

    folder = edited_arm(num_hidden_layers=10**9)
    monkeypatch.setattr(Qwen3GatedConfig, "__post_init__", refuse)
    with pytest.raises(
        CheckpointError, match="config.json says num_hidden_layers 1000000000, but the checkpoint holds 2 layers"
    ):
        Qwen3GatedForCausalLM.from_pretrained(folder)
    from gated_qwen.cli.inspect import describe

    with pytest.raises(
        CheckpointError, match="config.json says num_hidden_layers 1000000000, but the checkpoint holds 2 layers"
    ):
        describe(str(folder))
