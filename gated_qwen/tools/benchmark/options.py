"""What ``gated-qwen bench`` measures (:class:`BenchmarkOptions`, the named sizes), importable without torch.

Kept apart from :mod:`gated_qwen.tools.benchmark.measure` so that ``gated-qwen bench --help`` shows the defaults at once.

>>> BenchmarkOptions().size in SIZES
True
"""

from __future__ import annotations

from dataclasses import dataclass, field


# Architectures by name. "100m" keeps the released arms' proportions (head_dim 128, two query heads
# per kv head, H*D = hidden, MLP 3x hidden) at about 108M parameters with a 32k vocabulary; "1b" is the
# released architecture itself, read from the repository's configs/1B_baseline.json (the measured
# one: vocabulary 152064, MLP 6144; all arms share it, so the elementwise arm here keeps that MLP
# rather than the released elementwise arm's 5504); "tiny" is for tests. The "moe-" sizes are Qwen3-MoE
# models (the arms transformers' Qwen3MoeForCausalLM and Qwen3MoeGated): "moe-100m" the "100m" attention with
# 32 experts of width 256, 4 per token (203M parameters, 71M active); "moe-15b" the paper's MoE
# architecture (configs/moe_15B_A2B_headwise.json: 128 experts, 8 per token); "moe-tiny" for tests.
SIZES = {
    "tiny": {
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
    },
    "100m": {
        "vocab_size": 32000,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 128,
    },
    "1b": "1B_baseline.json",
    "moe-tiny": {
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "moe_intermediate_size": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
    },
    "moe-100m": {
        "vocab_size": 32000,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "moe_intermediate_size": 256,
        "num_experts": 32,
        "num_experts_per_tok": 4,
        "norm_topk_prob": True,
    },
    "moe-15b": "moe_15B_A2B_headwise.json",
}
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class BenchmarkOptions:
    """What to measure. ``size`` names an entry of :data:`SIZES`; ``overrides`` change single config keys;
    ``gate_variant`` (e.g. ``{"gate_position": "value"}``) gives the gated arms a variant of the design space."""

    size: str = "100m"
    overrides: dict = field(default_factory=dict)
    batch_sizes: tuple[int, ...] = (1, 8)
    prompt_length: int = 512
    new_tokens: int = 64
    repeats: int = 11  # measured rounds, after one warm-up round
    dtype: str = "float32"
    device: str = "cpu"
    attn_implementation: str = "sdpa"
    threads: int | None = None  # torch intra-op threads; None keeps torch's choice
    models: bool = True
    loading: bool = True
    conversion: bool = True
    scratch_dir: str | None = None  # where checkpoints are written; a temporary folder by default
    seed: int = 0
    # The gated arms beside transformers' model and the no-gate arm, and the design-space keys they take
    # (docs/design-space.md; empty: the released gate). Loading and conversion use the first gated arm.
    gates: tuple[str, ...] = ("headwise", "elementwise")
    gate_variant: dict = field(default_factory=dict)


__all__ = ["DTYPES", "SIZES", "BenchmarkOptions"]
