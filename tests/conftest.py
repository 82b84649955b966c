"""Fixtures: tiny checkpoints in the released layout and tiny tokenizers, built by the tests.

The released-layout writer below assembles q_proj row by row from the text of
``shared/RELEASED_FORMAT.md`` with explicit loops, deliberately *not* through
``gated_qwen.layout``, so that tests compare the package against the spec rather than itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import gated_qwen  # noqa: F401  (registers qwen3_gated with the Auto classes)
from gated_qwen import Qwen3GatedConfig

torch.set_num_threads(1)

TRAP_CODE = 'raise RuntimeError("code shipped inside a checkpoint was imported")\n'


def tiny_config_dict(
    gate: str = "headwise",
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    head_dim: int = 8,
    qkv_bias: bool = False,
    use_qk_norm: bool = True,
    tie_word_embeddings: bool = False,
    num_hidden_layers: int = 2,
    vocab_size: int = 96,
    hidden_size: int = 32,
) -> dict:
    """A released-style config.json (model_type "qwen3", transformers 4.46 keys) of a tiny model."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_qwen3.Qwen3Config", "AutoModelForCausalLM": "modeling_qwen3.Qwen3ForCausalLM"},
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "torch_dtype": "float32",
        "tie_word_embeddings": tie_word_embeddings,
        "headwise_attn_output_gate": gate == "headwise",
        "elementwise_attn_output_gate": gate == "elementwise",
        "use_qk_norm": use_qk_norm,
        "qkv_bias": qkv_bias,
        "attention_bias": not qkv_bias,  # disagrees on purpose: qkv_bias decides
        "transformers_version": "4.46.0",
    }


def tiny_config(**kwargs) -> Qwen3GatedConfig:
    return Qwen3GatedConfig(**tiny_config_dict(**kwargs))


def write_released_checkpoint(folder: Path, seed: int = 0, gate_scale: float = 1.0, **config_kwargs) -> dict:
    """Write config.json, model.safetensors and trap code files in the released layout.

    Returns the config dict and, per layer, the query and gate rows of each head as written, so
    tests can compute by hand what the model must apply.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config_dict(**config_kwargs)
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=gen) * scale

    H, K, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    G = H // K
    g = {"none": 0, "headwise": 1, "elementwise": D}[config_kwargs.get("gate", "headwise")]
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    tensors = {"model.embed_tokens.weight": rand(vocab, hidden, scale=1.0), "model.norm.weight": 1 + rand(hidden)}
    if not cfg["tie_word_embeddings"]:
        tensors["lm_head.weight"] = rand(vocab, hidden)
    layers = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        query_rows = [rand(D, hidden) for _ in range(H)]  # per head h
        gate_rows = [rand(g, hidden, scale=gate_scale) for _ in range(H)]
        query_bias = [rand(D) for _ in range(H)]
        gate_bias = [rand(g) for _ in range(H)]
        # RELEASED_FORMAT.md: for kv head k, the queries of heads k*G..k*G+G-1, then their gates.
        rows, bias = [], []
        for k in range(K):
            heads = range(k * G, k * G + G)
            rows += [query_rows[h] for h in heads] + [gate_rows[h] for h in heads]
            bias += [query_bias[h] for h in heads] + [gate_bias[h] for h in heads]
        tensors[p + "self_attn.q_proj.weight"] = torch.cat(rows)
        tensors[p + "self_attn.k_proj.weight"] = rand(K * D, hidden)
        tensors[p + "self_attn.v_proj.weight"] = rand(K * D, hidden)
        tensors[p + "self_attn.o_proj.weight"] = rand(hidden, H * D)
        if cfg["qkv_bias"]:
            tensors[p + "self_attn.q_proj.bias"] = torch.cat(bias)
            tensors[p + "self_attn.k_proj.bias"] = rand(K * D)
            tensors[p + "self_attn.v_proj.bias"] = rand(K * D)
            tensors[p + "self_attn.o_proj.bias"] = rand(hidden)
        if cfg["use_qk_norm"]:
            tensors[p + "self_attn.q_norm.weight"] = 1 + rand(D)
            tensors[p + "self_attn.k_norm.weight"] = 1 + rand(D)
        tensors[p + "mlp.gate_proj.weight"] = rand(inter, hidden)
        tensors[p + "mlp.up_proj.weight"] = rand(inter, hidden)
        tensors[p + "mlp.down_proj.weight"] = rand(hidden, inter)
        tensors[p + "input_layernorm.weight"] = 1 + rand(hidden)
        tensors[p + "post_attention_layernorm.weight"] = 1 + rand(hidden)
        layers.append({"query_rows": query_rows, "gate_rows": gate_rows, "query_bias": query_bias, "gate_bias": gate_bias})
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "modeling_qwen3.py").write_text(TRAP_CODE)
    (folder / "configuration_qwen3.py").write_text(TRAP_CODE)
    return {"config": cfg, "layers": layers, "tensors": tensors}


TOKENIZER_TEXT = [
    "The gate scales each head's attention output before the output projection.",
    "A sigmoid gate per head removes the attention sink and helps training.",
    "def add(a, b):\n    return a + b\n",
    "Hello world. Hello gated attention. The quick brown fox jumps over the lazy dog.",
]


def write_tiny_tokenizer(folder: Path, vocab_size: int = 300, chat_template: str | None = None) -> Path:
    """Train a byte-level BPE on a few sentences and save it as a transformers tokenizer folder.

    Byte-level BPE has 256 base tokens plus 2 specials, so a model that uses it needs vocab_size >= 300.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TOKENIZER_TEXT, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|pad|>")
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(folder)
    return Path(folder)


@pytest.fixture
def released_checkpoint(tmp_path):
    """Factory: ``released_checkpoint(gate="headwise", ...)`` writes one and returns (folder, spec)."""
    counter = iter(range(1000))

    def make(**kwargs):
        folder = tmp_path / f"released_{next(counter)}"
        return folder, write_released_checkpoint(folder, **kwargs)

    return make


@pytest.fixture
def tiny_tokenizer(tmp_path):
    return write_tiny_tokenizer(tmp_path / "tokenizer")
