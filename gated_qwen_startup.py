"""gated-qwen's startup hook: with gated-qwen installed, every Python of the environment loads gated checkpoints.

transformers has no entry point for model plugins, so a process that never runs ``import gated_qwen`` (``lm_eval
--model hf``, ``transformers serve`` and the process it spawns, ``accelerate launch``, TRL's command line, a bare
``AutoModelForCausalLM.from_pretrained``) would not know ``qwen3_gated`` or ``qwen3_moe_gated``. The installation
puts ``gated_qwen_startup.pth`` at the top of site-packages (setup.py writes it into the wheel and into an editable
install; ``pip uninstall`` removes it with this file). Python's :mod:`site` runs its one line at every start: it
puts on ``sys.meta_path`` a finder, defined in the line itself, that answers ``None`` for every name but
``transformers``; unless ``GATED_QWEN_NO_STARTUP_HOOK`` is set (to anything but ``0``), which turns the hook off.
A process that never looks transformers up pays for the compilation and run of that line and nothing else: no
file is opened for it, this module is not imported (``scripts/bench_startup_hook.py`` measures it: about 1 ms of a
start, results/startup_hook/).

When transformers is first looked up, the line's finder imports this module, or does nothing where it is gone (a
half-uninstalled gated-qwen), and hands over to :func:`find_spec`: a :class:`RegisterAfterTransformers` takes its
place, returns transformers' spec with a loader that runs transformers' own, then imports :mod:`gated_qwen`, whose
post-import hooks (:mod:`gated_qwen.models.auto`) register the gated families as ``import gated_qwen`` would have:
the process is where it would be had it run ``import gated_qwen`` first.

A top-level module, not part of the ``gated_qwen`` package: importing a package's submodule runs the package's
``__init__``, which imports wrapt (and, through it, asyncio).
"""

import sys


# The module whose import triggers the registration, the variable that turns the hook off, and the class name of
# the finder the .pth line defines (setup.py's STARTUP_LINE spells all three).
TRIGGER = "transformers"
DISABLE_VARIABLE = "GATED_QWEN_NO_STARTUP_HOOK"
PTH_FINDER = "GatedQwenStartupFinder"


class RegisterAfterTransformers:
    """A ``sys.meta_path`` finder for ``transformers`` alone: hands back the spec the other finders find for it,
    with a loader that runs transformers' own loader, then :func:`register`. Other names are left to the other
    finders; a probe (``importlib.util.find_spec("transformers")``) gets the spec and triggers nothing."""

    def __init__(self) -> None:
        self.finding = False  # while it asks the other finders itself

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TRIGGER or self.finding:
            return None
        from importlib.util import find_spec

        self.finding = True
        try:
            spec = find_spec(fullname)
        finally:
            self.finding = False
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
    """Import :mod:`gated_qwen` (its post-import hook on transformers registers the gated families at once) and
    leave ``sys.meta_path``. A gated_qwen half uninstalled is left alone; one that fails to import or register is
    reported in one warning naming gated-qwen and what to do, without breaking the import of transformers."""
    sys.meta_path[:] = [
        finder
        for finder in sys.meta_path
        if not isinstance(finder, RegisterAfterTransformers) and type(finder).__name__ != PTH_FINDER
    ]
    try:
        import gated_qwen  # noqa: F401
    except ModuleNotFoundError as error:
        if error.name == "gated_qwen":  # uninstalled but for this file: nothing to register
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


def find_spec(fullname, path=None, target=None):
    """Called by the .pth line's finder when transformers is looked up: a :class:`RegisterAfterTransformers` takes
    that finder's place on ``sys.meta_path`` (so a probe that does not import leaves a finder for the import that
    follows) and answers."""
    finder = RegisterAfterTransformers()
    sys.meta_path[:] = [finder if type(f).__name__ == PTH_FINDER else f for f in sys.meta_path]
    return finder.find_spec(fullname, path, target)
