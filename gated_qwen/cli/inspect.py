"""``gated-qwen inspect``: describe a checkpoint from its config and weight headers, without loading it."""

from __future__ import annotations

import json


def add_parser(subparsers) -> None:
    from ._arguments import add_model_source

    parser = subparsers.add_parser(
        "inspect",
        help="describe a checkpoint without loading its weights",
        description="Print gate type, layers, heads, parameter count (total and, for a mixture of experts, active "
        "per token) and dtype of a checkpoint, read from "
        "config.json and the weight headers only: safetensors headers (on the hub by range reads, no weight "
        "download), or a local pytorch_model.bin's pickle without its tensor data. Of pickle weights on the hub "
        "only the file sizes can be had without the download; the parameter count then comes from the config.",
    )
    parser.add_argument("checkpoint", metavar="PATH_OR_HUB_ID", help="a checkpoint folder or a hub id")
    add_model_source(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(run=run)


def describe(checkpoint: str, subfolder: str = "", revision: str | None = None) -> dict:
    """The facts ``inspect`` prints, as a dict.

    >>> from gated_qwen.default_models import default_model_path
    >>> models = default_model_path().parent  # headwise/ and baseline/, as the hub repository holds its arms
    >>> [describe(str(models), subfolder=arm)["gate_type"] for arm in ("headwise", "baseline")]
    ['headwise', 'none']
    """
    from huggingface_hub.errors import StrictDataclassError

    from ..checkpoint import SAFETENSORS_DTYPES, check_layer_count, check_weights_match_config, read_checkpoint_header
    from ..errors import CheckpointError
    from ..models.qwen3_gated.configuration_qwen3_gated import Qwen3GatedConfig, check_model_type
    from ..models.qwen3_moe_gated.configuration_qwen3_moe_gated import MOE_MODEL_TYPES, Qwen3MoeGatedConfig

    header = read_checkpoint_header(checkpoint, subfolder=subfolder, revision=revision)
    moe = header.config.get("model_type") in MOE_MODEL_TYPES
    kind = header.config.get("model_type") if moe else check_model_type(header.config, header.source)
    layers = header.config.get("num_hidden_layers")
    if header.tensors and isinstance(layers, int) and not isinstance(layers, bool):
        check_layer_count(layers, header.tensors, header.source)  # before the config object, which grows with it
    try:
        config = (Qwen3MoeGatedConfig if moe else Qwen3GatedConfig).from_dict(header.config)
    except CheckpointError:
        raise
    except (StrictDataclassError, TypeError, ValueError) as error:  # strict validation, the config's own checks
        reason = " ".join(str(error).split())
        raise CheckpointError(
            f"{header.source}/config.json is not a valid {'Qwen3-MoE' if moe else 'Qwen3'} config: {reason}"
        ) from error
    if header.weights_format is None:
        raise CheckpointError(
            f"{header.source} has no weights (model.safetensors, pytorch_model.bin, or an index of either)"
        )
    shapes_checked = bool(header.tensors)
    if shapes_checked:
        check_weights_match_config(config, header.tensors, header.source)
        parameters = sum(t.numel for t in header.tensors.values())
        weight_dtypes = sorted(
            {str(SAFETENSORS_DTYPES[t.dtype]).removeprefix("torch.") for t in header.tensors.values()}
        )
    else:  # pickle weights on the hub: their shapes are inside the file
        parameters, weight_dtypes = _parameters_from_config(config), []
    kinds = {
        "gated_attention_release": "gated-attention release",
        "qwen3": "stock Qwen3",
        "qwen3_moe": "stock Qwen3-MoE",
    }
    facts = {
        "source": header.source,
        "model_type": header.config.get("model_type"),
        "kind": kinds.get(kind, "gated-qwen checkpoint"),
        "gate_type": config.gate_type,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
        "use_qk_norm": config.use_qk_norm,
        "qkv_bias": config.qkv_bias,
        "tie_word_embeddings": config.tie_word_embeddings,
        "parameters": parameters,
        "config_dtype": str(config.dtype).removeprefix("torch.") if config.dtype is not None else None,
        "weight_dtypes": weight_dtypes,
        "weights_format": header.weights_format,
        "weight_bytes": sum(header.file_sizes.values()),
        "files": len(header.files),
        "shapes_checked": shapes_checked,
        # a token's share: all of a dense model; the router's chosen experts only in a mixture of experts
        "active_parameters": parameters - (config.idle_expert_parameters() if moe else 0),
    }
    if moe:
        facts.update(
            num_experts=config.num_experts,
            num_experts_per_tok=config.num_experts_per_tok,
            moe_intermediate_size=config.moe_intermediate_size,
            sparse_layers=len(config.sparse_layers()),
            norm_topk_prob=config.norm_topk_prob,
        )
    return facts


def _parameters_from_config(config) -> int:
    """The parameter count of the model ``config`` describes (built on the meta device: nothing allocated)."""
    import torch

    from ..models.qwen3_gated.modeling_qwen3_gated import Qwen3GatedForCausalLM
    from ..models.qwen3_moe_gated.configuration_qwen3_moe_gated import Qwen3MoeGatedConfig
    from ..models.qwen3_moe_gated.modeling_qwen3_moe_gated import Qwen3MoeGatedForCausalLM

    with torch.device("meta"):
        model = (Qwen3MoeGatedForCausalLM if isinstance(config, Qwen3MoeGatedConfig) else Qwen3GatedForCausalLM)(
            config
        )
    return sum(p.numel() for p in model.parameters())  # a tied lm_head counts once


def run(args) -> int:
    facts = describe(args.checkpoint, args.subfolder, args.revision)
    if args.json:
        print(json.dumps(facts, indent=2))
        return 0
    rows = [
        ("source", facts["source"]),
        ("model_type", f"{facts['model_type']} ({facts['kind']})"),
        ("gate type", facts["gate_type"]),
        ("layers", facts["num_hidden_layers"]),
        (
            "heads",
            f"{facts['num_attention_heads']} query / {facts['num_key_value_heads']} kv, head_dim {facts['head_dim']}",
        ),
        ("hidden / MLP / vocab", f"{facts['hidden_size']} / {facts['intermediate_size']} / {facts['vocab_size']}"),
        ("qk norm / qkv bias", f"{facts['use_qk_norm']} / {facts['qkv_bias']}"),
        ("tied embeddings", facts["tie_word_embeddings"]),
        (
            "parameters",
            f"{facts['parameters']:,} ({facts['parameters'] / 1e9:.2f}B)"
            + ("" if facts["shapes_checked"] else ", from the config"),
        ),
    ]
    if "num_experts" in facts:
        rows += [
            (
                "experts",
                f"{facts['num_experts']} of width {facts['moe_intermediate_size']}, {facts['num_experts_per_tok']} per "
                f"token, in {facts['sparse_layers']} of {facts['num_hidden_layers']} layers (norm_topk_prob {facts['norm_topk_prob']})",
            ),
            (
                "active parameters",
                f"{facts['active_parameters']:,} ({facts['active_parameters'] / 1e9:.2f}B) per token",
            ),
        ]
    rows += [
        (
            "dtype",
            f"{facts['config_dtype'] or 'unset'} (config)"
            + (f", {', '.join(facts['weight_dtypes'])} (weights)" if facts["weight_dtypes"] else ""),
        ),
        (
            "weights",
            f"{facts['files']} {facts['weights_format']} file{'s' if facts['files'] > 1 else ''}, "
            f"{facts['weight_bytes'] / 1e6:,.1f} MB",
        ),
    ]
    if not facts["shapes_checked"]:
        rows.append(
            (
                "q_proj shapes",
                "not checked: a pytorch_model.bin holds them inside, so they need the download "
                "(inspect the downloaded folder, or convert --gate keep to safetensors)",
            )
        )
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0
