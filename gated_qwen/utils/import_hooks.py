"""Import hooks: run code when a module is first imported, and keep old module paths importable.

``import gated_qwen`` imports neither torch nor transformers, so that the ``gated-qwen`` command starts
at once; :func:`when_imported` lets it still register with transformers and PEFT the moment those load
(the pattern of ``wrapt.when_imported``). :func:`alias_module` keeps the import paths of earlier releases
(``gated_qwen.conversion``, ``gated_qwen.analysis``, ...) working as names of the modules' new places.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
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


_ALIASES: dict[str, str] = {}


class _AliasLoader(importlib.abc.Loader):
    """Loads an alias as the module it names: both names are then one module object."""

    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):  # the target module is executed by its own import
        pass


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _ALIASES:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(_ALIASES[fullname]))


_ALIAS_FINDER = _AliasFinder()


def alias_module(alias: str, target: str) -> None:
    """Make ``import alias`` give the module ``target`` (imported on first use of the alias).

    >>> alias_module("gated_qwen_example_alias", "json")
    >>> import gated_qwen_example_alias, json
    >>> gated_qwen_example_alias is json
    True
    """
    _ALIASES[alias] = target
    if _ALIAS_FINDER not in sys.meta_path:
        sys.meta_path.append(_ALIAS_FINDER)


__all__ = ["alias_module", "when_imported"]
