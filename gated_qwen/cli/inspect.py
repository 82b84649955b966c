"""``gated-qwen inspect``: describe a checkpoint from its config and safetensors headers."""

from __future__ import annotations

import json


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="describe a checkpoint without loading its weights",
        description="Print gate type, layers, heads, parameter count and dtype of a checkpoint, read from "
        "config.json and the safetensors headers only (on the hub: range reads, no weight download).",
    )
    parser.add_argument("checkpoint", metavar="PATH_OR_HUB_ID", help="a checkpoint folder or a hub id")
    parser.add_argument("--subfolder", default="", help="folder inside the repo or path, e.g. 1B_gate_headwise")
    parser.add_argument("--revision", default=None, help="hub branch, tag or commit")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(run=run)


def describe(checkpoint: str, subfolder: str = "", revision: str | None = None) -> dict:
    """The facts ``inspect`` prints, as a dict.

    >>> describe("QwQZh/gated_attention", subfolder="1B_gate_headwise")["gate_type"]  # doctest: +SKIP
    'headwise'
    """
    from ..checkpoint import SAFETENSORS_DTYPES, check_q_proj_layout, read_checkpoint_header
    from ..configuration_qwen3_gated import Qwen3GatedConfig, check_model_type
    from ..errors import CheckpointError

    header = read_checkpoint_header(checkpoint, subfolder=subfolder, revision=revision)
    model_type = check_model_type(header.config, header.source)
    try:
        config = Qwen3GatedConfig.from_dict(header.config)
    except CheckpointError:
        raise
    except Exception as error:  # strict dataclass validation raises several error types
        raise CheckpointError(f"{header.source}/config.json is not a valid Qwen3 config: {error}") from None
    if not header.tensors:
        raise CheckpointError(f"{header.source} has no safetensors weights (model.safetensors or an index)")
    check_q_proj_layout(config, header.tensors, header.source)
    weight_dtypes = sorted({str(SAFETENSORS_DTYPES.get(t.dtype, t.dtype)).removeprefix("torch.") for t in header.tensors.values()})
    return {
        "source": header.source,
        "model_type": model_type,
        "gate_type": config.gate_type,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_size": config.hidden_size,
        "use_qk_norm": config.use_qk_norm,
        "qkv_bias": config.qkv_bias,
        "tie_word_embeddings": config.tie_word_embeddings,
        "parameters": sum(t.numel for t in header.tensors.values()),
        "config_dtype": str(config.dtype).removeprefix("torch.") if config.dtype is not None else None,
        "weight_dtypes": weight_dtypes,
        "files": len(header.files),
    }


def run(args) -> int:
    facts = describe(args.checkpoint, args.subfolder, args.revision)
    if args.json:
        print(json.dumps(facts, indent=2))
        return 0
    rows = [
        ("source", facts["source"]),
        ("model_type", facts["model_type"]),
        ("gate type", facts["gate_type"]),
        ("layers", facts["num_hidden_layers"]),
        ("heads", f"{facts['num_attention_heads']} query / {facts['num_key_value_heads']} kv, head_dim {facts['head_dim']}"),
        ("hidden size", facts["hidden_size"]),
        ("qk norm / qkv bias", f"{facts['use_qk_norm']} / {facts['qkv_bias']}"),
        ("tied embeddings", facts["tie_word_embeddings"]),
        ("parameters", f"{facts['parameters']:,} ({facts['parameters'] / 1e9:.2f}B)"),
        ("dtype", f"{facts['config_dtype'] or 'unset'} (config), {', '.join(facts['weight_dtypes'])} (weights)"),
        ("weight files", facts["files"]),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0
