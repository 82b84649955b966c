"""Post-import hooks: run code when a module is first imported.

``import gated_qwen`` imports neither torch nor transformers, so that the ``gated-qwen`` command starts at
once; :func:`when_imported` lets it still register with transformers and PEFT the moment those load. It is
wrapt's post-import hook (``wrapt.register_post_import_hook``), which keeps a hook until the module is really
executed: a probe such as ``importlib.util.find_spec("transformers")`` (TRL and optimum-quanto ask it before
importing) leaves the hook in place.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import wrapt


def when_imported(module_name: str, callback: Callable[[ModuleType], None]) -> None:
    """Run ``callback(module)`` now if ``module_name`` is imported, else right after it is first imported.

    >>> when_imported("json", lambda module: print(module.__name__))
    json
    """
    wrapt.register_post_import_hook(callback, module_name)


__all__ = ["when_imported"]
