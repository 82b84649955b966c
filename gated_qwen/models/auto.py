"""Registration with transformers' Auto classes and with PEFT's per-model defaults, when those libraries load.

``import gated_qwen`` imports neither torch nor transformers, so that the ``gated-qwen`` command starts
at once. It still registers ``qwen3_gated`` with transformers' Auto classes and with PEFT: at once where
the library is already imported, otherwise the moment it is (a post-import hook, the pattern of
``wrapt.when_imported``). Either order works::

    import gated_qwen
    from transformers import AutoModelForCausalLM   # qwen3_gated is registered here
    model = AutoModelForCausalLM.from_pretrained("path/saved/by/gated_qwen")

PEFT picks default target modules by ``model_type``; Qwen3Gated gets stock Qwen3's for every PEFT method
(LoRA: ``q_proj`` and ``v_proj``). The gate has no module of its own: it is extra output rows of
``q_proj``, so an adapter on ``q_proj`` adapts the gate logits together with the queries.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def register_with_transformers() -> None:
    """Register Qwen3GatedConfig and the model classes with transformers' Auto classes (idempotent).

    :mod:`gated_qwen.models.qwen3_gated.modeling_qwen3_gated` calls it as its last statement, so importing the model registers it.

    >>> from transformers import AutoConfig
    >>> register_with_transformers(); AutoConfig.for_model("qwen3_gated").gate_type
    'none'
    """
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

    from .qwen3_gated.configuration_qwen3_gated import Qwen3GatedConfig
    from .qwen3_gated.modeling_qwen3_gated import Qwen3GatedForCausalLM, Qwen3GatedForSequenceClassification, Qwen3GatedModel

    AutoConfig.register(Qwen3GatedConfig.model_type, Qwen3GatedConfig, exist_ok=True)
    AutoModel.register(Qwen3GatedConfig, Qwen3GatedModel, exist_ok=True)
    AutoModelForCausalLM.register(Qwen3GatedConfig, Qwen3GatedForCausalLM, exist_ok=True)
    AutoModelForSequenceClassification.register(Qwen3GatedConfig, Qwen3GatedForSequenceClassification, exist_ok=True)


def on_transformers_import(_module: ModuleType) -> None:
    """Register once transformers is imported: by importing the model module, whose last statement registers.

    When transformers is being imported by gated_qwen's own configuration or model module, those are only
    partly executed; the model module registers when it completes (:mod:`gated_qwen` imports it before any
    of its public names is returned).
    """
    if not any(name in sys.modules for name in ("gated_qwen.models.qwen3_gated.configuration_qwen3_gated", "gated_qwen.models.qwen3_gated.modeling_qwen3_gated")):
        importlib.import_module("gated_qwen.models.qwen3_gated.modeling_qwen3_gated")


def register_with_peft(constants: ModuleType) -> None:
    """Give ``qwen3_gated`` stock Qwen3's entry in each of PEFT's per-model-type tables (``peft.utils.constants``).

    >>> import peft.utils.constants as constants  # doctest: +SKIP
    >>> register_with_peft(constants); constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING["qwen3_gated"]  # doctest: +SKIP
    ['q_proj', 'v_proj']
    """
    for table in vars(constants).values():
        if isinstance(table, dict) and "qwen3" in table:
            table.setdefault("qwen3_gated", table["qwen3"])


__all__ = ["on_transformers_import", "register_with_peft", "register_with_transformers"]
