"""Registration survives any import order and any find_spec probe (issue: TRL's probe dropped it).

Each case runs in a fresh interpreter, since registration happens once per process: it imports a client
library before or after ``gated_qwen``, with or without ``importlib.util.find_spec`` probes of transformers and
of the client first (TRL and optimum-quanto probe transformers before importing it), then checks that
``qwen3_gated`` and ``qwen3_moe_gated`` are known to the Auto classes, that both families load strictly, and that
PEFT's tables know the gated model types.
"""

import importlib.util
import subprocess
import sys

import pytest

from gated_qwen.utils.import_hooks import when_imported


pytestmark = pytest.mark.slow


CLIENTS = ["trl", "peft", "accelerate", "datasets", "lm_eval", "vllm", "optimum.quanto"]

CHECK = """
from transformers import AutoConfig, AutoModelForCausalLM
for model_type in ("qwen3_gated", "qwen3_moe_gated"):
    config = AutoConfig.for_model(model_type)
    model_class = AutoModelForCausalLM._model_mapping[type(config)]
    assert getattr(model_class.from_pretrained.__func__, "_gated_qwen_strict_loading", False), model_class
import peft.utils.constants as constants
assert "qwen3_gated" in constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
print("registered")
"""


def run_case(client: str, gated_qwen_first: bool, probe: bool) -> subprocess.CompletedProcess:
    lines = []
    if probe:
        lines.append(
            f"import importlib.util; importlib.util.find_spec('transformers'); importlib.util.find_spec({client!r})"
        )
    imports = ["import gated_qwen", f"import {client}"]
    lines += imports if gated_qwen_first else imports[::-1]
    if probe:  # and once more after both, as a library that probes lazily would
        lines.append("importlib.util.find_spec('transformers'); importlib.util.find_spec('peft')")
    return subprocess.run(
        [sys.executable, "-c", "\n".join(lines) + "\n" + CHECK], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("probe", [True, False], ids=["probe", "no-probe"])
@pytest.mark.parametrize("gated_qwen_first", [True, False], ids=["gated_qwen-first", "client-first"])
@pytest.mark.parametrize("client", CLIENTS)
def test_registration_survives_import_order_and_probes(client, gated_qwen_first, probe):
    if importlib.util.find_spec(client) is None:
        pytest.skip(f"{client} is not installed")
    result = run_case(client, gated_qwen_first, probe)
    assert result.returncode == 0 and "registered" in result.stdout, result.stderr[-3000:]


def test_a_probe_before_the_import_keeps_the_hook(tmp_path, monkeypatch):
    # The failure of the issue in-process: a module with a hook waiting is looked up, then imported.
    (tmp_path / "gated_qwen_hook_target.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fired = []
    when_imported("gated_qwen_hook_target", lambda module: fired.append(module.VALUE))
    assert importlib.util.find_spec("gated_qwen_hook_target") is not None
    assert fired == []
    import gated_qwen_hook_target  # noqa: F401

    assert fired == [1]
    when_imported("gated_qwen_hook_target", lambda module: fired.append(2))  # already imported: runs at once
    assert fired == [1, 2]
    sys.modules.pop("gated_qwen_hook_target")
