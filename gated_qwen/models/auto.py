"""Registration with transformers' Auto classes and with PEFT's per-model defaults, when those libraries load.

``import gated_qwen`` imports neither torch nor transformers, so that the ``gated-qwen`` command starts
at once. It still registers ``qwen3_gated`` (and the MoE family, ``qwen3_moe_gated``) with transformers' Auto
classes and with PEFT: at once where the library is already imported, otherwise the moment it is (a post-import
hook, the pattern of ``wrapt.when_imported``). Either order works::

    import gated_qwen
    from transformers import AutoModelForCausalLM   # qwen3_gated is registered here
    model = AutoModelForCausalLM.from_pretrained("path/saved/by/gated_qwen")

One function registers, :func:`register_with_transformers`; :mod:`gated_qwen` calls it from post-import hooks
(:func:`on_modeling_import`, once each modeling module has finished importing, whoever imports it; and through
:func:`on_transformers_import`, which imports them). The modeling modules do not import this module.

PEFT picks default target modules by ``model_type``; Qwen3Gated (and Qwen3MoeGated) gets stock Qwen3's for every
PEFT method (LoRA: ``q_proj`` and ``v_proj``). PEFT also decides by ``model_type`` how to reach an MoE's fused
expert tensors and router; Qwen3MoeGated gets stock Qwen3-MoE's entry (:data:`PEFT_TABLES`). The gate has no
module of its own: it is extra output rows of ``q_proj``, so an adapter on ``q_proj`` adapts the gate logits
together with the queries.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


# Each family's modeling module; the family is registered once it has finished importing (on_modeling_import).
MODELING_MODULES = (
    "gated_qwen.models.qwen3_gated.modeling_qwen3_gated",
    "gated_qwen.models.qwen3_moe_gated.modeling_qwen3_moe_gated",
)


def register_with_transformers() -> None:
    """Register every family's config and model classes with transformers' Auto classes (idempotent).

    Imports every family's modeling module and registers the families whose modules have finished importing
    (one being imported now registers when it completes, through :func:`on_modeling_import`): the dense
    ``qwen3_gated`` and the MoE ``qwen3_moe_gated``.

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
        _name_on_transformers(config_class, bare, causal_lm, classifier)


def _name_on_transformers(*classes: type) -> None:
    """Make each class an attribute of the ``transformers`` module, as transformers' own models are: a client that
    takes a config's ``architectures[0]`` as a name on transformers finds it there (``transformers serve`` loads
    the model it serves with ``getattr(transformers, config.architectures[0])``). A name transformers has of
    its own is left alone."""
    import transformers

    for cls in classes:
        if cls.__name__ not in vars(transformers):
            setattr(transformers, cls.__name__, cls)


def _register_expert_storage(model_type: str) -> None:
    """Give the gated MoE stock Qwen3-MoE's checkpoint conversion (transformers 5): its experts are fused
    tensors in the model and one tensor per expert on disk, converted on loading and back on saving."""
    from transformers import conversion_mapping

    if conversion_mapping.get_checkpoint_conversion_mapping(model_type) is None:
        conversion_mapping.register_checkpoint_conversion_mapping(
            model_type, conversion_mapping.get_checkpoint_conversion_mapping("qwen3_moe")
        )


# Each family: the model types that name it, its stock and gated class prefixes, and its modeling module.
FAMILIES = (
    (("qwen3_moe", "qwen3_moe_gated"), "Qwen3Moe", "Qwen3MoeGated", MODELING_MODULES[1]),
    ((), "Qwen3", "Qwen3Gated", MODELING_MODULES[0]),  # every other model type (it refuses any but Qwen3's)
)
HEADS = ("ForCausalLM", "ForSequenceClassification", "Model")


def gated_model_class(config_dict: dict, architecture: str | None = None) -> type | None:
    """The gated class that reads a checkpoint with this config.json dict: the one place that decides.

    The family comes from ``model_type`` (Qwen3-MoE for ``qwen3_moe`` or ``qwen3_moe_gated``, else Qwen3: stock
    Qwen3, the released arms, ``qwen3_gated``), the head from ``architecture``, a stock or gated class name of
    that family (``Qwen3ForSequenceClassification``, ``Qwen3MoeGatedModel``, ...); ``None`` means the causal LM.
    Returns ``None`` for an architecture that is not one of the family's.

    >>> gated_model_class({"model_type": "qwen3"}, "Qwen3ForSequenceClassification").__name__
    'Qwen3GatedForSequenceClassification'
    >>> gated_model_class({"model_type": "qwen3"}, "Qwen3MoeForCausalLM") is None
    True
    """
    model_type = config_dict.get("model_type")
    model_types, stock, gated, module_name = next(
        family for family in FAMILIES if model_type in family[0] or not family[0]
    )
    if architecture is None:
        head = "ForCausalLM"
    else:
        head = next((head for head in HEADS if architecture in (stock + head, gated + head)), None)
        if head is None:
            return None
    return getattr(importlib.import_module(module_name), gated + head)


def causal_lm_class(config_dict: dict) -> type:
    """The gated causal-LM class that reads a checkpoint with this config.json dict: ``Qwen3MoeGatedForCausalLM``
    for the Qwen3-MoE family (``model_type`` ``qwen3_moe`` or ``qwen3_moe_gated``), else ``Qwen3GatedForCausalLM``
    (stock Qwen3, the released arms, ``qwen3_gated``; it refuses any other model type, naming it).
    :func:`gated_model_class` decides.

    >>> causal_lm_class({"model_type": "qwen3_moe"}).__name__
    'Qwen3MoeGatedForCausalLM'
    """
    return gated_model_class(config_dict)


def on_transformers_import(_module: ModuleType) -> None:
    """Register once transformers is imported, by importing each family's modeling module (whose import ends in
    :func:`on_modeling_import`).

    When transformers is being imported by one of gated_qwen's own configuration or model modules, those are
    only partly executed; a modeling module registers when it completes (:func:`on_modeling_import`), and
    :mod:`gated_qwen` registers before any of its public names is returned.
    """
    if any(
        name.startswith("gated_qwen.models.qwen3")
        and name.rsplit(".", 1)[-1].startswith(("configuration_", "modeling_"))
        for name in sys.modules
    ):
        return
    for name in MODELING_MODULES:
        importlib.import_module(name)


def on_modeling_import(_module: ModuleType) -> None:
    """Register the families once one of :data:`MODELING_MODULES` has finished importing (its post-import hook):
    importing a model makes it known to AutoConfig / AutoModel*."""
    register_with_transformers()


# PEFT's per-model-type tables that gated_qwen registers in, by the PEFT module holding them (each module is hooked
# in gated_qwen/__init__.py). A table this PEFT version lacks is skipped.
PEFT_TABLES = {
    # default target modules of each PEFT method: both families take stock Qwen3's (PEFT has no Qwen3-MoE entry)
    "peft.utils.constants": (
        "TRANSFORMERS_MODELS_TO_ADALORA_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_ADAMSS_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_BEFT_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_BOFT_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_C3A_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_DEFT_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_DELORA_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_FOURIERFT_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_FROD_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_GLORA_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_GRALORA_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_HIRA_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_HRA_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_LILY_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_LNTUNING_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_LOHA_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_LOKR_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_MISS_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_OFT_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_OSF_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_PEANUT_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_POLY_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_PSOFT_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_PVERA_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_RANDLORA_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_ROAD_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_SHIRA_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_SUPERTUNING_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_TINYLORA_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_UNILORA_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_VBLORA_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_VERA_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_WAVEFT_TARGET_MODULES_MAPPING",
    ),
    # how a model type's fused MoE experts and router are reached (transformers 5 fused them): a LoRA on
    # "all-linear", on the v4 expert names (gate_proj, up_proj, down_proj, gate) or on `target_parameters`
    # is turned into adapters on the fused expert tensors and the router. Only the MoE family has one.
    "peft.utils.transformers_weight_conversion": ("_MODEL_TO_CONVERSION_PATTERN",),
}

# gated model type -> the stock model type whose entry it takes in each table (the first one the table has)
PEFT_MODEL_TYPES = {
    "qwen3_gated": ("qwen3",),
    "qwen3_moe_gated": ("qwen3_moe", "qwen3"),  # Qwen3-MoE's attention is Qwen3's
}


def register_with_peft(module: ModuleType) -> None:
    """Give each gated family its stock counterpart's entry in PEFT's per-model-type tables in ``module`` (one of
    :data:`PEFT_TABLES`): default target modules (``peft.utils.constants``) and the fused-expert conversion
    (``peft.utils.transformers_weight_conversion``), so that every PEFT target specification adapts on a gated
    model what it adapts on the stock one. Idempotent; an entry already there is kept.

    >>> import peft.utils.constants as constants
    >>> register_with_peft(constants)
    >>> constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING["qwen3_gated"]
    ['q_proj', 'v_proj']
    """
    for table_name in PEFT_TABLES.get(module.__name__, ()):
        table = getattr(module, table_name, None)
        if not isinstance(table, dict):
            continue
        for gated, stock_types in PEFT_MODEL_TYPES.items():
            stock = next((stock for stock in stock_types if stock in table), None)
            if stock is not None:
                table.setdefault(gated, table[stock])
    convert = getattr(module, "convert_peft_config_for_transformers", None)
    if module.__name__ in PEFT_TABLES and callable(convert) and not hasattr(convert, "__gated_qwen__"):
        module.convert_peft_config_for_transformers = _keeping_default_targets(convert)


def _keeping_default_targets(convert):
    """PEFT's fused-expert conversion, skipped for a gated model given no targets at all (PEFT's defaults).

    The conversion turns ``target_modules=None`` into an empty set before PEFT looks up its defaults, so that a
    model type with both a default and a conversion gets neither (stock Qwen3-MoE has no default, so PEFT raises
    there either way). The gated MoE keeps stock Qwen3's defaults (``q_proj``, ``v_proj``: no expert to convert).
    """

    def convert_peft_config_for_transformers(peft_config, model, conversions):
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        untargeted = getattr(peft_config, "target_modules", None) is None and not getattr(
            peft_config, "target_parameters", None
        )
        if model_type in PEFT_MODEL_TYPES and untargeted:
            return None
        if model_type in PEFT_MODEL_TYPES:
            refuse_ambiguous_gate_target(getattr(peft_config, "target_modules", None))
        return convert(peft_config, model=model, conversions=conversions)

    convert_peft_config_for_transformers.__gated_qwen__ = True
    convert_peft_config_for_transformers.__wrapped__ = convert
    return convert_peft_config_for_transformers


def refuse_ambiguous_gate_target(target_modules) -> None:
    """Refuse the bare PEFT target ``gate`` on a gated model: on the MoE, PEFT takes it for the router (``mlp.gate``,
    as on stock Qwen3-MoE), where a user of a gated model may mean the attention gate. One message names both
    spellings. (Called by PEFT's fused-expert conversion, which PEFT runs for the MoE family.)

    >>> refuse_ambiguous_gate_target(["q_proj", "mlp.gate"])
    >>> refuse_ambiguous_gate_target(["gate"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: target_modules=['gate'] is ambiguous on a gated model: ...
    """
    if isinstance(target_modules, str) or not target_modules or "gate" not in target_modules:
        return
    raise ValueError(
        f"target_modules={sorted(target_modules)!r} is ambiguous on a gated model: no module of its attention is "
        "named 'gate', and on a Qwen3-MoE PEFT takes 'gate' for the router. Write 'mlp.gate' for the router; for the "
        "attention gate alone use "
        "gated_qwen.models.peft_gate.get_gate_peft_model(model, r=...) (docs/peft.md)."
    )


__all__ = [
    "MODELING_MODULES",
    "FAMILIES",
    "HEADS",
    "causal_lm_class",
    "gated_model_class",
    "on_modeling_import",
    "on_transformers_import",
    "PEFT_MODEL_TYPES",
    "PEFT_TABLES",
    "register_with_peft",
    "refuse_ambiguous_gate_target",
    "register_with_transformers",
]
