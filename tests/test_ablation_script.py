"""scripts/run_ablation.py: --arms and --seeds as run_sink_ablation.py takes them, the paper's column, the rank line."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TOKENIZER_TEXT, load_script


ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "run_ablation.py"
run_ablation = load_script("run_ablation")


def test_arms_and_seeds_are_comma_separated(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["run_ablation.py"])
    args = run_ablation.parse_args(["--arms", "baseline,G1 headwise,G1 elementwise head-shared", "--seeds", "0,1,2"])
    assert args.arms == ["baseline", "G1 headwise", "G1 elementwise head-shared"] and args.seeds == [0, 1, 2]
    # an arm's earlier name, with its comma, names the same arm; several values are joined
    args = run_ablation.parse_args(
        ["--arms", "G1 elementwise, head-shared,G2 elementwise", "baseline", "--seeds", "3", "4"]
    )
    assert args.arms == ["G1 elementwise head-shared", "G2 elementwise", "baseline"] and args.seeds == [3, 4]
    assert run_ablation.parse_args([]).arms == list(run_ablation.ARMS)


def test_an_unknown_arm_or_seed_is_one_line(capsys):
    with pytest.raises(SystemExit):
        run_ablation.parse_args(["--arms", "baseline,G9"])
    assert "unknown arm 'G9'; the arms are: baseline, G1 elementwise" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_ablation.parse_args(["--seeds", "0,one"])
    assert "--seeds takes comma-separated integers" in capsys.readouterr().err


def test_rank_correlation():
    assert run_ablation.rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert run_ablation.rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert run_ablation.rank_correlation([1, 2, 3], [1, 1, 2]) == pytest.approx(0.8660254)  # ties: mean ranks


def _rows(losses):
    seed_row = {"parameters": 100, "first_token_attention": 0.02, "largest_activation": 1.0}
    return {arm: {"seeds": {0: {**seed_row, "heldout_loss": loss}}} for arm, loss in losses.items()}


def test_the_table_has_the_paper_column_and_the_rank_line(monkeypatch):
    losses = {
        "baseline": 3.6,
        "G1 elementwise": 3.5,
        "G1 headwise": 3.55,
        "G2 elementwise": 3.58,
        "G5 elementwise": 3.7,
    }
    rows = _rows(losses)
    monkeypatch.setattr(
        run_ablation, "PAPER_PPL_GAIN", {"G1 elementwise": 0.26, "G1 headwise": 0.2, "G2 elementwise": 0.1}
    )
    lines = run_ablation.table(rows, [0]).splitlines()
    heading = [cell.strip() for cell in lines[0].strip("|").split("|")]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")] for line in lines[2:]}
    column = heading.index("paper PPL gain")
    assert cells["G1 elementwise"][column] == "0.260" and cells["G5 elementwise"][column] == "–"
    assert len(heading) == len(cells["baseline"]) and lines[1].count("|---") == len(heading)
    value, line = run_ablation.correlation_with_paper(rows)
    assert value == pytest.approx(1.0) and "over 3 arms: +1.00" in line  # the same order of gains as the paper's
    monkeypatch.setattr(run_ablation, "PAPER_PPL_GAIN", {"G1 elementwise": 0.26})
    value, line = run_ablation.correlation_with_paper(rows)
    assert value is None and "not computed" in line and "1 of these arms" in line


def test_the_limits_line_reads_the_tables_own_figures():
    def row(losses, attention):
        return {
            "seeds": {i: {"heldout_loss": loss, "first_token_attention": attention} for i, loss in enumerate(losses)}
        }

    rows = {
        "baseline": row([3.60, 3.62], 0.02),
        "G1 headwise": row([3.50, 3.50], 0.4),
        "kv heads": row([3.64, 3.64], 0.01),
    }
    line = run_ablation.limits_line(rows)
    # differences 0.110 and 0.030 (median 0.070); spreads 0.014, 0, 0 (median 0); attention at most 0.4
    assert "by a median 0.070, against a median spread of 0.000 between seeds, so the seeds do not blur" in line
    assert "an arm has an attention sink (first-token attention at most 0.400 in any arm, where the paper's" in line
    rows["G1 headwise"] = row([3.59, 3.63], 0.02)  # differences 0.000 and 0.030; spreads 0.014, 0.028, 0
    line = run_ablation.limits_line(rows)
    assert "so most rankings are not settled here; and no arm has an attention sink to remove" in line


def test_the_new_rows_and_the_paper_figures():
    arms = run_ablation.ARMS
    assert arms["NS-sigmoid"] == {"gate_type": "elementwise", "gate_activation": "ns_sigmoid"}
    assert arms["SDPA RMSNorm"] == {"gate_type": "none", "attn_output_transform": "rmsnorm"}
    assert arms["sandwich norm"] == {"gate_type": "none", "sandwich_norm": True}
    # the paper's gains are its baseline's average PPL minus the row's (Table 1: 6.026 - 5.761 for G1 elementwise)
    assert run_ablation.PAPER_PPL_GAIN["G1 elementwise"] == pytest.approx(0.265)
    assert run_ablation.PAPER_PPL_GAIN["kv heads"] == pytest.approx(0.047)
    assert run_ablation.PAPER_PPL_GAIN["NS-sigmoid"] == pytest.approx(0.126)  # Table 4
    for arm in ("SDPA RMSNorm", "sandwich norm", "FFN narrowed", "G1 elementwise additive sigmoid"):
        assert run_ablation.PAPER_PPL_GAIN[arm] is None  # no figure of the paper here: not guessed
    assert set(run_ablation.PAPER_PPL) <= set(arms) and set(run_ablation.PAPER_TABLE4) <= set(arms)


@pytest.mark.parametrize("config", ["ablation_tiny.json", "ablation_100m.json"])
def test_the_parameter_matched_arms_add_what_the_gate_adds(config):
    from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM

    base = json.loads((ROOT / "configs" / config).read_text())
    base.pop("model_type")
    arms = run_ablation.arm_configs(base)

    def parameters(arm):
        with torch.device("meta"):
            model = Qwen3GatedForCausalLM(Qwen3GatedConfig(**{**base, **arms[arm]}))
        return sum(p.numel() for p in model.parameters())

    baseline, gate = parameters("baseline"), parameters("G1 elementwise") - parameters("baseline")
    assert gate > 0
    for arm in ("kv heads", "query heads"):  # about the gate's weights, with attention shapes that divide
        assert abs(parameters(arm) - baseline - gate) <= 0.25 * gate, arm
    assert abs(parameters("FFN narrowed") - baseline) <= 0.05 * gate  # the gated model at the baseline's count
    if config == "ablation_100m.json":
        assert 90e6 < baseline < 110e6  # the GPU preset's ~100M model (97.5M with its 16,384-token vocabulary)


def _recording(tmp_path, **overrides):
    """A results.json as the cpu preset records it, from before the keys it did not have yet."""
    args = run_ablation.parse_args(["--arms", "baseline,G1 headwise", "--seeds", "0,1"])
    args.arms_run = args.arms
    from _results import package_versions

    recording = {
        "command": "python scripts/run_ablation.py",
        "machine": {"python": run_ablation.platform.python_version(), "utc": "2026-12-05T17:15:51+00:00"},
        "versions": package_versions(),
        "git_commit": "8a33944f0c3047880e602c356ad7f0e7433357e6",
        "config": json.loads(args.config.read_text()),
        "seq_len": 128,
        "batch_size": 32,
        "max_tokens": 2_000_000,
        "lr": 3e-3,
        "high_lr": 3e-2,
        "high_lr_tokens": 1_000_000,
        "arms": {
            "G1 headwise, renamed": {  # matched by its keys, not its name
                "config": {"gate_type": "headwise"},
                "seeds": {"0": {"heldout_loss": 3.5}},
                "high_lr": {"loss_spikes": 0},
            }
        },
        **overrides,
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(recording))
    return args, path


def test_reuse_takes_a_run_only_where_everything_that_decides_it_is_identical(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["run_ablation.py"])
    args, path = _recording(tmp_path)
    reused = run_ablation.reusable_runs(path, args)
    assert set(reused) == {("G1 headwise", 0), ("G1 headwise", "high_lr")}  # seed 1 and the baseline: not recorded
    assert reused["G1 headwise", 0]["heldout_loss"] == 3.5
    assert reused["G1 headwise", 0]["recorded"]["utc"] == "2026-12-05T17:15:51+00:00"
    args, path = _recording(tmp_path, lr=1e-3)  # another learning rate: the seed runs are not reused
    assert set(run_ablation.reusable_runs(path, args)) == {("G1 headwise", "high_lr")}
    assert "lr 0.001 there, 0.003 here" in capsys.readouterr().err
    versions = {**json.loads(path.read_text())["versions"], "torch": "0.0"}
    args, path = _recording(tmp_path, versions=versions)  # other arithmetic: nothing is reused
    assert run_ablation.reusable_runs(path, args) == {}
    args, path = _recording(tmp_path, warmup_steps=10)
    assert run_ablation.reusable_runs(path, args) == {}
    args = run_ablation.parse_args(["--arms", "baseline,G1 headwise", "--max-tokens", "1000"])
    args.arms_run = args.arms
    assert ("G1 headwise", 0) not in run_ablation.reusable_runs(_recording(tmp_path)[1], args)


def test_the_baseline_first_seed_is_trained_again_even_when_every_run_is_reused(tmp_path, monkeypatch):
    # A table regenerated from a recording alone still carries the check that the recording reproduces.
    trained = []
    monkeypatch.setattr(run_ablation, "train", lambda args, arm, run, *rest: trained.append((arm, run)) or {})
    args = run_ablation.parse_args(["--arms", "baseline,G1 headwise", "--seeds", "0,1", "--runs", str(tmp_path)])
    arms = ["baseline", "G1 headwise"]
    everything = {(arm, run): {} for arm in arms for run in (0, 1, "high_lr")}
    run_ablation.train_all(args, arms, everything)
    assert trained == [("baseline", "seed0")]
    trained.clear()
    run_ablation.train_all(args, arms, {key: row for key, row in everything.items() if key[0] == "baseline"})
    assert trained == [
        ("baseline", "seed0"),
        ("G1 headwise", "seed0"),
        ("G1 headwise", "seed1"),
        ("G1 headwise", "high_lr"),
    ]


def test_the_check_compares_every_figure_to_the_last_digit():
    recorded = {"heldout_loss": 3.61109170151394, "ppl_2x": 42.1, "elapsed_s": 40.4, "recorded": {"utc": "x"}}
    check = run_ablation.check_reproduction(
        {"heldout_loss": 3.61109170151394, "ppl_2x": 42.1, "elapsed_s": 90}, recorded
    )
    assert check["identical"] and set(check["figures"]) == {"heldout_loss", "ppl_2x"}
    assert not run_ablation.check_reproduction({"heldout_loss": 3.6110917015139, "ppl_2x": 42.1}, recorded)[
        "identical"
    ]


def test_a_preset_needs_what_it_cannot_guess(capsys):
    with pytest.raises(SystemExit):
        run_ablation.parse_args(["--preset", "gpu"])
    assert "--preset gpu needs --corpus" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_ablation.parse_args(["--preset", "gpu", "--corpus", ".", "--nproc-per-node", "3"])
    assert "--rows 128 is not a multiple of --micro-batch x --nproc-per-node (32 x 3)" in capsys.readouterr().err
    args = run_ablation.parse_args(["--preset", "gpu", "--corpus", "."])
    assert args.config.name == "ablation_100m.json" and args.precision == "bf16" and args.seq_len == 1024
    assert args.arm_keys["query heads"] == {"gate_type": "none", "num_attention_heads": 18}


@pytest.mark.slow
def test_the_gpu_preset_runs_under_torchrun_at_tiny_scale(tmp_path):
    """The gpu preset's command (bf16 autocast, torchrun, the global batch split over the processes) with a tiny
    model and budget, on 2 CPU processes (gloo): every run finishes and the table is written."""
    corpus = tmp_path / "corpus"
    (corpus / "train").mkdir(parents=True)
    (corpus / "heldout").mkdir()
    for i in range(60):  # .txt files, one document each
        (corpus / "train" / f"{i:02}.txt").write_text(f"{i}: " + " ".join(TOKENIZER_TEXT))
    for i in range(6):
        (corpus / "heldout" / f"{i}.txt").write_text(f"held out {i}: " + " ".join(TOKENIZER_TEXT) * 2)
    command = [
        sys.executable, str(SCRIPT), "--preset", "gpu", "--corpus", str(corpus), "--nproc-per-node", "2",
        "--config", str(ROOT / "configs" / "tiny_baseline.json"), "--seq-len", "32", "--rows", "8",
        "--micro-batch", "2", "--max-tokens", "1024", "--high-lr-tokens", "512", "--warmup-steps", "2",
        "--vocab-size", "300", "--threads", "1", "--arms", "baseline,G1 elementwise,kv heads", "--seeds", "0",
        "--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "results"),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "results" / "results.json").read_text())
    assert report["preset"] == "gpu" and report["processes"] == 2 and report["precision"] == "bf16"
    assert list(report["arms"]) == ["baseline", "G1 elementwise", "kv heads"]
    for arm in report["arms"].values():
        assert math.isfinite(arm["seeds"]["0"]["heldout_loss"]) and "loss_spikes" in arm["high_lr"]
    summary = json.loads((tmp_path / "runs" / "G1_elementwise" / "seed0" / "summary.json").read_text())
    assert summary["num_processes"] == 2 and summary["rows_per_step"] == 8  # 2 processes x 2 rows x 2 accumulated
    assert "| kv heads |" in (tmp_path / "results" / "results.md").read_text()
