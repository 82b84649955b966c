"""The vLLM model classes that :mod:`gated_qwen.serving.vllm_plugin` registers (this module imports vLLM).

vLLM constructs them as ``cls(vllm_config=..., prefix=...)``; nothing here is called directly.
"""

from __future__ import annotations

from vllm.config import VllmConfig
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
from vllm.model_executor.models.transformers import TransformersForCausalLM, TransformersMoEForCausalLM

from ..models.qwen3_gated.configuration_qwen3_gated import Qwen3GatedConfig, is_gated_attention_config
from .vllm_plugin import check_tensor_parallel_size


class Qwen3GatedForCausalLM(TransformersForCausalLM):
    """vLLM's Transformers backend running gated-qwen's model.

    The backend builds the model with ``AutoModel.from_config`` (a ``Qwen3GatedModel``), fuses
    q/k/v into one ``qkv_proj`` where the shapes allow, shards by ``base_model_tp_plan`` and calls the
    attention through transformers' attention interface. This class adds two things: a config that
    vLLM read as Qwen2 or Qwen3 (a released arm) is read again as :class:`Qwen3GatedConfig`, and a
    tensor-parallel size that would cut a kv group is refused.
    """

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        model_config = vllm_config.model_config
        if not isinstance(model_config.hf_config, Qwen3GatedConfig):
            # The dict vLLM's config holds, not the file: it keeps vLLM's overrides (hf_overrides).
            config = Qwen3GatedConfig.from_dict(model_config.hf_config.to_dict())
            model_config.hf_config = model_config.hf_text_config = config
        check_tensor_parallel_size(
            model_config.hf_config.num_key_value_heads, vllm_config.parallel_config.tensor_parallel_size
        )
        super().__init__(vllm_config=vllm_config, prefix=prefix)


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


class Qwen3MoeGatedForCausalLM(TransformersMoEForCausalLM):
    """vLLM's Transformers backend, with its mixture-of-experts support, running gated-qwen's Qwen3MoeGated.

    The backend builds the model with ``AutoModel.from_config`` (a ``Qwen3MoeGatedModel``), replaces each
    layer's experts (transformers' fused ``Qwen3MoeExperts``) with vLLM's fused MoE, loading the per-expert
    tensors of the checkpoint, and the attention, linear and norm layers as for the dense model. The
    tensor-parallel size must divide the kv heads, as for the dense model.
    """

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        check_tensor_parallel_size(
            vllm_config.model_config.hf_config.num_key_value_heads, vllm_config.parallel_config.tensor_parallel_size
        )
        super().__init__(vllm_config=vllm_config, prefix=prefix)
