"""The vLLM model classes that :mod:`gated_qwen.serving.vllm_plugin` registers (this module imports vLLM).

vLLM constructs them as ``cls(vllm_config=..., prefix=...)``; nothing here is called directly.

The released gate (sigmoid, multiplying each head's SDPA output, headwise or elementwise) is served natively:
vLLM's own Qwen3 and Qwen3-MoE, with each layer's attention given the gate as vLLM's Qwen3-Next gives its own
(:class:`GatedAttention`). A config the native classes do not describe
(:func:`~gated_qwen.serving.vllm_plugin.serves_natively`) is refused where the model is built, as the plugin's
front-end check refuses it before.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import divide, get_tensor_model_parallel_world_size
from vllm.model_executor.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM
from vllm.model_executor.models.utils import PPMissingLayer

from ..errors import CheckpointError
from ..models.layout import gate_dim
from ..models.qwen3_gated.configuration_qwen3_gated import (
    GatedAttentionConfigMixin,
    Qwen3GatedConfig,
    is_gated_attention_config,
)
from ..models.qwen3_moe_gated.configuration_qwen3_moe_gated import Qwen3MoeGatedConfig
from .vllm_plugin import (
    check_serving_options,
    check_tensor_parallel_size,
    q_proj_rows_by_rank,
    serves_natively,
    unserved_variant_message,
)


class GatedQKVParallelLinear(QKVParallelLinear):
    """vLLM's fused q/k/v projection with the gate logits as more rows of the query shard.

    Each rank's output is ``[its queries | their gate logits | its keys | its values]``: vLLM's Qwen3 split plus
    one slice. The released q_proj (queries and gate logits grouped by kv head) is reordered at load
    (:func:`~gated_qwen.serving.vllm_plugin.q_proj_rows_by_rank`), so that each rank takes its heads' queries
    and gate rows. The tensor-parallel size divides the kv heads (the plugin refuses any other), so no kv head
    is replicated.
    """

    def __init__(self, attention: nn.Module, gate_dim: int, quant_config, prefix: str):
        stock: QKVParallelLinear = attention.qkv_proj
        tp_size = get_tensor_model_parallel_world_size()
        # QKVParallelLinear's own attributes, which its loaders read; its __init__ would size q as H*D rows.
        self.hidden_size, self.head_size, self.v_head_size = stock.hidden_size, stock.head_size, stock.v_head_size
        self.total_num_heads, self.total_num_kv_heads = stock.total_num_heads, stock.total_num_kv_heads
        self.num_heads = divide(self.total_num_heads, tp_size)
        self.num_kv_heads = divide(self.total_num_kv_heads, tp_size)
        self.num_kv_head_replicas = 1
        self.gate_dim = gate_dim
        self.output_sizes = [
            self.num_heads * (self.head_size + gate_dim) * tp_size,
            self.num_kv_heads * self.head_size * tp_size,
            self.num_kv_heads * self.v_head_size * tp_size,
        ]
        ColumnParallelLinear.__init__(
            self,
            input_size=self.hidden_size,
            output_size=sum(self.output_sizes),
            bias=stock.bias is not None,
            gather_output=False,
            quant_config=quant_config,
            prefix=prefix,
        )

    def _get_shard_offset_mapping(self, loaded_shard_id: str):
        query, key, _ = self._shard_sizes()
        return {"q": 0, "k": query, "v": query + key, "total": sum(self._shard_sizes())}.get(loaded_shard_id)

    def _get_shard_size_mapping(self, loaded_shard_id: str):
        return dict(zip("qkv", self._shard_sizes())).get(loaded_shard_id)

    def _shard_sizes(self) -> tuple[int, int, int]:
        return tuple(divide(size, self.tp_size) for size in self.output_sizes)

    def _ranked(self, loaded_weight: torch.Tensor, loaded_shard_id: str | None) -> torch.Tensor:
        if loaded_shard_id != "q":
            return loaded_weight
        return q_proj_rows_by_rank(loaded_weight, self.total_num_kv_heads, self.head_size, self.gate_dim, self.tp_size)

    def weight_loader_v2(self, param, loaded_weight: torch.Tensor, loaded_shard_id: str | None = None):
        if loaded_shard_id is None:
            raise ValueError(f"{self.prefix}: a fused qkv_proj in the checkpoint is not a gated-qwen layout")
        super().weight_loader_v2(param, self._ranked(loaded_weight, loaded_shard_id), loaded_shard_id)

    def weight_loader(self, param, loaded_weight: torch.Tensor, loaded_shard_id: str | None = None):
        # vLLM's loader for the bias (QKVParallelLinear's own would place k and v after H*D query rows).
        if loaded_shard_id not in ("q", "k", "v") or getattr(param, "output_dim", None) != 0:
            raise ValueError(f"{self.prefix}: cannot load {loaded_shard_id!r} into a gated qkv_proj")
        offset, size = self._get_shard_offset_mapping(loaded_shard_id), self._get_shard_size_mapping(loaded_shard_id)
        shard = self._ranked(loaded_weight, loaded_shard_id).narrow(0, self.tp_rank * size, size)
        param.data.narrow(0, offset, size).copy_(shard)


class GatedAttention(nn.Module):
    """vLLM's Qwen3 (or Qwen3-MoE) attention with the released output gate, as Qwen3-Next applies its own.

    Built from the layer's own attention: its ``Attention``, ``o_proj`` (``RowParallelLinear``; one with a bias
    where the config has attention biases, which vLLM's Qwen3 gives q/k/v only), rotary embedding and QK-norms are
    kept; its ``qkv_proj`` is replaced by a :class:`GatedQKVParallelLinear` that
    also yields the gate logits. The SDPA output of each head is multiplied by the sigmoid of its logits
    (one per head, headwise; one per channel, elementwise) before ``o_proj``.
    """

    def __init__(self, attention: nn.Module, config: GatedAttentionConfigMixin, quant_config):
        super().__init__()
        self.num_heads, self.head_dim = attention.num_heads, attention.head_dim
        self.q_size, self.kv_size = attention.q_size, attention.kv_size
        self.gate_dim = gate_dim(config.gate_type, self.head_dim)
        self.gate_size = self.num_heads * self.gate_dim
        self.qkv_proj = GatedQKVParallelLinear(attention, self.gate_dim, quant_config, attention.qkv_proj.prefix)
        self.rotary_emb, self.attn, self.o_proj = attention.rotary_emb, attention.attn, attention.o_proj
        if config.attention_bias and self.o_proj.bias is None:  # qkv_bias biases o_proj too, as the released code
            self.o_proj = RowParallelLinear(
                self.o_proj.input_size,
                self.o_proj.output_size,
                bias=True,
                quant_config=quant_config,
                prefix=self.o_proj.prefix,
            )
        self.q_norm = attention.q_norm if config.use_qk_norm else None
        self.k_norm = attention.k_norm if config.use_qk_norm else None

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, gate, k, v = qkv.split([self.q_size, self.gate_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None:
            q = self.q_norm(q.view(*q.shape[:-1], -1, self.head_dim)).view(q.shape)
            k = self.k_norm(k.view(*k.shape[:-1], -1, self.head_dim)).view(k.shape)
        q, k = self.rotary_emb(positions, q, k)
        attn_output = self.attn(q, k, v)  # (tokens, heads * head_dim)
        if self.gate_dim:  # in the model's dtype, as the released code gates
            heads = attn_output.view(*attn_output.shape[:-1], self.num_heads, self.head_dim)
            gate = torch.sigmoid(gate).view(*gate.shape[:-1], self.num_heads, self.gate_dim)
            attn_output = (heads * gate).flatten(-2)
        output, _ = self.o_proj(attn_output)
        return output


def add_gates(model: nn.Module, config: GatedAttentionConfigMixin, quant_config) -> None:
    """Give every decoder layer of vLLM's Qwen3 or Qwen3-MoE model (``model.layers``) the gated attention."""
    for layer in model.layers:
        if not isinstance(layer, PPMissingLayer):
            layer.self_attn = GatedAttention(layer.self_attn, config, quant_config)


def read_as_gated(vllm_config: VllmConfig, config_class: type = Qwen3GatedConfig) -> GatedAttentionConfigMixin:
    """The config vLLM read, as gated-qwen's (a released arm is read by vLLM as Qwen2 or Qwen3), put back in place.

    Refuses a tensor-parallel size that would cut a kv group, LoRA and a quantized checkpoint (the front end refuses
    them first).
    """
    model_config = vllm_config.model_config
    if not isinstance(model_config.hf_config, config_class):
        # The dict vLLM's config holds, not the file: it keeps vLLM's overrides (hf_overrides).
        config = config_class.from_dict(model_config.hf_config.to_dict())
        model_config.hf_config = model_config.hf_text_config = config
    if not serves_natively(model_config.hf_config):  # the front end refuses it first; a caller that skips it
        raise CheckpointError(unserved_variant_message(model_config.hf_config, model_config.model))
    check_tensor_parallel_size(
        model_config.hf_config.num_key_value_heads, vllm_config.parallel_config.tensor_parallel_size
    )
    check_serving_options(vllm_config)
    return model_config.hf_config


class Qwen3GatedForCausalLM(Qwen3ForCausalLM):
    """vLLM's own Qwen3 with the released gate in its attention (:class:`GatedAttention`)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        config = read_as_gated(vllm_config)
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        add_gates(self.model, config, vllm_config.quant_config)


class Qwen3MoeGatedForCausalLM(Qwen3MoeForCausalLM):
    """vLLM's own Qwen3-MoE (``FusedMoE`` experts) with the released gate in its attention (:class:`GatedAttention`)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        config = read_as_gated(vllm_config, Qwen3MoeGatedConfig)
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        add_gates(self.model, config, vllm_config.quant_config)


class Qwen3OrGatedForCausalLM(Qwen3ForCausalLM):
    """What vLLM builds for architecture ``Qwen3ForCausalLM`` once gated-qwen is installed.

    A released gated arm names that architecture too (with ``model_type "qwen2"``); it is told apart
    by its config keys (:func:`~gated_qwen.models.qwen3_gated.configuration_qwen3_gated.is_gated_attention_config`: the
    gate flags, ``use_qk_norm``, ``qkv_bias``) and built as :class:`Qwen3GatedForCausalLM`. Any other
    config gets vLLM's own Qwen3, unchanged. Inheriting vLLM's Qwen3 keeps what vLLM's registry reads
    off the class (a text-generation model, pipeline-parallel, LoRA) true for both.
    """

    def __new__(cls, *, vllm_config: VllmConfig, prefix: str = ""):
        if is_gated_attention_config(vllm_config.model_config.hf_config.to_dict()):
            return Qwen3GatedForCausalLM(vllm_config=vllm_config, prefix=prefix)
        return super().__new__(cls)
