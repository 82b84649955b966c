"""Installed means registered (issue 36): with gated-qwen installed, a fresh Python of the environment that never
runs ``import gated_qwen`` loads gated checkpoints, dense and MoE, through the Auto classes, ``pipeline``,
``lm_eval --model hf`` and ``accelerate launch``; the startup hook (gated_qwen_startup.py) does it.

These run in the test environment, where gated-qwen is installed (``pip install -e .``, as README says); the built
wheel's hook is tested in tests/test_packaging.py. ``transformers serve``: tests/test_transformers_serve.py.
"""

from __future__ import annotations

import json

import pytest
from installed_helpers import (
    FAMILIES,
    console_script,
    installed_startup_hook,
    run_command,
    run_fresh,
    write_gated_checkpoint,
)


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    installed_startup_hook()
    folder = tmp_path_factory.mktemp("gated")
    return {family: write_gated_checkpoint(folder / family, family) for family in FAMILIES}


AUTO_AND_PIPELINE = """
import sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM, pipeline

path = sys.argv[1]
model = AutoModelForCausalLM.from_pretrained(path)
print(type(model).__name__, AutoConfig.from_pretrained(path).model_type)
generator = pipeline("text-generation", model=path, device="cpu")
text = generator("The gate", max_new_tokens=3, do_sample=False)[0]["generated_text"]
print(type(generator.model).__name__, text.startswith("The gate"))
print("gated_qwen_startup" in sys.modules)
"""


@pytest.mark.parametrize("family", FAMILIES)
def test_a_fresh_process_loads_through_the_auto_classes_and_pipeline(checkpoints, family):
    result = run_fresh(AUTO_AND_PIPELINE, str(checkpoints[family]))
    assert result.returncode == 0, result.stderr[-3000:]
    model_type = {"dense": "qwen3_gated", "moe": "qwen3_moe_gated"}[family]
    assert result.stdout.split() == [FAMILIES[family], model_type, FAMILIES[family], "True", "True"], result.stdout


def test_without_the_hook_transformers_does_not_know_the_model(checkpoints):
    # What the hook adds: turned off, the same fresh process fails as an environment without gated-qwen does.
    code = (
        "import sys\nfrom transformers import AutoModelForCausalLM\nAutoModelForCausalLM.from_pretrained(sys.argv[1])"
    )
    result = run_fresh(code, str(checkpoints["dense"]), env={"GATED_QWEN_NO_STARTUP_HOOK": "1"})
    assert result.returncode != 0
    assert "qwen3_gated" in result.stderr


def test_a_process_that_never_imports_transformers_imports_nothing_of_gated_qwen():
    installed_startup_hook()
    result = run_fresh(
        "import sys; print(sorted(m for m in sys.modules if m.startswith(('gated_qwen', 'wrapt', 'torch'))))\n"
        "print(any(getattr(finder, '__qualname__', None) == 'gated_qwen_startup_hook' for finder in sys.meta_path))"
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    # the hook's finder waits, and nothing is imported for it, its own module included
    assert result.stdout.split("\n")[:2] == ["[]", "True"]


def test_a_probe_of_transformers_registers_nothing_and_the_import_after_it_does():
    installed_startup_hook()
    code = (
        "import importlib.util, sys\n"
        "assert importlib.util.find_spec('transformers') is not None\n"
        "print('gated_qwen' in sys.modules)\n"
        "from transformers import AutoConfig\n"
        "print(AutoConfig.for_model('qwen3_moe_gated').model_type)\n"
    )
    result = run_fresh(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["False", "qwen3_moe_gated"]


LM_EVAL_ITEMS = [
    {"question": "The gate scales each head's", "choices": ["output", "lazy dog"], "answer": 0},
    {"question": "The quick brown fox jumps over the", "choices": ["gate", "lazy dog"], "answer": 1},
]


def write_lm_eval_task(folder) -> str:
    """A tiny multiple-choice task (YAML and JSON lines) in ``folder``; returns its name."""
    folder.mkdir()
    data = folder / "items.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in LM_EVAL_ITEMS))
    (folder / "gated_qwen_installed_choice.yaml").write_text(
        "task: gated_qwen_installed_choice\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n  cache_dir: {folder / 'datasets_cache'}\n"
        "test_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    return "gated_qwen_installed_choice"


@pytest.mark.parametrize("family", FAMILIES)
def test_the_lm_eval_command_line_evaluates_a_gated_checkpoint(checkpoints, family, tmp_path):
    lm_eval = console_script("lm_eval")
    task = write_lm_eval_task(tmp_path / "tasks")
    result = run_command(
        lm_eval,
        *("--model", "hf", "--model_args", f"pretrained={checkpoints[family]},dtype=float32"),
        *("--tasks", task, "--include_path", str(tmp_path / "tasks"), "--device", "cpu", "--batch_size", "1"),
        *("--output_path", str(tmp_path / "out")),
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert task in result.stdout and "acc" in result.stdout
    (results,) = (tmp_path / "out").rglob("results_*.json")
    accuracy = json.loads(results.read_text())["results"][task]["acc,none"]
    assert 0.0 <= accuracy <= 1.0


def test_accelerate_launch_runs_a_script_that_loads_a_gated_checkpoint(checkpoints, tmp_path):
    accelerate = console_script("accelerate")
    script = tmp_path / "load.py"
    script.write_text(
        "import sys\nfrom transformers import AutoModelForCausalLM\n"
        "print(type(AutoModelForCausalLM.from_pretrained(sys.argv[1])).__name__)\n"
    )
    result = run_command(accelerate, "launch", "--num_processes", "1", "--cpu", str(script), str(checkpoints["moe"]))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Qwen3MoeGatedForCausalLM" in result.stdout


def test_trls_command_line_trains_a_gated_checkpoint(checkpoints, tmp_path):
    trl = console_script("trl")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(
        "".join(json.dumps({"text": f"{i}: the gate scales each head's output"}) + "\n" for i in range(8))
    )
    result = run_command(
        *(trl, "sft", "--model_name_or_path", str(checkpoints["moe"]), "--dataset_name", str(tmp_path / "data")),
        *("--output_dir", str(tmp_path / "out"), "--max_steps", "2", "--per_device_train_batch_size", "2"),
        *("--max_length", "32", "--use_cpu", "--report_to", "none", "--save_strategy", "no"),
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["model_type"] == "qwen3_moe_gated" and saved["architectures"] == ["Qwen3MoeGatedForCausalLM"]
