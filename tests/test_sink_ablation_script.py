"""scripts/run_sink_ablation.py: arms by config key, one line for an arm the installed config lacks, reproducible runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script


ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "run_sink_ablation.py"
run_sink_ablation = load_script("run_sink_ablation")


def test_every_arm_of_the_issue_is_defined_by_config_keys():
    assert list(run_sink_ablation.ARMS) == [
        "baseline", "G1 elementwise", "G1 headwise", "G1 head-shared", "G2 value", "additive identity",
        "additive SiLU", "NS-sigmoid", "input-independent", "SDPA SiLU", "SDPA RMSNorm",
    ]  # fmt: skip
    assert set(run_sink_ablation.PAPER_TABLE4) <= set(run_sink_ablation.ARMS)
    assert run_sink_ablation.arm_problem("baseline") is None and run_sink_ablation.arm_problem("G2 value") is None


def test_an_arm_whose_key_the_config_lacks_is_named_in_one_line(monkeypatch, capsys):
    monkeypatch.setitem(run_sink_ablation.ARMS, "future", {"gate_type": "elementwise", "gate_future_key": 1})
    monkeypatch.setitem(run_sink_ablation.ARMS, "odd value", {"gate_type": "elementwise", "gate_activation": "odd"})
    assert run_sink_ablation.arm_problem("future") == (
        "arm 'future': config key gate_future_key is unknown to the installed Qwen3GatedConfig"
    )
    assert "unknown gate_activation 'odd'" in run_sink_ablation.arm_problem("odd value")
    arms, left_out = run_sink_ablation.select_arms(None)  # by default: every arm that can run, the others named
    assert "baseline" in arms and "future" not in arms and any("'future'" in line for line in left_out)
    with pytest.raises(SystemExit) as exit:
        run_sink_ablation.select_arms("baseline,future")  # asked for by name: refused before anything runs
    assert "gate_future_key is unknown" in str(exit.value) and "\n" not in str(exit.value)
    with pytest.raises(SystemExit) as exit:
        run_sink_ablation.select_arms("baseline,no such arm")
    assert str(exit.value).startswith("unknown arm 'no such arm'; the arms are: baseline, G1 elementwise")


def _run(row_overrides):
    row = {
        "first_token_attention": 0.9, "sinking_heads": 1.0, "loss": 2.4, "copy_accuracy": 1.0, "bigram_accuracy": 0.27,
        "largest_activation": 9.0, "first_token_residual_ratio": 6.0, "first_token_value_ratio": 0.04,
        "uniform_attention": 0.161, "settled_step": 1200,
    }  # fmt: skip
    return {**row, **row_overrides}


def test_the_table_puts_the_paper_beside_each_measured_figure():
    runs = [
        _run({"arm": "baseline", "seed": 0, "first_token_attention": 0.8}),
        _run({"arm": "baseline", "seed": 1, "first_token_attention": 1.0}),
        _run({"arm": "G1 headwise", "seed": 0, "mean_gate": 0.2, "gate_below_0.5": 0.9}),
    ]
    lines = run_sink_ablation.table(runs, ["baseline", "G1 headwise"]).splitlines()
    heading = [cell.strip() for cell in lines[0].strip("|").split("|")]
    baseline = dict(zip(heading, (cell.strip() for cell in lines[2].strip("|").split("|"))))
    headwise = dict(zip(heading, (cell.strip() for cell in lines[3].strip("|").split("|"))))
    assert baseline["first-token attention"] == "0.900 ± 0.141" and baseline["paper F-Attn"] == "0.467"
    assert baseline["paper M-Act"] == "1053" and baseline["mean gate"] == "–"
    assert headwise["paper F-Attn"] == "–" and headwise["mean gate"] == "0.200 ± 0.000"


@pytest.mark.slow  # starts the script twice, each training one arm in a process of its own
def test_one_arm_and_seed_gives_the_same_figures_twice(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results = []
    for attempt in ("first", "second"):
        command = [
            sys.executable, str(SCRIPT), "--arms", "G1 headwise", "--seeds", "0", "--steps", "4", "--curve-every", "2",
            "--jobs", "1", "--out", str(tmp_path / attempt), "--runs", str(tmp_path / attempt / "runs"),
        ]  # fmt: skip
        subprocess.run(command, check=True, env=env, capture_output=True, timeout=600)
        report = json.loads((tmp_path / attempt / "results.json").read_text())
        assert (tmp_path / attempt / "results.md").is_file() and (
            tmp_path / attempt / "first_token_attention.png"
        ).is_file()
        results.append([{k: v for k, v in run.items() if k != "elapsed_s"} for run in report["runs"]])
    assert results[0] == results[1]
    (run,) = results[0]
    assert run["arm"] == "G1 headwise" and run["seed"] == 0 and run["curve"]["steps"] == [0, 2, 4]
    assert 0 < run["first_token_attention"] < 1 and 0 < run["mean_gate"] < 1


def test_the_gpu_preset_runs_at_tiny_scale_on_cpu():
    """The preset's options (width 256, bf16 autocast, the reference run's optimizer) reach the run; here 2 steps."""
    args = run_sink_ablation.parse_args(["--preset", "gpu", "--steps", "2", "--batch-size", "4", "--curve-every", "1"])
    assert (args.lr, args.jobs) == (3e-4, 1)
    options = run_sink_ablation.settings(args)
    assert options["precision"] == "bf16" and options["architecture"]["hidden_size"] == 256
    # Trainer takes bf16 only on a GPU (on CPU it asks for use_cpu): the rest of the preset runs here in fp32
    run = run_sink_ablation.run_one("G1 headwise", 0, {**options, "precision": "fp32"})
    assert run["curve"]["steps"] == [0, 1, 2] and 0 < run["first_token_attention"] < 1
    assert run["parameters"] > 4 * 65 * 256  # the wider model
    cpu = run_sink_ablation.parse_args([])
    assert run_sink_ablation.settings(cpu) == {
        "steps": 2000,
        "batch_size": 128,
        "learning_rate": 5e-3,
        "curve_every": 100,
    }
