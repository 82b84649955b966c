"""scripts/run_ablation.py: --arms and --seeds as run_sink_ablation.py takes them, the paper's column, the rank line."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest


SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "run_ablation.py"
sys.path.insert(0, str(SCRIPT.parent))  # the script's own folder, as when it runs: its _results module
spec = importlib.util.spec_from_file_location("run_ablation", SCRIPT)
run_ablation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_ablation)


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
