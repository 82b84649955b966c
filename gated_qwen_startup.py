"""gated-qwen's startup hook: with gated-qwen installed, every Python of the environment loads gated checkpoints.

transformers has no entry point for model plugins, so a process that never runs ``import gated_qwen`` (``lm_eval
--model hf``, ``transformers serve`` and the process it spawns, ``accelerate launch``, TRL's command line, a bare
``AutoModelForCausalLM.from_pretrained``) would not know ``qwen3_gated`` or ``qwen3_moe_gated``. The installation
puts ``gated_qwen_startup.pth`` at the top of site-packages (setup.py writes it into the wheel and into an editable
install; ``pip uninstall`` removes it with this file). Python's :mod:`site` runs its one line at every start: it
puts on ``sys.meta_path`` a finder, a lambda named ``gated_qwen_startup_hook`` defined in the line itself, that
answers ``None`` for every name but ``transformers``. A process that never looks transformers up pays for that
line and nothing else: no file is opened for it, this module is not imported (``scripts/bench_startup_hook.py``
measures it beside the floors of any ``.pth`` hook, results/startup_hook/).

When transformers is looked up, the line's finder imports this module, or does nothing where it is gone (a
half-uninstalled gated-qwen, an editable install's deleted checkout), and asks :func:`find_spec`: it returns
transformers' spec with a loader that runs transformers' own, then :func:`register`, which imports
:mod:`gated_qwen`, whose post-import hooks (:mod:`gated_qwen.models.auto`) register the gated families as ``import
gated_qwen`` would have: the process is where it would be had it run ``import gated_qwen`` first. A probe that
does not import (``importlib.util.find_spec("transformers")``) gets the spec and triggers nothing; the finder stays
for the import that follows. ``GATED_QWEN_NO_STARTUP_HOOK`` set to anything but ``0`` turns the hook off: it then
registers nothing.

A top-level module, not part of the ``gated_qwen`` package: importing a package's submodule runs the package's
``__init__``, which imports wrapt (and, through it, asyncio).
"""

import os
import sys


# The module whose import triggers the registration, the variable that turns the hook off, and the name of the
# finder the .pth line defines (setup.py's STARTUP_LINE spells all three).
TRIGGER = "transformers"
DISABLE_VARIABLE = "GATED_QWEN_NO_STARTUP_HOOK"
HOOK_NAME = "gated_qwen_startup_hook"

_finding = False  # while find_spec asks the other finders itself


def find_spec(fullname, path=None, target=None):
    """Called by the .pth line's finder when transformers is looked up: the spec the other finders find for it,
    with a :class:`RegisteringLoader`; ``None`` for any other name, while asking, or with the hook turned off."""
    global _finding
    if fullname != TRIGGER or _finding or os.environ.get(DISABLE_VARIABLE, "0") not in ("", "0"):
        return None
    from importlib.util import find_spec as find_with_other_finders

    _finding = True
    try:
        spec = find_with_other_finders(fullname)
    finally:
        _finding = False
    if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
        spec.loader = RegisteringLoader(spec.loader)
    return spec


class RegisteringLoader:
    """transformers' loader, which registers the gated families once transformers has run."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def __getattr__(self, name):  # every other loader method (is_package, get_code, resources) is the original's
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        if getattr(module.__spec__, "loader", None) is self:
            module.__spec__.loader = self.loader  # transformers' module (a _LazyModule) keeps the spec: as it was
        module.__loader__ = self.loader
        register()


def register() -> None:
    """Leave ``sys.meta_path`` and import :mod:`gated_qwen` (its post-import hook on transformers registers the
    gated families at once). A gated_qwen that is gone is left alone; one that fails to import or register is
    reported in one warning naming gated-qwen and what to do, without breaking the import of transformers."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if getattr(finder, "__qualname__", None) != HOOK_NAME]
    try:
        import gated_qwen  # noqa: F401
    except ModuleNotFoundError as error:
        if error.name == "gated_qwen":  # uninstalled but for the hook: nothing to register
            return
        warn(error)
    except Exception as error:  # never break `import transformers`: the process runs, without the gated models
        warn(error)


def warn(error: BaseException) -> None:
    from transformers.utils import logging

    logging.get_logger("gated_qwen").warning(
        f"gated-qwen is installed but could not register its models with transformers "
        f"({type(error).__name__}: {error}), so checkpoints of model type qwen3_gated and qwen3_moe_gated do not "
        f"load in this process. Reinstall it (pip install --force-reinstall gated-qwen) or uninstall it "
        f"(pip uninstall gated-qwen); {DISABLE_VARIABLE}=1 turns this startup hook off."
    )
