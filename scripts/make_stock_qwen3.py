"""Write a randomly initialised stock transformers Qwen3 checkpoint, to measure conversion and loading.

The default, about 159M parameters (636 MB in float32), has layers that dominate the model and
an embedding of 131 MB, the largest tensor: a streaming conversion should peak near that, not
near the model.

    python scripts/make_stock_qwen3.py /tmp/qwen3-stock-159m
    python scripts/make_stock_qwen3.py /tmp/qwen3-stock-1layer --num-hidden-layers 1 --dtype bfloat16
"""

from __future__ import annotations

import argparse

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from gated_qwen.checkpoint.outputs import OutputError, OutputFolder


def make_stock_qwen3(
    folder: str,
    num_hidden_layers: int = 10,
    hidden_size: int = 1024,
    intermediate_size: int = 3072,
    num_attention_heads: int = 16,
    num_key_value_heads: int = 8,
    vocab_size: int = 32000,
    dtype: str = "float32",
    max_shard_size: str = "200MB",
    seed: int = 0,
    overwrite: bool = False,
) -> Qwen3ForCausalLM:
    """Save a random stock Qwen3ForCausalLM (tied embeddings, head_dim 64) into ``folder``; returns it.

    >>> make_stock_qwen3("/tmp/qwen3-stock")  # doctest: +SKIP
    """
    output = OutputFolder(
        folder, overwrite=overwrite
    )  # checked before the model is built; written whole or not at all
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=hidden_size // num_attention_heads,
        tie_word_embeddings=True,
    )
    model = Qwen3ForCausalLM(config).to(getattr(torch, dtype))
    with output as staging:
        model.save_pretrained(staging, max_shard_size=max_shard_size)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--num-hidden-layers", type=int, default=10)
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--intermediate-size", type=int, default=3072)
    parser.add_argument("--num-attention-heads", type=int, default=16)
    parser.add_argument("--num-key-value-heads", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--max-shard-size", default="200MB")
    parser.add_argument("--overwrite", action="store_true", help="replace FOLDER's contents if it is not empty")
    args = parser.parse_args()
    try:
        model = make_stock_qwen3(**{k.replace("-", "_"): v for k, v in vars(args).items()})
    except OutputError as error:
        parser.error(str(error))
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"wrote {args.folder}: {model.num_parameters():,} parameters, {size / 1e6:,.0f} MB")


if __name__ == "__main__":
    main()
