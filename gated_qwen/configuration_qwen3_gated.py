"""Qwen3GatedConfig: transformers' Qwen3Config plus the released gated-attention keys."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import Qwen3Config
from transformers.utils import logging

from .errors import CheckpointError


logger = logging.get_logger(__name__)


@strict
class Qwen3GatedConfig(Qwen3Config):
    r"""Configuration of a Qwen3 model with a sigmoid gate on each head's attention output.

    It reads a released gated-attention ``config.json`` (``model_type "qwen3"``, written by
    transformers 4.46 with ``rope_theta``/``rope_scaling``/``torch_dtype``/``auto_map``) as well
    as a stock Qwen3 config, where the gate keys are absent and mean "no gate".

    Keys beyond Qwen3Config:
        headwise_attn_output_gate (`bool`, defaults to `False`): one gate logit per head.
        elementwise_attn_output_gate (`bool`, defaults to `False`): one gate logit per head and channel.
        use_qk_norm (`bool`, defaults to `True`): RMSNorm over head_dim on queries and keys.
        qkv_bias (`bool`, *optional*): a bias on q_proj, k_proj, v_proj and o_proj. As in the
            released code it, not ``attention_bias``, decides the biases; ``attention_bias`` is set to
            match it. When absent (a stock Qwen3 config), ``attention_bias`` decides.

    ``auto_map`` of a released config is dropped: it names Python files that this package never
    runs. ``save_pretrained`` writes ``model_type "qwen3_gated"`` and also the released keys
    (both gate flags, ``use_qk_norm``, ``qkv_bias``, ``rope_theta``), so the authors' code can still
    read a checkpoint saved here.

    Example:

    >>> config = Qwen3GatedConfig(num_attention_heads=4, num_key_value_heads=2, headwise_attn_output_gate=True)
    >>> config.gate_type
    'headwise'
    """

    model_type = "qwen3_gated"
    # A colwise shard of q_proj holds whole kv groups (queries and their gate rows together) when
    # the shard count divides num_key_value_heads, because the released layout groups rows by kv
    # head; so Qwen3's plan, inherited unchanged, shards the gate with its heads.
    base_model_tp_plan = Qwen3Config.base_model_tp_plan

    headwise_attn_output_gate: bool = False
    elementwise_attn_output_gate: bool = False
    use_qk_norm: bool = True
    qkv_bias: bool | None = None

    def __post_init__(self, **kwargs):
        kwargs.pop("auto_map", None)
        if self.qkv_bias is None:
            self.qkv_bias = self.attention_bias
        elif self.qkv_bias != self.attention_bias:
            if "attention_bias" in kwargs or self.attention_bias:
                logger.info(f"qkv_bias={self.qkv_bias} decides the attention biases; attention_bias is set to match")
            self.attention_bias = self.qkv_bias
        # Raised here as ValueError; `@strict` would wrap the same check in its own error type.
        self._check_gate_and_heads()
        super().__post_init__(**kwargs)

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs):
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if "model_type" in config_dict:
            check_model_type(config_dict, pretrained_model_name_or_path)
        # Released and stock checkpoints say "qwen3"; reading them as Qwen3Gated is the point of this
        # class, so say so in the dict rather than have transformers warn about the mismatch.
        return {**config_dict, "model_type": cls.model_type}, kwargs

    @property
    def gate_type(self) -> str:
        """``"none"``, ``"headwise"`` or ``"elementwise"``, from the two released flags."""
        if self.headwise_attn_output_gate:
            return "headwise"
        if self.elementwise_attn_output_gate:
            return "elementwise"
        return "none"

    def validate_architecture(self):
        """Part of `@strict` validation: the gate flags and head counts must describe one model."""
        super().validate_architecture()
        self._check_gate_and_heads()

    def _check_gate_and_heads(self):
        if self.headwise_attn_output_gate and self.elementwise_attn_output_gate:
            raise ValueError(
                "headwise_attn_output_gate and elementwise_attn_output_gate are both true; "
                "at most one gate type can be set"
            )
        if self.num_key_value_heads < 1 or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    def to_dict(self):
        output = super().to_dict()
        output.pop("auto_map", None)
        # The released code (transformers 4.46) reads these keys; keep them beside the v5 ones.
        output["rope_theta"] = (self.rope_parameters or {}).get("rope_theta", 10000.0)
        for key in ("headwise_attn_output_gate", "elementwise_attn_output_gate", "use_qk_norm", "qkv_bias"):
            output[key] = getattr(self, key)
        return output


def check_model_type(config_dict: dict, source) -> str:
    """``config_dict``'s model_type if gated-qwen reads it, else one clear error naming it.

    Stock Qwen3 and the released gated arms say ``"qwen3"``; gated-qwen writes ``"qwen3_gated"``.

    >>> check_model_type({"model_type": "qwen3"}, "Qwen/Qwen3-0.6B")
    'qwen3'
    """
    model_type = config_dict.get("model_type")
    if model_type not in ("qwen3", Qwen3GatedConfig.model_type):
        raise CheckpointError(
            f"{source} is a {model_type!r} model, not Qwen3 or Qwen3Gated; gated-qwen reads only "
            "model_type 'qwen3' (stock Qwen3 or a released gated arm) and 'qwen3_gated'"
        )
    return model_type


__all__ = ["Qwen3GatedConfig", "check_model_type"]
