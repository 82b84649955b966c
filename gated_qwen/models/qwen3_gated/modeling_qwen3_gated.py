"""Qwen3Gated: transformers' Qwen3 with a sigmoid gate on each head's attention output.

Only the attention differs from Qwen3 (arXiv 2505.06708): q_proj carries the gate logits as extra
rows in the released layout (:mod:`gated_qwen.models.layout`), and ``sigmoid(gate)`` scales the output of
scaled dot-product attention before o_proj. Everything else (decoder layer forward, masks, caches,
generation, heads) is inherited from transformers' Qwen3.

Loading rules (what ``from_pretrained`` refuses) are not here: :mod:`gated_qwen.checkpoint.loading` puts the
strict loader on :class:`Qwen3GatedPreTrainedModel` when this module is imported.
"""

from collections.abc import Callable

import torch
import transformers
from packaging import version
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache
from transformers.integrations import use_kernelized_func
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3Attention,
    Qwen3DecoderLayer,
    Qwen3ForCausalLM,
    Qwen3ForSequenceClassification,
    Qwen3Model,
    Qwen3PreTrainedModel,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    apply_rotary_pos_emb,
    eager_attention_forward,
)
from transformers.utils import logging
from transformers.utils.deprecation import deprecate_kwarg

from ..layout import gate_dim, gate_heads_and_width, q_proj_rows, split_query_and_gate
from ..tensor_parallel import GatedQProjTensorParallelMixin
from .configuration_qwen3_gated import Qwen3GatedConfig


logger = logging.get_logger(__name__)

# transformers renamed the attention's cache argument from `past_key_values` to `cache` in 5.24 (Qwen3Attention
# takes `cache` and renames the old keyword with this decorator, warning until its removal in 5.40). Before 5.24
# the decoder layers themselves pass `past_key_values`: there it is renamed without a warning (a version already
# reached never warns), since it is transformers' own call, not the user's. docs/compatibility.md lists this.
_CACHE_RENAMED_IN = "5.24.0"
accept_past_key_values = deprecate_kwarg(
    "past_key_values",
    "5.40.0"
    if version.parse(transformers.__version__) >= version.parse(_CACHE_RENAMED_IN)
    else transformers.__version__,
    new_name="cache",
)


class NonSparseSigmoid(nn.Module):
    """``0.5 + 0.5 * sigmoid(x)``: gate scores in [0.5, 1], never near zero (the paper's NS-sigmoid, Table 4 row 7)."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return 0.5 + 0.5 * torch.sigmoid(logits)


def gate_activation(name: str) -> nn.Module:
    """The gate's activation as a module (analysis hooks its output to record the gate scores)."""
    return {"ns_sigmoid": NonSparseSigmoid, "identity": nn.Identity}.get(name, lambda: ACT2FN[name])()


@use_kernelized_func(apply_rotary_pos_emb)  # as Qwen3Attention: hub kernels (use_kernels) may swap in a RoPE kernel
class Qwen3GatedAttention(Qwen3Attention):
    """Qwen3 attention with a gate computed from the layer's input; QK-norm optional, as in the release.

    The released gate (sigmoid, multiplying each head's SDPA output) reads its logits off extra rows of
    q_proj. Every other gate of the design space (docs/design-space.md) has a projection of its own,
    ``g_proj``, and acts on the value, key or query projection's output or on o_proj's output.
    """

    # Hub kernels: `kernelize` replaces the forward of every module whose class names a kernel layer
    # (`kernel_layer_name`, set by transformers' use_kernel_forward_from_hub and inherited by subclasses). A kernel
    # written for Qwen3's attention would drop the gate. Qwen3Attention names none (transformers 5.19 to 5.25); should
    # a release name one, this condition makes `kernelize` skip the gated attention (docs/compatibility.md).
    kernel_condition = staticmethod(lambda module: False)

    # Hook point for causal ablations (set and reset by gated_qwen.tools.analysis.gates.override_gates): maps the
    # gate after its activation, (B, T, heads, width) as at its position, to the gate to apply. None leaves it.
    gate_override: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __init__(self, config: Qwen3GatedConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.gate_type = config.gate_type
        self.gate_position = config.gate_position if config.gate_type != "none" else None
        self.gate_combination = config.gate_combination
        # gate_dim: gate logits per head in q_proj (the released layout), else 0.
        self.gate_dim = gate_dim(config.gate_type, self.head_dim) if config.gate_in_q_proj else 0
        self.q_proj = nn.Linear(
            config.hidden_size,
            q_proj_rows(
                config.gate_type if config.gate_in_q_proj else "none", config.num_attention_heads, self.head_dim
            ),
            bias=config.attention_bias,  # the config keeps it equal to qkv_bias
        )
        self.gate_input = config.gate_input
        if self.gate_position is not None:
            self.gate_act_fn = gate_activation(config.gate_activation)
        if self.gate_position is not None and not config.gate_in_q_proj:
            heads, width = gate_heads_and_width(config)
            if config.gate_input == "none":  # the same scores for every token; zero: sigmoid 0.5 (_init_weights)
                self.gate_logits = nn.Parameter(torch.zeros(heads, width))
            else:
                self.g_proj = nn.Linear(config.hidden_size, heads * width, bias=False)
        # On each head's SDPA output, before any gate there (the order of Qwen3-Next's gated RMSNorm).
        if config.attn_output_transform == "silu":
            self.attn_output_transform = nn.SiLU()
        elif config.attn_output_transform == "rmsnorm":
            self.attn_output_transform = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)  # over head_dim
        if not config.use_qk_norm:
            self.q_norm = nn.Identity()
            self.k_norm = nn.Identity()

    def apply_gate(self, states: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
        """``states`` (B, T, n, D) combined with the gate (B, T, 1 or n, g), per the config's activation and combination."""
        gate = self.gate_act_fn(gate_logits)
        if self.gate_override is not None:
            gate = self.gate_override(gate)
        # In the model's dtype, as the released code does.
        return states * gate if self.gate_combination == "multiplicative" else states + gate

    def _own_gate(self, hidden_states: torch.Tensor, position: str, states: torch.Tensor) -> torch.Tensor:
        """``states`` (B, T, n, D) gated by g_proj's scores when the gate sits at ``position``, else as they are."""
        if self.gate_position != position or self.gate_dim:
            return states
        if self.gate_input == "none":  # (n or 1, D or 1), the same at every token
            return self.apply_gate(states, self.gate_logits.expand(*states.shape[:2], -1, -1))
        width = states.shape[-1] if self.gate_type == "elementwise" else 1
        gate_logits = self.g_proj(hidden_states).view(*states.shape[:2], -1, width)  # (B, T, n or 1, D or 1)
        return self.apply_gate(states, gate_logits)

    @accept_past_key_values
    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
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

        # Key and query gates act after QK-norm (a headwise gate before the RMSNorm would be normalised away) and
        # before RoPE; the value gate before the cache, so cached values are gated by the token that wrote them.
        query_states = self._own_gate(
            hidden_states, "query", self.q_norm(query_states).reshape(*input_shape, -1, self.head_dim)
        ).transpose(1, 2)  # (B, H, T, D)
        key_states = self._own_gate(hidden_states, "key", self.k_norm(key_states)).transpose(1, 2)  # (B, K, T, D)
        value_states = self._own_gate(hidden_states, "value", value_states).transpose(1, 2)

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

        # Per head whatever layout the interface returned.
        attn_output = attn_output.reshape(*input_shape, -1, self.head_dim)  # (B, T, H, D)
        if hasattr(self, "attn_output_transform"):
            attn_output = self.attn_output_transform(attn_output)
        if self.gate_dim:
            attn_output = self.apply_gate(attn_output, gate_logits.reshape(*input_shape, -1, self.gate_dim))
        attn_output = self._own_gate(hidden_states, "sdpa_output", attn_output)
        attn_output = self.o_proj(attn_output.reshape(*input_shape, -1))  # (B, T, hidden)
        attn_output = self._own_gate(hidden_states, "dense_output", attn_output.unsqueeze(-2)).squeeze(-2)
        return attn_output, attn_weights


class SandwichNormMixin:
    """A decoder layer that, with ``sandwich_norm``, normalises the attention's and the MLP's outputs before each
    residual add (the paper's Table 2 row 7). Without it the layer is transformers' own, forward included."""

    def add_sandwich_norms(self, config) -> None:
        self.sandwich_norm = config.sandwich_norm
        if self.sandwich_norm:
            self.attn_output_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.mlp_output_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if not self.sandwich_norm:
            return super().forward(hidden_states, *args, **kwargs)
        if args:
            raise TypeError("a sandwich-norm decoder layer takes its arguments after hidden_states by keyword")
        # transformers' layer forward, each block's output normalised; the model passes everything by keyword
        # (position_embeddings, attention_mask, the cache under its name of the installed version).
        residual = hidden_states
        attention_output, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
        hidden_states = residual + self.attn_output_layernorm(attention_output)
        mlp_output = self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states + self.mlp_output_layernorm(mlp_output)


class Qwen3GatedDecoderLayer(SandwichNormMixin, Qwen3DecoderLayer):
    def __init__(self, config: Qwen3GatedConfig, layer_idx: int):
        # Qwen3's layer with the gated attention in place of its own (the one it builds is dropped at once;
        # post_init initialises the modules that remain).
        super().__init__(config, layer_idx)
        self.self_attn = Qwen3GatedAttention(config=config, layer_idx=layer_idx)
        self.add_sandwich_norms(config)


class GatedAttentionInitMixin:
    """Initialises the one parameter transformers does not know: an input-independent gate's scores, at zero."""

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, Qwen3GatedAttention) and hasattr(module, "gate_logits"):
            init.zeros_(module.gate_logits)


class Qwen3GatedPreTrainedModel(GatedAttentionInitMixin, GatedQProjTensorParallelMixin, Qwen3PreTrainedModel):
    config: Qwen3GatedConfig
    _no_split_modules = ["Qwen3GatedDecoderLayer"]
    _can_record_outputs = {
        "hidden_states": Qwen3GatedDecoderLayer,
        "attentions": Qwen3GatedAttention,
    }


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
        # Qwen3Model.__init__ with Qwen3GatedDecoderLayer. Its body names its layer class, and building through
        # it and then replacing the layers would build (and, outside from_pretrained, allocate) every layer twice.
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


class Qwen3GatedForCausalLM(Qwen3GatedPreTrainedModel, Qwen3ForCausalLM):
    """Qwen3Gated with a language-model head; loads the released checkpoints directly.

    >>> from gated_qwen import Qwen3GatedForCausalLM
    >>> from gated_qwen.default_models import default_model_path
    >>> model = Qwen3GatedForCausalLM.from_pretrained(default_model_path("headwise"))  # or a hub id and subfolder
    >>> model.config.gate_type, model.model.layers[0].self_attn.q_proj.weight.shape  # 4 heads of 64, 1 gate row each
    ('headwise', torch.Size([260, 256]))
    """

    def __init__(self, config: Qwen3GatedConfig):
        # Qwen3ForCausalLM.__init__ with Qwen3GatedModel, for the same reason (its body names Qwen3Model).
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
]
