"""Registration with transformers' Auto classes and with PEFT's per-model defaults, when those libraries load.

``import gated_qwen`` imports neither torch nor transformers, so that the ``gated-qwen`` command starts
at once. It still registers ``qwen3_gated`` (and the MoE family, ``qwen3_moe_gated``) with transformers' Auto classes and with PEFT: at once where
the library is already imported, otherwise the moment it is (a post-import hook, the pattern of
``wrapt.when_imported``). Either order works::

    import gated_qwen
    from transformers import AutoModelForCausalLM   # qwen3_gated is registered here
    model = AutoModelForCausalLM.from_pretrained("path/saved/by/gated_qwen")

PEFT picks default target modules by ``model_type``; Qwen3Gated (and Qwen3MoeGated) gets stock Qwen3's for every PEFT method
(LoRA: ``q_proj`` and ``v_proj``). The gate has no module of its own: it is extra output rows of
``q_proj``, so an adapter on ``q_proj`` adapts the gate logits together with the queries.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


# Each family's modeling module, which registers the family as its last statement.
MODELING_MODULES = (
    "gated_qwen.models.qwen3_gated.modeling_qwen3_gated",
    "gated_qwen.models.qwen3_moe_gated.modeling_qwen3_moe_gated",
)


def register_with_transformers() -> None:
    """Register every family's config and model classes with transformers' Auto classes (idempotent).

    Each modeling module calls it as its last statement, so importing a model registers it: the families
    whose modeling modules have finished importing, the dense ``qwen3_gated`` and the MoE ``qwen3_moe_gated``.

    >>> from transformers import AutoConfig
    >>> register_with_transformers(); AutoConfig.for_model("qwen3_gated").gate_type
    'none'
    """
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

    for name in MODELING_MODULES:  # the other families too (one being imported now registers when it completes)
        if name not in sys.modules:
            importlib.import_module(name)
    families = []
    dense = sys.modules.get("gated_qwen.models.qwen3_gated.modeling_qwen3_gated")
    if dense is not None and hasattr(dense, "Qwen3GatedForSequenceClassification"):
        families.append(
            (
                dense.Qwen3GatedPreTrainedModel.config_class,
                dense.Qwen3GatedModel,
                dense.Qwen3GatedForCausalLM,
                dense.Qwen3GatedForSequenceClassification,
            )
        )
    moe = sys.modules.get("gated_qwen.models.qwen3_moe_gated.modeling_qwen3_moe_gated")
    if moe is not None and hasattr(moe, "Qwen3MoeGatedForSequenceClassification"):
        families.append(
            (
                moe.Qwen3MoeGatedPreTrainedModel.config_class,
                moe.Qwen3MoeGatedModel,
                moe.Qwen3MoeGatedForCausalLM,
                moe.Qwen3MoeGatedForSequenceClassification,
            )
        )
        _register_expert_storage(moe.Qwen3MoeGatedPreTrainedModel.config_class.model_type)
    for config_class, bare, causal_lm, classifier in families:
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        AutoModel.register(config_class, bare, exist_ok=True)
        AutoModelForCausalLM.register(config_class, causal_lm, exist_ok=True)
        AutoModelForSequenceClassification.register(config_class, classifier, exist_ok=True)


def _register_expert_storage(model_type: str) -> None:
    """Give the gated MoE stock Qwen3-MoE's checkpoint conversion (transformers 5): its experts are fused
    tensors in the model and one tensor per expert on disk, converted on loading and back on saving."""
    from transformers import conversion_mapping

    if conversion_mapping.get_checkpoint_conversion_mapping(model_type) is None:
        conversion_mapping.register_checkpoint_conversion_mapping(
            model_type, conversion_mapping.get_checkpoint_conversion_mapping("qwen3_moe")
        )


def causal_lm_class(config_dict: dict) -> type:
    """The gated causal-LM class that reads a checkpoint with this config.json dict: ``Qwen3MoeGatedForCausalLM``
    for the Qwen3-MoE family (``model_type`` ``qwen3_moe`` or ``qwen3_moe_gated``), else ``Qwen3GatedForCausalLM``
    (stock Qwen3, the released arms, ``qwen3_gated``; it refuses any other model type, naming it).

    >>> causal_lm_class({"model_type": "qwen3_moe"}).__name__
    'Qwen3MoeGatedForCausalLM'
    """
    if config_dict.get("model_type") in ("qwen3_moe", "qwen3_moe_gated"):
        from .qwen3_moe_gated.modeling_qwen3_moe_gated import Qwen3MoeGatedForCausalLM

        return Qwen3MoeGatedForCausalLM
    from .qwen3_gated.modeling_qwen3_gated import Qwen3GatedForCausalLM

    return Qwen3GatedForCausalLM


def on_transformers_import(_module: ModuleType) -> None:
    """Register once transformers is imported: by importing each family's modeling module, whose last
    statement registers.

    When transformers is being imported by one of gated_qwen's own configuration or model modules, those are
    only partly executed; each registers when it completes (:mod:`gated_qwen` imports the modeling
    modules before any of its public names is returned).
    """
    if any(
        name.startswith("gated_qwen.models.qwen3")
        and name.rsplit(".", 1)[-1].startswith(("configuration_", "modeling_"))
        for name in sys.modules
    ):
        return
    for name in MODELING_MODULES:
        importlib.import_module(name)


def register_with_peft(constants: ModuleType) -> None:
    """Give ``qwen3_gated`` stock Qwen3's entry in each of PEFT's per-model-type tables (``peft.utils.constants``).

    >>> import peft.utils.constants as constants  # doctest: +SKIP
    >>> register_with_peft(constants); constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING["qwen3_gated"]  # doctest: +SKIP
    ['q_proj', 'v_proj']
    """
    for table in vars(constants).values():
        if isinstance(table, dict) and "qwen3" in table:
            table.setdefault("qwen3_gated", table["qwen3"])
            # Qwen3-MoE's attention is Qwen3's; PEFT has a Qwen3-MoE entry only in some tables.
            table.setdefault("qwen3_moe_gated", table.get("qwen3_moe", table["qwen3"]))


__all__ = [
    "MODELING_MODULES",
    "causal_lm_class",
    "on_transformers_import",
    "register_with_peft",
    "register_with_transformers",
]
