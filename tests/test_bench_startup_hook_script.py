"""scripts/bench_startup_hook.py: its venvs hold what each arm says (the hook live in its arm, a floor in each of
the others), and a short run writes every arm's runs and the differences the manual reads."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import load_script


bench = load_script("bench_startup_hook")

WHAT_RUNS = """
import sys
hooked = any(getattr(finder, "__qualname__", None) == "gated_qwen_startup_hook" for finder in sys.meta_path)
print(hooked, "empty_startup_module" in sys.modules, "gated_qwen_startup" in sys.modules)
"""


@pytest.mark.parametrize(
    ("arm", "expected"),
    [
        (bench.BARE, "False False False"),
        (bench.HOOK, "True False False"),  # the hook's finder waits; its module is not imported
        (bench.IMPORT_SYS, "False False False"),
        (bench.EMPTY_MODULE, "False True False"),
    ],
)
def test_each_venv_runs_what_its_arm_measures(arm, expected, tmp_path):
    python = bench.make_venv(tmp_path / "venv", arm)
    result = subprocess.run([str(python), "-c", WHAT_RUNS], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == expected and result.stderr == ""


def test_a_short_run_writes_every_arm_and_the_differences(tmp_path):
    assert bench.main(["--rounds", "3", "--results-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "results.json").read_text())
    assert {arm: len(runs) for arm, runs in report["seconds"].items()} == dict.fromkeys(bench.ARMS, 3)
    assert all(0 < second < 5 for runs in report["seconds"].values() for second in runs)
    hook_over_floor = report["differences"][f"{bench.HOOK} - {bench.EMPTY_MODULE}"]
    low, high = hook_over_floor["ci95_ms"]
    assert low <= hook_over_floor["ms"] <= high
    table = (tmp_path / "results.md").read_text()
    assert all(f"| {arm} |" in table for arm in bench.ARMS) and "noise floor" in table
