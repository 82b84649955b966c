"""Qwen3MoeGated: transformers' Qwen3-MoE with the dense model's gated attention.

Qwen3-MoE's attention is Qwen3's; only the MLP differs (routed experts, a router, dense layers where
``mlp_only_layers`` says). So this is Qwen3-MoE with one class replaced: each decoder layer's attention is
:class:`~gated_qwen.models.qwen3_gated.modeling_qwen3_gated.Qwen3GatedAttention`, the dense model's (the
same q_proj row layout, QK-norm, ``gate_override`` hook). Everything else (router, experts however the
installed transformers stores them, router logits and the auxiliary loss, caches, generation, attention
backends) is inherited from transformers' Qwen3-MoE.

Loading rules are not here: :mod:`gated_qwen.checkpoint.loading` puts the strict loader on
:class:`Qwen3MoeGatedPreTrainedModel` when this module is imported.
"""

from torch import nn
from transformers.modeling_layers import GenericForSequenceClassification
from transformers.models.qwen3_moe.modeling_qwen3_moe import (
    Qwen3MoeDecoderLayer,
    Qwen3MoeForCausalLM,
    Qwen3MoeModel,
    Qwen3MoePreTrainedModel,
    Qwen3MoeRMSNorm,
    Qwen3MoeRotaryEmbedding,
    Qwen3MoeTopKRouter,
)
from transformers.utils.output_capturing import OutputRecorder

from ..qwen3_gated.modeling_qwen3_gated import GatedAttentionInitMixin, Qwen3GatedAttention, SandwichNormMixin
from ..tensor_parallel import GatedQProjTensorParallelMixin
from .configuration_qwen3_moe_gated import Qwen3MoeGatedConfig


class Qwen3MoeGatedAttention(Qwen3GatedAttention):
    """The dense model's gated attention, with Qwen3-MoE's sliding window (every layer when ``use_sliding_window``)."""

    def __init__(self, config: Qwen3MoeGatedConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        # Qwen3 reads the window per layer type; Qwen3-MoE has no layer types and applies the config's window
        # (None unless use_sliding_window) to every layer.
        self.sliding_window = getattr(config, "sliding_window", None)


class Qwen3MoeGatedDecoderLayer(SandwichNormMixin, Qwen3MoeDecoderLayer):
    def __init__(self, config: Qwen3MoeGatedConfig, layer_idx: int):
        # Qwen3-MoE's layer (experts or dense MLP by its own rule) with the gated attention in place of its own.
        super().__init__(config, layer_idx)
        self.self_attn = Qwen3MoeGatedAttention(config=config, layer_idx=layer_idx)
        self.add_sandwich_norms(config)


class Qwen3MoeGatedPreTrainedModel(GatedAttentionInitMixin, GatedQProjTensorParallelMixin, Qwen3MoePreTrainedModel):
    config: Qwen3MoeGatedConfig
    _no_split_modules = ["Qwen3MoeGatedDecoderLayer"]
    # transformers decides whether a model may choose its experts implementation (eager, grouped_mm, ...) by
    # looking for `@use_experts_implementation` in the source of the class's module; the experts here are
    # transformers' own Qwen3MoeExperts, which carry it.
    _can_set_experts_implementation_cached_value = True
    _can_record_outputs = {
        "router_logits": OutputRecorder(Qwen3MoeTopKRouter, index=0),
        "hidden_states": Qwen3MoeGatedDecoderLayer,
        "attentions": Qwen3MoeGatedAttention,
    }


class Qwen3MoeGatedModel(Qwen3MoeGatedPreTrainedModel, Qwen3MoeModel):
    """The bare Qwen3MoeGated decoder, returning hidden states.

    >>> import torch
    >>> from gated_qwen import Qwen3MoeGatedConfig, Qwen3MoeGatedModel
    >>> config = Qwen3MoeGatedConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
    ...                              num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    ...                              num_experts=4, num_experts_per_tok=2, headwise_attn_output_gate=True)
    >>> Qwen3MoeGatedModel(config)(torch.tensor([[1, 2, 3]])).last_hidden_state.shape
    torch.Size([1, 3, 32])
    """

    def __init__(self, config: Qwen3MoeGatedConfig):
        # Qwen3MoeModel.__init__ with Qwen3MoeGatedDecoderLayer: its body names its layer class, and building
        # through it then replacing the layers would build every layer (every expert) twice.
        Qwen3MoeGatedPreTrainedModel.__init__(self, config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(
            [Qwen3MoeGatedDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        self.norm = Qwen3MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3MoeRotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.post_init()


class Qwen3MoeGatedForCausalLM(Qwen3MoeGatedPreTrainedModel, Qwen3MoeForCausalLM):
    """Qwen3MoeGated with a language-model head (router logits and auxiliary loss as in Qwen3-MoE).

    >>> from gated_qwen import Qwen3MoeGatedForCausalLM
    >>> import tempfile
    >>> from gated_qwen import Qwen3MoeGatedConfig
    >>> config = Qwen3MoeGatedConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
    ...                              num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    ...                              num_experts=4, num_experts_per_tok=2, headwise_attn_output_gate=True)
    >>> with tempfile.TemporaryDirectory() as folder:  # a converted checkpoint (gated-qwen convert) loads the same way
    ...     Qwen3MoeGatedForCausalLM(config).save_pretrained(folder)
    ...     model = Qwen3MoeGatedForCausalLM.from_pretrained(folder)
    >>> model.config.gate_type, model.config.num_experts
    ('headwise', 4)
    """

    def __init__(self, config: Qwen3MoeGatedConfig):
        # Qwen3MoeForCausalLM.__init__ with Qwen3MoeGatedModel, for the same reason.
        Qwen3MoeGatedPreTrainedModel.__init__(self, config)
        self.model = Qwen3MoeGatedModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.router_aux_loss_coef = config.router_aux_loss_coef
        self.num_experts = config.num_experts
        self.num_experts_per_tok = config.num_experts_per_tok
        self.post_init()


class Qwen3MoeGatedForSequenceClassification(GenericForSequenceClassification, Qwen3MoeGatedPreTrainedModel):
    """Qwen3MoeGated with a classification head on the last non-padding token, as Qwen3-MoE has."""


__all__ = [
    "Qwen3MoeGatedAttention",
    "Qwen3MoeGatedDecoderLayer",
    "Qwen3MoeGatedForCausalLM",
    "Qwen3MoeGatedForSequenceClassification",
    "Qwen3MoeGatedModel",
    "Qwen3MoeGatedPreTrainedModel",
]
