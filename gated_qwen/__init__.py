"""gated-qwen: gated attention (arXiv 2505.06708) as a first-class Hugging Face Transformers model.

Importing the package registers ``qwen3_gated`` with transformers' Auto classes (and PEFT's defaults)
without importing either: the registration runs when transformers (or PEFT) is imported, or at once if it
already is (:mod:`gated_qwen.integrations`). The public classes load on first use, so ``import gated_qwen``
and the ``gated-qwen`` command start without torch.

>>> import gated_qwen
>>> from transformers import AutoConfig
>>> AutoConfig.for_model("qwen3_gated", headwise_attn_output_gate=True).gate_type
'headwise'
"""

from importlib import import_module

from .integrations import on_transformers_import, register_with_peft, when_imported

__version__ = "0.1.0"

# public name -> the module that defines it, imported on first access (PEP 562)
_LAZY = {
    "Qwen3GatedConfig": "configuration_qwen3_gated",
    "Qwen3GatedForCausalLM": "modeling_qwen3_gated",
    "Qwen3GatedForSequenceClassification": "modeling_qwen3_gated",
    "Qwen3GatedModel": "modeling_qwen3_gated",
    "Qwen3GatedPreTrainedModel": "modeling_qwen3_gated",
    "convert_checkpoint": "conversion",
    "convert_qwen3_to_gated": "conversion",
}

when_imported("transformers", on_transformers_import)
when_imported("peft.utils.constants", register_with_peft)


def __getattr__(name: str):
    if name in _LAZY:
        import_module(".modeling_qwen3_gated", __name__)  # registers with the Auto classes on import
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])


__all__ = [*sorted(_LAZY), "__version__"]
