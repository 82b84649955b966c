"""gated-qwen: gated attention (arXiv 2505.06708) as a first-class Hugging Face Transformers model.

Importing the package registers ``qwen3_gated`` with transformers' Auto classes (and PEFT's defaults)
without importing either: the registration runs when transformers (or PEFT) is imported, or at once if it
already is (:mod:`gated_qwen.models.auto`). The public classes load on first use, so ``import gated_qwen``
and the ``gated-qwen`` command start without torch.

The package by layers (imports run downwards only):

- :mod:`gated_qwen.models`: configuration, modeling, the q_proj row layout, Auto registration;
- :mod:`gated_qwen.checkpoint`: reading checkpoints (formats, sources, validation) and writing folders safely;
- :mod:`gated_qwen.transforms`: conversion and export;
- :mod:`gated_qwen.serving`: the vLLM plugin;
- :mod:`gated_qwen.tools`: generation, analysis, evaluation, training, benchmarks;
- :mod:`gated_qwen.cli`: the ``gated-qwen`` command, thin over the above.

>>> import gated_qwen
>>> from transformers import AutoConfig
>>> AutoConfig.for_model("qwen3_gated", headwise_attn_output_gate=True).gate_type
'headwise'
"""

from functools import partial
from importlib import import_module

from .models.auto import (
    PEFT_TABLES,
    on_modeling_import,
    on_transformers_import,
    register_with_peft,
    register_with_transformers,
)
from .utils.import_hooks import when_imported


__version__ = "0.1.0"

# public name -> the module that defines it, imported on first access (PEP 562)
_LAZY = {
    "Qwen3GatedConfig": "models.qwen3_gated.configuration_qwen3_gated",
    "Qwen3GatedForCausalLM": "models.qwen3_gated.modeling_qwen3_gated",
    "Qwen3GatedForSequenceClassification": "models.qwen3_gated.modeling_qwen3_gated",
    "Qwen3GatedModel": "models.qwen3_gated.modeling_qwen3_gated",
    "Qwen3GatedPreTrainedModel": "models.qwen3_gated.modeling_qwen3_gated",
    "Qwen3MoeGatedConfig": "models.qwen3_moe_gated.configuration_qwen3_moe_gated",
    "Qwen3MoeGatedForCausalLM": "models.qwen3_moe_gated.modeling_qwen3_moe_gated",
    "Qwen3MoeGatedForSequenceClassification": "models.qwen3_moe_gated.modeling_qwen3_moe_gated",
    "Qwen3MoeGatedModel": "models.qwen3_moe_gated.modeling_qwen3_moe_gated",
    "Qwen3MoeGatedPreTrainedModel": "models.qwen3_moe_gated.modeling_qwen3_moe_gated",
    "convert_checkpoint": "transforms.conversion",
    "convert_qwen3_to_gated": "transforms.conversion",
    "export_checkpoint": "transforms.export",
}

# Strict loading (gated_qwen.checkpoint.loading) on each model family's base class: one entry per family.
STRICT_LOADING = {
    "gated_qwen.models.qwen3_gated.modeling_qwen3_gated": "Qwen3GatedPreTrainedModel",
    "gated_qwen.models.qwen3_moe_gated.modeling_qwen3_moe_gated": "Qwen3MoeGatedPreTrainedModel",
}


def _on_modeling_import(class_name: str, module) -> None:
    """As a modeling module finishes importing: strict loading on its base class, then the one registration."""
    from .checkpoint.loading import install_strict_loading  # imports torch: only once a model module has

    install_strict_loading(getattr(module, class_name))
    on_modeling_import(module)


# The registration's triggers, all post-import hooks: each modeling module as it completes, and transformers
# (which imports the modeling modules); PEFT's defaults and its fused-expert conversion, each module as it loads.
for _module_name, _class_name in STRICT_LOADING.items():
    when_imported(_module_name, partial(_on_modeling_import, _class_name))
when_imported("transformers", on_transformers_import)
for _peft_module in PEFT_TABLES:
    when_imported(_peft_module, register_with_peft)


def __getattr__(name: str):
    if name in _LAZY:
        # Imports every modeling module, so registers every family, before a public name is returned (a config
        # module alone imports transformers while it is itself only partly imported, which registers nothing).
        register_with_transformers()
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])


__all__ = [*sorted(_LAZY), "__version__"]
