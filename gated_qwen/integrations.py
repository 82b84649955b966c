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
import importlib.abc
import sys
from collections.abc import Callable
from types import ModuleType

_PENDING: dict[str, list[Callable[[ModuleType], None]]] = {}


class _CallAfterExec(importlib.abc.Loader):
    """Wraps a module's loader: executes the module, then runs the callbacks waiting for it."""

    def __init__(self, loader, callbacks: list[Callable[[ModuleType], None]]):
        self.loader = loader
        self.callbacks = callbacks

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        module.__spec__.loader = module.__loader__ = self.loader  # leave no trace once done
        for callback in self.callbacks:
            callback(module)

    def __getattr__(self, name):  # get_data, get_resource_reader, ... of the real loader
        return getattr(self.loader, name)


class _WhenImported(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module with callbacks waiting, wraps the loader the other finders give."""

    def find_spec(self, fullname, path, target=None):
        callbacks = _PENDING.pop(fullname, None)
        if callbacks is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _CallAfterExec(spec.loader, callbacks)
        return spec


_FINDER = _WhenImported()


def when_imported(module_name: str, callback: Callable[[ModuleType], None]) -> None:
    """Run ``callback(module)`` now if ``module_name`` is imported, else right after it is first imported.

    >>> when_imported("json", lambda module: print(module.__name__))
    json
    """
    module = sys.modules.get(module_name)
    if module is not None:
        callback(module)
        return
    _PENDING.setdefault(module_name, []).append(callback)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def register_with_transformers() -> None:
    """Register Qwen3GatedConfig and the model classes with transformers' Auto classes (idempotent).

    :mod:`gated_qwen.modeling_qwen3_gated` calls it as its last statement, so importing the model registers it.

    >>> from transformers import AutoConfig
    >>> register_with_transformers(); AutoConfig.for_model("qwen3_gated").gate_type
    'none'
    """
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

    from .configuration_qwen3_gated import Qwen3GatedConfig
    from .modeling_qwen3_gated import Qwen3GatedForCausalLM, Qwen3GatedForSequenceClassification, Qwen3GatedModel

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
    if not any(name in sys.modules for name in ("gated_qwen.configuration_qwen3_gated", "gated_qwen.modeling_qwen3_gated")):
        importlib.import_module("gated_qwen.modeling_qwen3_gated")


def register_with_peft(constants: ModuleType) -> None:
    """Give ``qwen3_gated`` stock Qwen3's entry in each of PEFT's per-model-type tables (``peft.utils.constants``).

    >>> import peft.utils.constants as constants  # doctest: +SKIP
    >>> register_with_peft(constants); constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING["qwen3_gated"]  # doctest: +SKIP
    ['q_proj', 'v_proj']
    """
    for table in vars(constants).values():
        if isinstance(table, dict) and "qwen3" in table:
            table.setdefault("qwen3_gated", table["qwen3"])


__all__ = ["on_transformers_import", "register_with_peft", "register_with_transformers", "when_imported"]
