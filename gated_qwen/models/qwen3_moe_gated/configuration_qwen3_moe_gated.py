"""Qwen3MoeGatedConfig: transformers' Qwen3MoeConfig plus the gated-attention keys of the dense model."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import Qwen3MoeConfig

from ...errors import CheckpointError
from ..qwen3_gated.configuration_qwen3_gated import GatedAttentionConfigMixin, Qwen3GatedConfig, check_sizes


@strict
class Qwen3MoeGatedConfig(GatedAttentionConfigMixin, Qwen3MoeConfig):
    r"""Configuration of a Qwen3-MoE model with a sigmoid gate on each head's attention output.

    Everything of transformers' :class:`~transformers.Qwen3MoeConfig` (experts, router, ``mlp_only_layers``,
    ``decoder_sparse_step``, ``norm_topk_prob``, the auxiliary loss) plus the gate keys of
    :class:`~gated_qwen.models.qwen3_gated.configuration_qwen3_gated.GatedAttentionConfigMixin`, which
    the dense :class:`Qwen3GatedConfig` has too: ``headwise_attn_output_gate``,
    ``elementwise_attn_output_gate``, ``use_qk_norm``, ``qkv_bias`` and ``head_dim`` (when absent,
    ``hidden_size // num_attention_heads``, what transformers' Qwen3-MoE attention computes then). It reads a
    stock Qwen3-MoE ``config.json`` (``model_type "qwen3_moe"``) as the same model without a gate.

    Example:

    >>> config = Qwen3MoeGatedConfig(num_attention_heads=4, num_key_value_heads=2, num_experts=8,
    ...                              num_experts_per_tok=2, headwise_attn_output_gate=True)
    >>> config.gate_type, config.model_type
    ('headwise', 'qwen3_moe_gated')
    """

    model_type = "qwen3_moe_gated"
    # Qwen3-MoE's plan, inherited unchanged: a colwise shard of q_proj holds whole kv groups (queries and their
    # gate rows together) when the shard count divides num_key_value_heads, as in the dense model.
    base_model_tp_plan = Qwen3MoeConfig.base_model_tp_plan
    # the dense model's sizes, and the experts'
    size_keys = (
        *Qwen3GatedConfig.size_keys,
        "moe_intermediate_size",
        "num_experts",
        "num_experts_per_tok",
        "decoder_sparse_step",
    )

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) is more than num_experts ({self.num_experts})"
            )

    @staticmethod
    def normalize_dict(config_dict: dict, source="the config") -> dict:
        return normalize_moe_config_dict(config_dict, source)

    def sparse_layers(self) -> list[int]:
        """The layers whose MLP is the routed experts (the others, ``mlp_only_layers``, have a dense MLP).

        Transformers' rule: not in ``mlp_only_layers``, and every ``decoder_sparse_step``-th layer.

        >>> Qwen3MoeGatedConfig(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        ...                     num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0]).sparse_layers()
        [1, 2, 3]
        """
        return [layer for layer in range(self.num_hidden_layers) if is_sparse_layer(self, layer)]

    def idle_expert_parameters(self) -> int:
        """Parameters of the experts a token does not use: ``num_experts - num_experts_per_tok`` experts (each
        ``3 * hidden_size * moe_intermediate_size``) in each sparse layer. Total minus this is the active count.

        >>> Qwen3MoeGatedConfig(num_hidden_layers=2, hidden_size=8, moe_intermediate_size=4, num_attention_heads=2,
        ...                     num_key_value_heads=1, num_experts=4, num_experts_per_tok=1).idle_expert_parameters()
        576
        """
        per_expert = 3 * self.hidden_size * self.moe_intermediate_size
        return len(self.sparse_layers()) * (self.num_experts - self.num_experts_per_tok) * per_expert


def is_sparse_layer(config, layer: int) -> bool:
    """Whether Qwen3-MoE builds routed experts in ``layer`` (transformers' ``Qwen3MoeDecoderLayer`` rule)."""
    return (
        layer not in (config.mlp_only_layers or [])
        and config.num_experts > 0
        and (layer + 1) % config.decoder_sparse_step == 0
    )


MOE_MODEL_TYPES = ("qwen3_moe", "qwen3_moe_gated")


def normalize_moe_config_dict(config_dict: dict, source="the config") -> dict:
    """A stock Qwen3-MoE or Qwen3MoeGated config.json's dict, ready for :class:`Qwen3MoeGatedConfig`.

    Refuses, naming it, a config of another model type and sizes that make no model; labels the dict
    ``"qwen3_moe_gated"``. A dict without ``model_type`` (keyword arguments) is taken as it is.

    >>> normalize_moe_config_dict({"model_type": "qwen3_moe"})["model_type"]
    'qwen3_moe_gated'
    """
    where = "config.json" if source == "the config" else f"the config.json of {source}"
    sizes = dict(config_dict)
    if "num_local_experts" in sizes:  # transformers 5.25 writes num_experts under this name (its attribute_map)
        sizes.setdefault("num_experts", sizes["num_local_experts"])
    check_sizes(sizes, where, size_keys=Qwen3MoeGatedConfig.size_keys)
    if "model_type" not in config_dict:
        return config_dict
    model_type = config_dict.get("model_type")
    if model_type not in MOE_MODEL_TYPES:
        raise CheckpointError(
            f"{source} is a {model_type!r} model, not Qwen3-MoE or Qwen3MoeGated; the MoE family reads "
            "model_type 'qwen3_moe' and 'qwen3_moe_gated'"
        )
    return {**config_dict, "model_type": Qwen3MoeGatedConfig.model_type}


__all__ = ["MOE_MODEL_TYPES", "Qwen3MoeGatedConfig", "is_sparse_layer", "normalize_moe_config_dict"]
