"""vLLM plugin: serve Qwen3Gated checkpoints and the released gated arms with vLLM, unconverted.

vLLM finds :func:`register` through this package's ``vllm.general_plugins`` entry point and calls it
in every process it starts (front end, engine, each tensor-parallel worker). It registers two
architectures with vLLM's ``ModelRegistry``:

- ``Qwen3GatedForCausalLM`` (what ``save_pretrained`` writes, ``model_type "qwen3_gated"``): vLLM's
  Transformers backend, which builds this package's model with ``AutoModel.from_config`` (the
  ``import gated_qwen`` here registers it), swaps in vLLM's attention, linear and norm layers, and
  shards it by the config's ``base_model_tp_plan``.
- ``Qwen3ForCausalLM`` (what a released arm's config.json names, beside ``model_type "qwen2"``): a
  class that builds vLLM's own Qwen3 for a stock Qwen3 checkpoint, as before, and the gated model
  above for a config with the gated-attention keys. Without this, vLLM's Qwen3 would load a released
  arm without a word and generate garbage: it keeps the first H*D rows of q_proj, which in the released
  layout mix queries and gate logits, and drops the rest.

The classes themselves live in :mod:`gated_qwen.serving.vllm_models` (it imports vLLM), registered by name so
that vLLM imports them only where it builds a model.

Tensor parallelism: the size must divide ``num_key_value_heads``
(:func:`check_tensor_parallel_size`), so that each rank's contiguous slice of q_proj holds whole kv
groups, each with its gate rows.
"""

from __future__ import annotations

GATED_ARCHITECTURE = "Qwen3GatedForCausalLM"
QWEN3_ARCHITECTURE = "Qwen3ForCausalLM"
MODELS_MODULE = "gated_qwen.serving.vllm_models"


def register() -> None:
    """Register gated-qwen's architectures with vLLM (the ``vllm.general_plugins`` entry point).

    vLLM calls this itself once the package is installed; calling it again changes nothing.

    >>> from gated_qwen.serving.vllm_plugin import register
    >>> register()  # doctest: +SKIP
    """
    import gated_qwen  # noqa: F401  (qwen3_gated with the Auto classes: vLLM reads the config through them)
    from vllm import ModelRegistry

    ModelRegistry.register_model(GATED_ARCHITECTURE, f"{MODELS_MODULE}:Qwen3GatedForCausalLM")
    ModelRegistry.register_model(QWEN3_ARCHITECTURE, f"{MODELS_MODULE}:Qwen3OrGatedForCausalLM")


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


__all__ = ["GATED_ARCHITECTURE", "QWEN3_ARCHITECTURE", "check_tensor_parallel_size", "register"]
