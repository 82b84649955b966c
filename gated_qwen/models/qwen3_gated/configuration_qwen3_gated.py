"""Qwen3GatedConfig: transformers' Qwen3Config plus the released gated-attention keys."""

from __future__ import annotations

from dataclasses import dataclass

from huggingface_hub.dataclasses import strict
from transformers import Qwen3Config
from transformers.utils import logging

from ...errors import CheckpointError
from ...utils.names import GATE_TYPES, GATE_VARIANT_CHOICES, GATE_VARIANT_DEFAULTS, UNGATED_VARIANT_KEYS


logger = logging.get_logger(__name__)


@dataclass(repr=False, eq=False)
class GatedAttentionConfigMixin:
    """The gated-attention keys and rules that every gated family's config shares (dense Qwen3, Qwen3-MoE).

    A dataclass, so that ``@strict`` on the config that inherits it validates these fields with the rest.
    It adds the gate keys (the released flags and the design-space keys, docs/design-space.md),
    ``use_qk_norm``, ``qkv_bias`` and ``head_dim``, derives ``head_dim``, the attention biases and ``gate_type``
    in ``__post_init__``, checks the gate and head counts, and writes the keys the released code reads in
    ``to_dict``. The config that inherits it names its own model type and ``size_keys`` (the sizes
    :func:`check_sizes` refuses when not positive integers).

    >>> Qwen3GatedConfig(num_attention_heads=4, num_key_value_heads=2, elementwise_attn_output_gate=True).gate_type
    'elementwise'
    >>> config = Qwen3GatedConfig(num_attention_heads=4, num_key_value_heads=2, gate_type="headwise",
    ...                           gate_position="value")
    >>> config.gate_in_q_proj, config.headwise_attn_output_gate
    (False, False)
    """

    # The released flags (headwise_attn_output_gate, elementwise_attn_output_gate) are properties below, not keys
    # of their own: gate_type and the keys beside it say everything.
    # The design space (arXiv 2505.06708, section 3): granularity, position, sharing, activation, combination.
    gate_type: str | None = None  # "none" | "headwise" | "elementwise"; None: from the released flags
    gate_position: str = "sdpa_output"  # GATE_POSITIONS
    gate_shared_across_heads: bool = False
    gate_activation: str = "sigmoid"  # GATE_ACTIVATIONS
    gate_combination: str = "multiplicative"  # GATE_COMBINATIONS
    gate_input: str = "hidden_states"  # GATE_INPUTS; "none": learned scores, the same for every token
    # Beside the gate or without one (the paper's Table 3 rows 5-6, Table 2 row 7).
    attn_output_transform: str = "none"  # ATTN_OUTPUT_TRANSFORMS, on each head's SDPA output
    sandwich_norm: bool = False  # RMSNorm on the attention and MLP outputs before the residual adds
    use_qk_norm: bool = True
    qkv_bias: bool | None = None
    head_dim: int | None = None

    def __post_init__(self, **kwargs):
        kwargs.pop("auto_map", None)
        # Before head_dim is derived from them (a zero head count would divide by zero there).
        check_sizes({key: getattr(self, key, None) for key in self.size_keys}, size_keys=self.size_keys)
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.qkv_bias is None:
            self.qkv_bias = self.attention_bias
        elif self.qkv_bias != self.attention_bias:
            if "attention_bias" in kwargs or self.attention_bias:
                logger.info(f"qkv_bias={self.qkv_bias} decides the attention biases; attention_bias is set to match")
            self.attention_bias = self.qkv_bias
        # Raised here as ValueError; `@strict` would wrap the same checks in its own error type.
        self._resolve_gate_type(
            {
                gate_type: kwargs.pop(f"{gate_type}_attn_output_gate", False)
                for gate_type in ("headwise", "elementwise")
            }
        )
        self._check_gate_and_heads()
        super().__post_init__(**kwargs)

    @property
    def auto_map(self) -> dict:
        """Always empty: a gated config names no remote code (a released config's ``auto_map`` is dropped on reading
        and never written). Present because TRL, given a model path, reads ``config.auto_map`` of any architecture
        outside transformers; an empty one means the Auto classes, where ``qwen3_gated`` is registered."""
        return {}

    @auto_map.setter
    def auto_map(self, value) -> None:
        if value:
            logger.warning(f"auto_map={value!r} is ignored: a gated-attention config never names remote code")

    @property
    def gate_in_q_proj(self) -> bool:
        """Whether the gate logits are rows of q_proj (the released layout): a head-specific gate at the SDPA
        output computed from the layer's input, whatever its activation and combination. Every other gate has a
        projection of its own, g_proj, or (``gate_input "none"``) learned scores of its own, gate_logits."""
        return (
            self.gate_type != "none"
            and self.gate_position == "sdpa_output"
            and not self.gate_shared_across_heads
            and self.gate_input == "hidden_states"
        )

    @property
    def is_released_point(self) -> bool:
        """Whether every design-space key is the released point's (:data:`GATE_VARIANT_DEFAULTS`), whatever the gate
        type (none included): what the authors' code, Qwen3.5 and the vLLM plugin compute."""
        return all(getattr(self, key) == default for key, default in GATE_VARIANT_DEFAULTS.items())

    @property
    def is_released_gate(self) -> bool:
        """Whether the gate is the one the paper released (G1: head-specific, sigmoid, multiplying the SDPA output,
        nothing else changed), the only one the released flags, the authors' code, the Qwen3.5 export and the vLLM
        plugin describe."""
        return self.gate_type != "none" and self.is_released_point

    def gate_variant(self) -> str:
        """The gate in one line, as messages and tables name it.

        >>> Qwen3GatedConfig(gate_type="elementwise", gate_position="key", gate_combination="additive").gate_variant()
        'elementwise sigmoid additive gate at key, head-specific'
        """
        extras = [f"{self.attn_output_transform} on the SDPA output"] if self.attn_output_transform != "none" else []
        extras += ["sandwich norm"] if self.sandwich_norm else []
        if self.gate_type == "none":
            return ", ".join(["no gate", *extras])
        sharing = "shared across heads" if self.gate_shared_across_heads else "head-specific"
        if self.gate_position == "dense_output":
            sharing = "per channel"
        words = [f"{self.gate_type} {self.gate_activation} {self.gate_combination} gate at {self.gate_position}"]
        words += [sharing, *(["input-independent"] if self.gate_input == "none" else []), *extras]
        return ", ".join(words)

    def validate_architecture(self):
        """Part of `@strict` validation: the gate keys and head counts must describe one model."""
        super().validate_architecture()
        self._check_gate_and_heads()

    def _resolve_gate_type(self, flags: dict[str, bool]):
        """``gate_type`` from the released flags (``{"headwise": ..., "elementwise": ...}``) when it is absent."""
        if all(flags.values()):
            raise ValueError(
                "headwise_attn_output_gate and elementwise_attn_output_gate are both true; "
                "at most one gate type can be set"
            )
        flagged = next((gate_type for gate_type, value in flags.items() if value), None)
        # A flag set decides, as in the authors' code: a config.json saved here and edited by its flags (or
        # {**config.to_dict(), "headwise_...": True}) is what the flags say.
        if flagged and self.gate_type not in (None, "none", flagged):
            logger.info(f"{flagged}_attn_output_gate=true decides the gate type, not gate_type {self.gate_type!r}")
        if flagged or self.gate_type is None:
            self.gate_type = flagged or "none"
        # The flags give the granularity; the keys beside gate_type give the rest, so that {**config.to_dict(),
        # "gate_position": "value"} is a value gate. They are written true only for the released gate (to_dict).

    def _set_released_flag(self, gate_type: str, value: bool):
        # As transformers sets a config key given to from_pretrained: true makes it the gate type, false removes it
        # where it is the gate type (and leaves any other gate alone).
        if value:
            self.gate_type = gate_type
        elif self.gate_type == gate_type and self.is_released_gate:
            self.gate_type = "none"

    @property
    def headwise_attn_output_gate(self) -> bool:
        """The released flag: whether the gate is the released headwise one (one logit per head, in q_proj)."""
        return self.is_released_gate and self.gate_type == "headwise"

    @headwise_attn_output_gate.setter
    def headwise_attn_output_gate(self, value: bool):
        self._set_released_flag("headwise", value)

    @property
    def elementwise_attn_output_gate(self) -> bool:
        """The released flag: whether the gate is the released elementwise one (one logit per head and channel)."""
        return self.is_released_gate and self.gate_type == "elementwise"

    @elementwise_attn_output_gate.setter
    def elementwise_attn_output_gate(self, value: bool):
        self._set_released_flag("elementwise", value)

    def _check_gate_and_heads(self):
        check_gate_variant({key: getattr(self, key) for key in ("gate_type", *GATE_VARIANT_DEFAULTS)})
        if self.num_key_value_heads < 1 or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    @staticmethod
    def normalize_dict(config_dict: dict, source="the config") -> dict:
        """The family's config.json dict made ready for the config class (checked and relabelled)."""
        raise NotImplementedError

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs):
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        return cls.normalize_dict(config_dict, pretrained_model_name_or_path), kwargs

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        return super().from_dict(cls.normalize_dict(config_dict), **kwargs)

    def to_dict(self):
        output = super().to_dict()
        output.pop("auto_map", None)
        # The released code (transformers 4.46) reads these keys; keep them beside the v5 ones.
        output["rope_theta"] = (self.rope_parameters or {}).get("rope_theta", 10000.0)
        for key in ("headwise_attn_output_gate", "elementwise_attn_output_gate", "use_qk_norm", "qkv_bias"):
            output[key] = getattr(self, key)
        return output


@strict
class Qwen3GatedConfig(GatedAttentionConfigMixin, Qwen3Config):
    r"""Configuration of a Qwen3 model with a sigmoid gate on each head's attention output.

    It reads a released gated-attention ``config.json`` as the files on the hub are: ``model_type
    "qwen2"`` (the architecture is Qwen3 with QK-norm all the same), written by transformers 4.x with
    ``rope_theta``/``rope_scaling``/``torch_dtype``/``auto_map`` and Qwen2-era keys, maybe without
    ``head_dim``. It also reads a stock Qwen3 config, where the gate keys are absent and mean "no gate".
    A release is recognised by its keys, not its model_type (:func:`is_gated_attention_config`); a
    genuine Qwen2 config is refused (:func:`normalize_config_dict`).

    Keys beyond Qwen3Config (:class:`GatedAttentionConfigMixin`, shared with the MoE family):
        headwise_attn_output_gate (`bool`, defaults to `False`): one gate logit per head.
        elementwise_attn_output_gate (`bool`, defaults to `False`): one gate logit per head and channel.
        use_qk_norm (`bool`, defaults to `True`): RMSNorm over head_dim on queries and keys.
        head_dim (`int`, *optional*): when absent, ``hidden_size // num_attention_heads``, as the
            released code computes it (transformers' Qwen3Config would assume 128).
        qkv_bias (`bool`, *optional*): a bias on q_proj, k_proj, v_proj and o_proj. As in the
            released code it, not ``attention_bias``, decides the biases; ``attention_bias`` is set to
            match it. When absent (a stock Qwen3 config), ``attention_bias`` decides.
        gate_type, gate_position, gate_shared_across_heads, gate_activation, gate_combination, gate_input,
            attn_output_transform, sandwich_norm: the design space of the paper (docs/design-space.md); the
            defaults are the released point.

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
    size_keys = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
    )

    @staticmethod
    def normalize_dict(config_dict: dict, source="the config") -> dict:
        return normalize_config_dict(config_dict, source)


# Keys that only the released gated-attention config (or one saved here) has; a stock Qwen3 or
# Qwen2 config has none of them.
GATED_ATTENTION_KEYS = (
    "headwise_attn_output_gate",
    "elementwise_attn_output_gate",
    "use_qk_norm",
    "qkv_bias",
    "gate_type",
    *GATE_VARIANT_DEFAULTS,
)
# The authors' Python files, named by a released config's auto_map (never imported here).
RELEASED_CODE_FILES = ("configuration_qwen3", "modeling_qwen3")


def is_gated_attention_config(config_dict: dict) -> bool:
    """Whether a config.json's dict is a gated-attention release (or saved by gated-qwen), by its keys.

    The released configs say ``model_type "qwen2"``; what marks them is the gate flags,
    ``use_qk_norm`` or ``qkv_bias``, or an ``auto_map`` naming the authors' files.

    >>> is_gated_attention_config({"model_type": "qwen2", "headwise_attn_output_gate": True})
    True
    >>> is_gated_attention_config({"model_type": "qwen2", "attention_bias": True})
    False
    """
    if any(key in config_dict for key in GATED_ATTENTION_KEYS):
        return True
    auto_map = config_dict.get("auto_map")
    names = auto_map.values() if isinstance(auto_map, dict) else ()
    return any(str(name).split(".")[0] in RELEASED_CODE_FILES for name in names)


def check_model_type(config_dict: dict, source="the config") -> str:
    """What ``config_dict`` describes: ``"qwen3_gated"``, ``"gated_attention_release"`` or ``"qwen3"``.

    Otherwise one clear error naming what it is: a genuine Qwen2 (biases on q/k/v, no QK-norm) or
    another model type.

    >>> check_model_type({"model_type": "qwen2", "use_qk_norm": True, "headwise_attn_output_gate": True})
    'gated_attention_release'
    >>> check_model_type({"model_type": "qwen3"})
    'qwen3'
    """
    model_type = config_dict.get("model_type")
    if model_type == Qwen3GatedConfig.model_type:
        return model_type
    if model_type in ("qwen2", "qwen3") and is_gated_attention_config(config_dict):
        return "gated_attention_release"
    if model_type == "qwen3":
        return model_type
    if model_type == "qwen2":
        raise CheckpointError(
            f"{source} is a Qwen2 model (model_type 'qwen2' without the gated-attention keys: biases on q/k/v, "
            "no QK-norm), not a gated-attention release or Qwen3; load it with transformers' Qwen2ForCausalLM"
        )
    if model_type in ("qwen3_moe", "qwen3_moe_gated"):
        raise CheckpointError(
            f"{source} is a {model_type!r} model (Qwen3-MoE), not dense Qwen3 or Qwen3Gated; read it with "
            "Qwen3MoeGatedConfig / Qwen3MoeGatedForCausalLM (AutoModelForCausalLM after `import gated_qwen`)"
        )
    raise CheckpointError(
        f"{source} is a {model_type!r} model, not Qwen3 or Qwen3Gated; gated-qwen reads the released "
        "gated-attention arms (model_type 'qwen2' or 'qwen3' with the gate keys), stock Qwen3 and 'qwen3_gated', "
        "and Qwen3-MoE ('qwen3_moe', 'qwen3_moe_gated')"
    )


# Sizes that decide the shapes of the weights: each a positive integer, or the config describes no model.
# head_dim and num_key_value_heads may be absent (derived: hidden_size / num_attention_heads, num_attention_heads).
SIZE_KEYS = Qwen3GatedConfig.size_keys
OPTIONAL_SIZE_KEYS = ("head_dim", "num_key_value_heads")


def check_sizes(values: dict, source: str = "the config", size_keys: tuple[str, ...] = SIZE_KEYS) -> None:
    """Refuse sizes that make no model, naming the key: zero, negative or non-integer sizes, and a missing
    ``head_dim`` where ``num_attention_heads`` does not divide ``hidden_size`` (the released code derives it so).

    ``values`` is a config.json's dict or a config's fields; absent keys are left to their defaults.
    ``size_keys`` are the sizes checked (a family's config names its own: the MoE adds the expert counts).

    >>> check_sizes({"vocab_size": 0})
    Traceback (most recent call last):
    ...
    gated_qwen.errors.CheckpointError: the config says vocab_size 0, which makes no model: it must be a positive integer
    """
    for key in size_keys:
        value = values.get(key)
        if value is None and (key in OPTIONAL_SIZE_KEYS or key not in values):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(
                f"{source} says {key} {value!r}, which makes no model: it must be a positive integer"
            )
    hidden, heads, kv_heads = (
        values.get("hidden_size"),
        values.get("num_attention_heads"),
        values.get("num_key_value_heads"),
    )
    if isinstance(heads, int) and isinstance(kv_heads, int) and heads % kv_heads:
        raise CheckpointError(
            f"{source}: num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})"
        )
    if values.get("head_dim") is None and isinstance(hidden, int) and isinstance(heads, int) and hidden % heads:
        raise CheckpointError(
            f"{source} says num_attention_heads {heads}, which does not divide hidden_size {hidden}, and gives no head_dim "
            "to use instead: set head_dim, or correct one of the two"
        )


def check_gate_variant(values: dict) -> None:
    """Refuse a gate that names an unknown value or has no meaning, in one line naming the key.

    ``values`` holds ``gate_type`` and the keys of :data:`GATE_VARIANT_DEFAULTS` (absent ones take the default).
    The output of o_proj (``dense_output``, G5) has no heads: a gate there is elementwise and not shared.
    A ``gate_type "none"`` model has no gate to place, so it takes the gate's defaults; the SDPA-output transform
    and the sandwich norm (:data:`UNGATED_VARIANT_KEYS`) apply with or without a gate. Every activation goes
    with every combination: identity multiplying is a bilinear gate, sigmoid adding a shift (neither a paper row).

    >>> check_gate_variant({"gate_type": "headwise", "gate_position": "dense_output"})
    Traceback (most recent call last):
    ...
    ValueError: gate_type 'headwise' at gate_position 'dense_output': the output of o_proj has no heads; use gate_type 'elementwise' there
    """
    values = {**GATE_VARIANT_DEFAULTS, **{key: value for key, value in values.items() if value is not None}}
    for key, allowed in (("gate_type", GATE_TYPES), *GATE_VARIANT_CHOICES.items()):
        if key in values and values[key] not in allowed:
            raise ValueError(f"unknown {key} {values[key]!r}; expected one of {', '.join(allowed)}")
    for key in ("gate_shared_across_heads", "sandwich_norm"):
        if not isinstance(values[key], bool):
            raise ValueError(f"{key} must be true or false, not {values[key]!r}")
    gate_type = values.get("gate_type", "none")
    if gate_type == "none":
        changed = [
            key
            for key, default in GATE_VARIANT_DEFAULTS.items()
            if values[key] != default and key not in UNGATED_VARIANT_KEYS
        ]
        if changed:
            raise ValueError(
                f"{', '.join(f'{key}={values[key]!r}' for key in changed)} describe a gate, but gate_type is 'none'; "
                "set gate_type to 'headwise' or 'elementwise' (--gate), or leave these at their defaults"
            )
    elif values["gate_position"] == "dense_output":
        if gate_type == "headwise":
            raise ValueError(
                "gate_type 'headwise' at gate_position 'dense_output': the output of o_proj has no heads; "
                "use gate_type 'elementwise' there"
            )
        if values["gate_shared_across_heads"]:
            raise ValueError(
                "gate_shared_across_heads at gate_position 'dense_output': the output of o_proj has no heads to "
                "share a gate across; leave it false there"
            )


def normalize_config_dict(config_dict: dict, source="the config") -> dict:
    """A released, stock Qwen3 or Qwen3Gated config.json's dict, ready for :class:`Qwen3GatedConfig`.

    Checks what it is (:func:`check_model_type`) and labels it ``"qwen3_gated"``: reading these as
    Qwen3Gated is the point of the class, so transformers is not left to warn about the label. A
    dict without ``model_type`` (keyword arguments, say) is taken as it is.

    >>> normalize_config_dict({"model_type": "qwen2", "use_qk_norm": True})["model_type"]
    'qwen3_gated'
    """
    check_sizes(config_dict, "config.json" if source == "the config" else f"the config.json of {source}")
    if "model_type" not in config_dict:
        return config_dict
    check_model_type(config_dict, source)
    return {**config_dict, "model_type": Qwen3GatedConfig.model_type}


__all__ = [
    "GatedAttentionConfigMixin",
    "Qwen3GatedConfig",
    "GATE_VARIANT_DEFAULTS",
    "check_gate_variant",
    "check_model_type",
    "check_sizes",
    "is_gated_attention_config",
    "normalize_config_dict",
]
