"""vLLM plugin: serve Qwen3Gated checkpoints and the released gated arms with vLLM, unconverted.

vLLM finds :func:`register` through this package's ``vllm.general_plugins`` entry point and calls it
in every process it starts (front end, engine, each tensor-parallel worker). It registers three
architectures with vLLM's ``ModelRegistry``:

- ``Qwen3GatedForCausalLM`` (what ``save_pretrained`` writes, ``model_type "qwen3_gated"``): vLLM's own Qwen3
  with the released gate in each layer's attention (one ``QKVParallelLinear`` yielding queries, gate logits,
  keys and values; vLLM's ``Attention``; the gate applied before ``o_proj`` as vLLM's Qwen3-Next applies its
  own). A config those layers do not describe (:func:`serves_natively`) is refused
  (:func:`check_served_checkpoint` in the front end, the class again where it is built).
- ``Qwen3MoeGatedForCausalLM`` (``model_type "qwen3_moe_gated"``, a converted Qwen3-MoE): vLLM's own Qwen3-MoE
  (``FusedMoE`` experts) with the same gated attention.
- ``Qwen3ForCausalLM`` (what a released arm's config.json names, beside ``model_type "qwen2"``): a
  class that builds vLLM's own Qwen3 for a stock Qwen3 checkpoint, as before, and the gated model
  above for a config with the gated-attention keys. Without this, vLLM's Qwen3 would load a released
  arm without a word and generate garbage: it keeps the first H*D rows of q_proj, which in the released
  layout mix queries and gate logits, and drops the rest.

The classes themselves live in :mod:`gated_qwen.serving.vllm_models` (it imports vLLM), registered by name so
that vLLM imports them only where it builds a model.

Tensor parallelism: the size must divide ``num_key_value_heads``
(:func:`check_tensor_parallel_size`), so that each rank holds whole kv groups, each with its gate rows
(:func:`q_proj_rows_by_rank`).

Refusals reach the caller: :func:`register` also enters each architecture in vLLM's per-architecture
config hooks (``vllm.model_executor.models.config.MODELS_CONFIG_MAP``), which vLLM runs while it builds
its ``VllmConfig`` in the caller's process, before any engine, worker or weight exists. There
:func:`check_served_checkpoint` refuses a gated checkpoint whose config does not describe its weights (the
check of :func:`gated_qwen.checkpoint.validation.check_weights_match_config`, from the weight headers: a
headwise arm whose config says elementwise, or names no gate, included) and a tensor-parallel size that
would cut a kv group; the error is the caller's exception, not a line in a worker's log.
"""

from __future__ import annotations

import logging
from pathlib import Path


logger = logging.getLogger(__name__)

GATED_ARCHITECTURE = "Qwen3GatedForCausalLM"
QWEN3_ARCHITECTURE = "Qwen3ForCausalLM"
MOE_ARCHITECTURE = "Qwen3MoeGatedForCausalLM"
MODELS_MODULE = "gated_qwen.serving.vllm_models"


def register() -> None:
    """Register gated-qwen's architectures with vLLM (the ``vllm.general_plugins`` entry point).

    vLLM calls this itself once the package is installed; calling it again changes nothing.

    >>> from gated_qwen.serving.vllm_plugin import register
    >>> register()  # needs vLLM  # doctest: +SKIP
    """
    from vllm import ModelRegistry

    import gated_qwen  # noqa: F401  (qwen3_gated with the Auto classes: vLLM reads the config through them)

    ModelRegistry.register_model(GATED_ARCHITECTURE, f"{MODELS_MODULE}:Qwen3GatedForCausalLM")
    ModelRegistry.register_model(QWEN3_ARCHITECTURE, f"{MODELS_MODULE}:Qwen3OrGatedForCausalLM")
    ModelRegistry.register_model(MOE_ARCHITECTURE, f"{MODELS_MODULE}:Qwen3MoeGatedForCausalLM")
    _register_config_checks()


def _register_config_checks() -> None:
    """Enter :func:`check_served_checkpoint` in vLLM's config hooks for every architecture of the plugin's, before
    whatever hook vLLM has for them (called after ours). Idempotent."""
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP, VerifyAndUpdateConfig

    for architecture in (GATED_ARCHITECTURE, QWEN3_ARCHITECTURE, MOE_ARCHITECTURE):
        previous = MODELS_CONFIG_MAP.get(architecture)
        if getattr(previous, "gated_qwen_check", False):
            continue

        def verify_and_update_config(vllm_config, previous=previous) -> None:
            check_served_checkpoint(vllm_config)
            if previous is not None:
                previous.verify_and_update_config(vllm_config)

        MODELS_CONFIG_MAP[architecture] = type(
            f"GatedQwenCheck{architecture}",
            (previous or VerifyAndUpdateConfig,),
            {"gated_qwen_check": True, "verify_and_update_config": staticmethod(verify_and_update_config)},
        )


def check_served_checkpoint(vllm_config) -> None:
    """Refuse, in vLLM's front end, a gated checkpoint vLLM would serve wrongly (a stock Qwen3 is left to vLLM).

    From the config vLLM read and the checkpoint's weight headers (local safetensors or ``.bin``; on the hub,
    safetensors headers by range reads, while a ``.bin``'s shapes would need the download and are left to
    the load): :class:`~gated_qwen.errors.CheckpointError` where the config does not describe the weights
    or its values make no model or its gate is not the released one (docs/design-space.md: the other variants are
    refused before any worker starts), ValueError where the tensor-parallel size does not divide the kv heads or
    LoRA is enabled or the checkpoint is quantized (:func:`check_serving_options`).
    """
    from ..checkpoint import (
        check_weights_match_config,
        read_checkpoint_header,
        read_weight_file_header,
        resolve_weight_files,
    )
    from ..errors import CheckpointError
    from ..models.qwen3_gated.configuration_qwen3_gated import Qwen3GatedConfig, is_gated_attention_config
    from ..models.qwen3_moe_gated.configuration_qwen3_moe_gated import Qwen3MoeGatedConfig

    model_config = vllm_config.model_config
    config_dict = model_config.hf_config.to_dict()
    moe = model_config.architecture == MOE_ARCHITECTURE
    gated = moe or model_config.architecture == GATED_ARCHITECTURE or is_gated_attention_config(config_dict)
    if not gated and config_dict.get("model_type") != "qwen3":
        return  # not a model of this plugin's
    # refuses sizes that make no model, naming the key
    config = (Qwen3MoeGatedConfig if moe else Qwen3GatedConfig).from_dict(config_dict)
    if gated and not serves_natively(config):  # a design-space key away from the release, gate or none
        raise CheckpointError(unserved_variant_message(config, model_config.model))
    if gated:  # vLLM's own Qwen3 replicates kv heads as it does for any model
        check_tensor_parallel_size(config.num_key_value_heads, vllm_config.parallel_config.tensor_parallel_size)
        check_serving_options(vllm_config)
    if str(getattr(vllm_config.load_config, "load_format", "")) == "dummy":
        return  # no weights are read: random ones of the config's own shapes
    # A stock Qwen3 config is checked too (as gate "none"): a gated arm whose config lost its gate keys would
    # otherwise be served by vLLM's Qwen3, which keeps the first rows of q_proj and drops the rest unsaid.
    source = str(model_config.model)
    if Path(source).is_dir():
        tensors = {}
        for file in resolve_weight_files(source):
            tensors.update(read_weight_file_header(file))
    else:
        try:  # safetensors headers by range reads; pickle weights give no shapes without the download
            tensors = read_checkpoint_header(source, revision=model_config.revision).tensors
        except CheckpointError as error:  # offline, say: vLLM finds its own way to the weights
            logger.warning("gated-qwen could not read the weight headers of %s before loading (%s)", source, error)
            return
    check_weights_match_config(config, tensors, source)


def serves_natively(config) -> bool:
    """Whether the plugin's native classes (vLLM's own Qwen3 / Qwen3-MoE layers with the gate) serve ``config``.

    ``config`` is a gated-qwen config (dense or MoE). True at the released point of the design space
    (``config.is_released_point``: the released gate, headwise or elementwise, or no gate, and nothing else of the
    design space), whatever its sizes, biases and QK-norm; other configs are refused
    (:func:`unserved_variant_message`), in the front end and again where the model is built. The design space's
    keys are one table (``GATE_VARIANT_DEFAULTS``), so a key added to it later leaves the native path with no
    change here.

    >>> from gated_qwen import Qwen3GatedConfig
    >>> serves_natively(Qwen3GatedConfig(num_attention_heads=4, num_key_value_heads=2, gate_type="elementwise"))
    True
    >>> serves_natively(Qwen3GatedConfig(num_attention_heads=4, num_key_value_heads=2, gate_type="headwise",
    ...                                  gate_activation="silu"))
    False
    """
    return config.is_released_point


def unserved_variant_message(config, source) -> str:
    """Why vLLM does not serve ``config`` (a design-space variant off the released point), and what to do.

    >>> from gated_qwen import Qwen3GatedConfig
    >>> unserved_variant_message(Qwen3GatedConfig(gate_type="headwise", gate_activation="silu"), "ckpt")[:48]
    'ckpt: vLLM serves the released gate (sigmoid, mu'
    """
    return (
        f"{source}: vLLM serves the released gate (sigmoid, multiplying the SDPA output of each head) through "
        f"gated-qwen's plugin, not this {config.gate_variant()}; generate with transformers (`gated-qwen generate`) "
        "instead"
    )


def check_serving_options(vllm_config) -> None:
    """Refuse, for a model of the native gated classes, what they do not serve right, in one line naming what to do.

    - LoRA (``enable_lora``): vLLM's LoRA layers take a fused q/k/v projection only when it is exactly vLLM's
      ``QKVParallelLinear``; the gated one (:class:`~gated_qwen.serving.vllm_models.GatedQKVParallelLinear`, whose
      query shard also holds the gate rows) would be left without its adapter, and the adapter served wrongly
      without a word. Merged into the weights (PEFT's ``merge_and_unload``), the same adapter is served exactly.
    - A pre-quantized checkpoint (its config has a ``quantization_config``): the gated projection reorders the
      query and gate rows of unquantized weights at load; a quantized layout (packed rows, per-shard scales) is
      not checked to come out in that order.

    >>> from types import SimpleNamespace
    >>> model_config = SimpleNamespace(model="ckpt", hf_config=SimpleNamespace())
    >>> check_serving_options(SimpleNamespace(lora_config=None, model_config=model_config))
    >>> check_serving_options(SimpleNamespace(lora_config=object(), model_config=model_config))
    Traceback (most recent call last):
    ...
    ValueError: ckpt: vLLM's LoRA layers do not apply an adapter to gated-qwen's attention (its q_proj also holds the gate's rows), so it would be served wrongly; merge the adapter into the model (PEFT's merge_and_unload(), then save_pretrained) and serve the merged checkpoint without enable_lora
    """
    source = vllm_config.model_config.model
    if getattr(vllm_config, "lora_config", None) is not None:
        raise ValueError(
            f"{source}: vLLM's LoRA layers do not apply an adapter to gated-qwen's attention (its q_proj also holds "
            "the gate's rows), so it would be served wrongly; merge the adapter into the model (PEFT's "
            "merge_and_unload(), then save_pretrained) and serve the merged checkpoint without enable_lora"
        )
    quantization = getattr(vllm_config.model_config.hf_config, "quantization_config", None)
    if quantization is not None:
        method = (
            quantization.get("quant_method", "?") if isinstance(quantization, dict) else type(quantization).__name__
        )
        raise ValueError(
            f"{source}: gated-qwen's vLLM plugin serves unquantized checkpoints; this one is quantized "
            f"({method}), and the gated q_proj's rows are not checked to load in order from a quantized layout; "
            "serve the unquantized checkpoint (or generate with transformers, which loads quantized gated "
            "checkpoints: docs/loading.md)"
        )


def q_proj_rows_by_rank(q_proj, num_key_value_heads: int, head_dim: int, gate_dim: int, tensor_parallel_size: int):
    """The released q_proj (weight or bias; rows grouped by kv head, queries then gate logits) reordered for vLLM.

    The result has the same rows as ``tensor_parallel_size`` consecutive blocks, one per rank: the queries of
    the rank's kv groups, then their gate logits (heads in the same order). vLLM's query shard of rank r is
    block r, and its gated attention splits it into queries and gate logits with one slice.

    >>> import torch
    >>> q_proj = torch.arange(2 * (2 * 2 + 2 * 1))         # K=2 kv groups, G=2 heads each, D=2, g=1 (headwise)
    >>> q_proj_rows_by_rank(q_proj, 2, 2, 1, 1).tolist()    # one rank: every query, then every gate logit
    [0, 1, 2, 3, 6, 7, 8, 9, 4, 5, 10, 11]
    >>> q_proj_rows_by_rank(q_proj, 2, 2, 1, 2).tolist()    # two ranks: a kv group each, as released
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    """
    import torch

    from ..models.layout import split_query_and_gate

    query, gate = split_query_and_gate(q_proj, num_key_value_heads, head_dim, gate_dim, dim=0)  # (K, G, D or g, ...)
    by_rank = [part.unflatten(0, (tensor_parallel_size, -1)).flatten(1, 3) for part in (query, gate)]
    return torch.cat(by_rank, dim=1).flatten(0, 1)


def check_tensor_parallel_size(num_key_value_heads: int, tensor_parallel_size: int) -> None:
    """Raise ValueError unless ``tensor_parallel_size`` divides ``num_key_value_heads``.

    q_proj's rows are grouped by kv head, each group its queries then their gate logits (the released
    layout); a rank's contiguous slice of the rows splits into whole groups only when the size divides
    the kv heads. With more ranks than kv heads vLLM would replicate the kv heads and cut q_proj inside
    a group, mixing queries and gates without an error.

    >>> check_tensor_parallel_size(8, 2)
    >>> check_tensor_parallel_size(2, 4)
    Traceback (most recent call last):
    ...
    ValueError: tensor_parallel_size 4 does not divide num_key_value_heads (2): gated attention needs whole kv groups (queries with their gate rows) on each rank; use a tensor_parallel_size that divides 2
    """
    if tensor_parallel_size < 1 or num_key_value_heads % tensor_parallel_size:
        raise ValueError(
            f"tensor_parallel_size {tensor_parallel_size} does not divide num_key_value_heads "
            f"({num_key_value_heads}): gated attention needs whole kv groups (queries with their gate rows) "
            f"on each rank; use a tensor_parallel_size that divides {num_key_value_heads}"
        )


__all__ = [
    "GATED_ARCHITECTURE",
    "MOE_ARCHITECTURE",
    "QWEN3_ARCHITECTURE",
    "check_served_checkpoint",
    "check_tensor_parallel_size",
    "q_proj_rows_by_rank",
    "register",
    "serves_natively",
]
