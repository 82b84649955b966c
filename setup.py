"""Ships gated-qwen's startup hook, ``gated_qwen_startup.pth``, at the top of site-packages (gated_qwen_startup.py says
what it does). Everything else about the package is in pyproject.toml.

setuptools installs no ``.pth`` of a project's own, so ``build_py`` writes it: into the wheel's root (``build_lib``)
for a wheel, and into the root of the editable wheel (``install_lib``, where setuptools assembles it) for
``pip install -e .``. Either way it is a file of the wheel, so its RECORD lists it and ``pip uninstall`` removes it.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


STARTUP_PTH = "gated_qwen_startup.pth"
# site runs a .pth line that starts with "import" (gated_qwen_startup.py says what this one does) at every start,
# twice in a venv (site.venv adds site-packages, then site.main again: two finders, each harmless). The line defines
# its finder, a lambda, itself: a process that never looks transformers up opens no file and imports nothing for it.
# The module is imported only when transformers is looked up, and only if it is still there (a half-uninstalled
# gated-qwen, an editable install's deleted checkout). Everything else, the switch GATED_QWEN_NO_STARTUP_HOOK
# included, is in the module, so that the line stays what the finder needs.
STARTUP_LINE = (
    'import sys; hook = lambda name, *args: __import__("gated_qwen_startup").find_spec(name, *args) if name == '
    '"transformers" and __import__("importlib.util").util.find_spec("gated_qwen_startup") else None; '
    'hook.find_spec = hook; hook.__qualname__ = "gated_qwen_startup_hook"; sys.meta_path.insert(0, hook)\n'
)


class BuildPyWithStartupHook(build_py):
    """``build_py``, and the startup hook's ``.pth`` at the root of what becomes the wheel."""

    def run(self):
        super().run()
        self.mkpath(self._pth_root())
        Path(self._pth_root(), STARTUP_PTH).write_text(STARTUP_LINE)

    def _pth_root(self) -> str:
        return self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        return outputs if self.editable_mode else [*outputs, str(Path(self.build_lib, STARTUP_PTH))]


setup(cmdclass={"build_py": BuildPyWithStartupHook})
