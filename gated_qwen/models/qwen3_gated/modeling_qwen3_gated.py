"""Qwen3Gated: transformers' Qwen3 with a sigmoid gate on each head's attention output.

Only the attention differs from Qwen3 (arXiv 2505.06708): q_proj carries the gate logits as extra
rows in the released layout (:mod:`gated_qwen.models.layout`), and ``sigmoid(gate)`` scales the output of
scaled dot-product attention before o_proj. Everything else (decoder layer forward, masks, caches,
generation, heads) is inherited from transformers' Qwen3.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3Attention,
    Qwen3DecoderLayer,
    Qwen3ForCausalLM,
    Qwen3ForSequenceClassification,
    Qwen3MLP,
    Qwen3Model,
    Qwen3PreTrainedModel,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    apply_rotary_pos_emb,
    eager_attention_forward,
)
from transformers.configuration_utils import PreTrainedConfig
from transformers.generation import GenerationMixin
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import logging

from ...checkpoint import HUB_KWARGS, check_q_proj_layout, read_weight_file_header, resolve_weight_files
from .configuration_qwen3_gated import Qwen3GatedConfig
from ...errors import CheckpointError
from ..auto import register_with_transformers
from ..layout import gate_dim, q_proj_rows, split_query_and_gate

logger = logging.get_logger(__name__)


class Qwen3GatedAttention(Qwen3Attention):
    """Qwen3 attention whose q_proj also yields gate logits; QK-norm optional, as in the release."""

    # Hook point for causal ablations (set and reset by gated_qwen.tools.analysis.override_gates): maps the
    # gate after the sigmoid, (B, T, H, g), to the gate to apply. None leaves the forward untouched.
    gate_override: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __init__(self, config: Qwen3GatedConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.gate_type = config.gate_type
        self.gate_dim = gate_dim(config.gate_type, self.head_dim)
        self.q_proj = nn.Linear(
            config.hidden_size,
            q_proj_rows(config.gate_type, config.num_attention_heads, self.head_dim),
            bias=config.attention_bias,  # the config keeps it equal to qkv_bias
        )
        if not config.use_qk_norm:
            self.q_norm = nn.Identity()
            self.k_norm = nn.Identity()

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache: Cache | None = None,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # transformers before 5.24 hands the cache over as `past_key_values`, 5.24 and later as `cache`;
        # reading only one name would silently decode without the cache under the other.
        cache = cache if cache is not None else past_key_values
        input_shape = hidden_states.shape[:-1]  # (B, T)
        # Three projections of the same input, one after another: vLLM fuses them into one qkv_proj.
        query_and_gate = self.q_proj(hidden_states)
        key_states = self.k_proj(hidden_states).view(*input_shape, -1, self.head_dim)  # (B, T, K, D)
        value_states = self.v_proj(hidden_states).view(*input_shape, -1, self.head_dim)
        # K is read off the key projection, not the config: under tensor parallelism this rank
        # holds only its shard of kv groups (and of q_proj's rows, which are grouped the same way).
        query_states, gate_logits = split_query_and_gate(
            query_and_gate, key_states.shape[-2], self.head_dim, self.gate_dim
        )  # views: (B, T, K, G, D) and (B, T, K, G, g)

        query_states = self.q_norm(query_states).reshape(*input_shape, -1, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        key_states = self.k_norm(key_states).transpose(1, 2)  # (B, K, T, D)
        value_states = value_states.transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

        if cache is not None:
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx, kwargs=kwargs)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            sliding_window=self.sliding_window,
            **kwargs,
        )  # transformers' interfaces: (B, T, H, D); vLLM's: (tokens, H*D)

        if self.gate_dim:
            gate = torch.sigmoid(gate_logits.reshape(*input_shape, -1, self.gate_dim))  # (B, T, H, g)
            if self.gate_override is not None:
                gate = self.gate_override(gate)
            # Per head whatever layout the interface returned; in the model's dtype, as the released code does.
            attn_output = attn_output.reshape(*input_shape, -1, self.head_dim) * gate
        attn_output = self.o_proj(attn_output.reshape(*input_shape, -1))
        return attn_output, attn_weights


class Qwen3GatedDecoderLayer(Qwen3DecoderLayer):
    def __init__(self, config: Qwen3GatedConfig, layer_idx: int):
        GradientCheckpointingLayer.__init__(self)
        self.hidden_size = config.hidden_size
        self.self_attn = Qwen3GatedAttention(config=config, layer_idx=layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class Qwen3GatedPreTrainedModel(Qwen3PreTrainedModel):
    config_class = Qwen3GatedConfig
    config: Qwen3GatedConfig
    _no_split_modules = ["Qwen3GatedDecoderLayer"]
    _can_record_outputs = {
        "hidden_states": Qwen3GatedDecoderLayer,
        "attentions": Qwen3GatedAttention,
    }
    # Head weights a checkpoint of this same class must hold (see from_pretrained).
    _required_head_keys: tuple[str, ...] = ()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, strict: bool = True, **kwargs):
        """transformers' ``from_pretrained``, strict where a mismatch means the config does not describe the weights.

        Reads the released arms as they are (``model_type "qwen2"``, one ``pytorch_model.bin``, which
        transformers reads with ``torch.load(weights_only=True)``), stock Qwen3 checkpoints (gate
        ``"none"``) and checkpoints saved here. Python files beside the weights are never imported.

        Errors (:class:`~gated_qwen.errors.CheckpointError`), unless ``strict=False``:

        * a q_proj whose rows do not fit the config's gate type (checked before any weight is read, from
          the safetensors headers or a ``.bin``'s pickle without its data);
        * a checkpoint that holds part of the decoder but not all of it (layers, norms, biases missing),
          or decoder weights the config has no place for (QK-norm, biases, extra layers);
        * a causal-LM checkpoint (decoder under ``model.`` and no other head) without ``lm_head`` while
          the config says the embeddings are untied.

        As in transformers (the weight is initialised or dropped, and named in the load report and in
        ``output_loading_info``): task heads the checkpoint or the model lacks (``lm_head`` when loading a
        bare-model checkpoint into the causal LM, a new classifier's ``score``, ``lm_head`` when loading into
        a classifier), an explicit ``state_dict``, a checkpoint that holds none of the model's weights, and
        sizes that differ under ``ignore_mismatched_sizes=True`` (q_proj's gate rows excepted: still an
        error). ``strict=False`` is transformers' behaviour in every case. ``trust_remote_code=True`` is
        refused.

        >>> model = Qwen3GatedForCausalLM.from_pretrained("path/to/1B_gate_headwise")  # doctest: +SKIP
        >>> model = Qwen3GatedForCausalLM.from_pretrained("path/to/bare_model", strict=False)  # doctest: +SKIP
        """
        output_loading_info = kwargs.pop("output_loading_info", False)
        if kwargs.get("trust_remote_code"):
            raise CheckpointError(
                "trust_remote_code is not needed for Qwen3Gated and is refused: this class never runs code from a checkpoint"
            )
        config = kwargs.get("config")
        checkable = strict and pretrained_model_name_or_path is not None and not (
            kwargs.get("state_dict") is not None or kwargs.get("gguf_file") or kwargs.get("from_tf")
        )
        if checkable:
            if not isinstance(config, PreTrainedConfig):
                overrides = {k: v for k, v in kwargs.items() if k in cls.config_class.__dataclass_fields__}
                config = cls.config_class.from_pretrained(
                    config or pretrained_model_name_or_path,
                    **{k: v for k, v in kwargs.items() if k in HUB_KWARGS},
                    **overrides,
                )
            tensors = {}
            for file in resolve_weight_files(pretrained_model_name_or_path, **kwargs):
                tensors.update(read_weight_file_header(file))
            check_q_proj_layout(config, tensors, str(pretrained_model_name_or_path))

        model, loading_info = super().from_pretrained(
            pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
        )
        if checkable:
            check_loaded_weights(model, loading_info, set(tensors) or None, str(pretrained_model_name_or_path))
        return (model, loading_info) if output_loading_info else model


def check_loaded_weights(model, loading_info: dict, checkpoint_keys: set[str] | None, source: str) -> None:
    """Refuse a load whose missing or unexpected weights show that the config does not describe the checkpoint.

    ``loading_info`` is ``from_pretrained``'s (``output_loading_info=True``); ``checkpoint_keys`` the weight
    names in the checkpoint (None when unknown). The rule is :meth:`Qwen3GatedPreTrainedModel.from_pretrained`'s.

    >>> model, info = Qwen3GatedForCausalLM.from_pretrained(folder, strict=False, output_loading_info=True)  # doctest: +SKIP
    >>> check_loaded_weights(model, info, set(read_weight_file_header(folder / "model.safetensors")), str(folder))  # doctest: +SKIP
    """
    base = model.base_model
    prefix = "" if base is model else f"{model.base_model_prefix}."
    decoder_modules = {name for name, _ in base.named_children()}

    def in_decoder(key: str) -> bool:  # a key of the bare decoder, with or without the head's prefix
        return key.removeprefix(f"{model.base_model_prefix}.").split(".", 1)[0] in decoder_modules

    missing, unexpected = set(loading_info.get("missing_keys") or ()), set(loading_info.get("unexpected_keys") or ())
    decoder_keys = {key for key in model.state_dict() if key.startswith(prefix) and in_decoder(key)}
    missing_decoder = sorted(missing & decoder_keys)
    problems = []
    # All of the decoder missing: the checkpoint is not of this model at all, which transformers reports.
    if missing_decoder and len(missing_decoder) < len(decoder_keys):
        problems.append(("lacks weights the model needs", missing_decoder))
    unexpected_decoder = sorted(key for key in unexpected if in_decoder(key))
    if unexpected_decoder:
        problems.append(("has weights the model has no place for", unexpected_decoder))
    # A checkpoint of this same head (its decoder under the prefix, no other head) must carry the head too;
    # a bare-model checkpoint gets a fresh head, as in transformers.
    head_checkpoint = bool(prefix) and checkpoint_keys is not None and any(k.startswith(prefix) for k in checkpoint_keys)
    other_heads = [key for key in unexpected if not in_decoder(key)]
    missing_heads = sorted(missing & set(model._required_head_keys))
    if head_checkpoint and not other_heads and missing_heads:
        problems.append(("lacks weights the model needs", missing_heads))
    for what, keys in problems:
        shown = ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
        raise CheckpointError(
            f"{source} {what}: {shown}. The config does not describe these weights (check use_qk_norm, qkv_bias, "
            "tie_word_embeddings, num_hidden_layers against the checkpoint), or pass strict=False to load it as "
            "transformers would."
        )


class Qwen3GatedModel(Qwen3GatedPreTrainedModel, Qwen3Model):
    """The bare Qwen3Gated decoder, returning hidden states.

    >>> from gated_qwen import Qwen3GatedConfig, Qwen3GatedModel
    >>> config = Qwen3GatedConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    ...                           num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    ...                           headwise_attn_output_gate=True)
    >>> Qwen3GatedModel(config)(torch.tensor([[1, 2, 3]])).last_hidden_state.shape
    torch.Size([1, 3, 32])
    """

    def __init__(self, config: Qwen3GatedConfig):
        Qwen3GatedPreTrainedModel.__init__(self, config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(
            [Qwen3GatedDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.has_sliding_layers = "sliding_attention" in self.config.layer_types
        self.post_init()


class Qwen3GatedForCausalLM(Qwen3GatedPreTrainedModel, Qwen3ForCausalLM, GenerationMixin):
    """Qwen3Gated with a language-model head; loads the released checkpoints directly.

    >>> from gated_qwen import Qwen3GatedForCausalLM
    >>> model = Qwen3GatedForCausalLM.from_pretrained("QwQZh/gated_attention", subfolder="1B_gate_headwise")  # doctest: +SKIP
    """

    _required_head_keys = ("lm_head.weight",)  # absent only when tied; then transformers does not report it

    def __init__(self, config: Qwen3GatedConfig):
        Qwen3GatedPreTrainedModel.__init__(self, config)
        self.model = Qwen3GatedModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()


class Qwen3GatedForSequenceClassification(Qwen3GatedPreTrainedModel, Qwen3ForSequenceClassification):
    """Qwen3Gated with a classification head on the last non-padding token (built via AutoModel).

    Loading a causal-LM checkpoint into it is strict about the decoder and, as in transformers,
    starts the ``score`` head fresh (and drops ``lm_head``).
    """


__all__ = [
    "Qwen3GatedAttention",
    "Qwen3GatedDecoderLayer",
    "Qwen3GatedForCausalLM",
    "Qwen3GatedForSequenceClassification",
    "Qwen3GatedModel",
    "Qwen3GatedPreTrainedModel",
    "check_loaded_weights",
]

register_with_transformers()  # importing the model makes it known to AutoConfig / AutoModel*
