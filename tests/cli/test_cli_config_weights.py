"""Issue 21 through every command: a config that does not describe its weights is one line, exit 2, at once.

Each row of the issue's table (one config key edited on a small released-layout arm) through each way in:
inspect, convert, export, generate, analyze, eval, train --init-from (from_pretrained: tests/checkpoint/
test_validation.py; the vLLM plugin: tests/serving/test_vllm_plugin.py). Building the model fails the test
(the refusal must come from the headers), and a command still running after 60 s fails it too, so a
regression fails instead of allocating what the config claims.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
import torch
from conftest import write_released_checkpoint, write_tiny_tokenizer

from gated_qwen.cli import main
from gated_qwen.models.qwen3_gated import modeling_qwen3_gated


ARM = {
    "gate": "headwise",
    "hidden_size": 64,
    "vocab_size": 320,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}

ROWS = {
    "20,000 layers": (
        {"num_hidden_layers": 20000},
        "config.json says num_hidden_layers 20000, but the checkpoint holds 2 layers",
    ),
    "vocabulary 500,000,000": (
        {"vocab_size": 500_000_000},
        "config.json says vocab_size 500000000, but model.embed_tokens.weight is (320, 64)",
    ),
    "MLP 50,000,000": (
        {"intermediate_size": 50_000_000},
        "config.json says intermediate_size 50000000, but model.layers.0.mlp.down_proj.weight is (64, 128)",
    ),
    "4 kv heads": (
        {"num_key_value_heads": 4},
        "config.json says num_key_value_heads 4 and head_dim 16, but model.layers.0.self_attn.k_proj.weight is (32, 64)",
    ),
    "1 layer": ({"num_hidden_layers": 1}, "config.json says num_hidden_layers 1, but the checkpoint holds 2 layers"),
}

# command -> its argv for the checkpoint {arm}, writing (if anything) into {out}
WAYS = {
    "inspect": ["inspect", "{arm}"],
    "convert": ["convert", "{arm}", "{out}", "--gate", "keep", "--quiet"],
    "export": ["export", "{arm}", "{out}", "--to", "qwen3_5", "--quiet"],
    "generate": ["generate", "--model", "{arm}", "--device", "cpu", "--max-new-tokens", "2", "Hello"],
    "analyze": ["analyze", "{arm}", "--prompt", "Hello world", "--out", "{out}", "--no-plots", "--device", "cpu"],
    "eval": ["eval", "{arm}", "--tasks", "hellaswag", "--limit", "2", "--device", "cpu"],
    "train": [
        "train",
        "--train-file",
        "{corpus}",
        "--out",
        "{out}",
        "--max-steps",
        "1",
        "--threads",
        "1",
        "--init-from",
        "{arm}",
    ],
}


@pytest.fixture(scope="module")
def arms(tmp_path_factory):
    """The arm with each row's edit, its tokenizer beside it (generate, analyze, eval and train read it first)."""
    root = tmp_path_factory.mktemp("arms")
    write_released_checkpoint(root / "released", **ARM)
    write_tiny_tokenizer(root / "released")
    folders = {}
    for number, (row, (changes, _)) in enumerate(ROWS.items()):
        folder = shutil.copytree(root / "released", root / f"row{number}")
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps(config))
        folders[row] = folder
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Hello gated attention {i}."}) + "\n" for i in range(8)))
    return {"released": root / "released", "rows": folders, "corpus": corpus}


@pytest.fixture
def guarded(monkeypatch):
    """Building the model fails the test, unless on the meta device (nothing allocated: the check reads what the
    config implies from such a skeleton) with the checkpoint's 2 layers; so does running for more than 60 s
    (SIGALRM, main thread)."""
    build = modeling_qwen3_gated.Qwen3GatedModel.__init__

    def refuse(self, config):
        if torch.get_default_device().type != "meta" or config.num_hidden_layers > 2:
            raise AssertionError(
                f"a model was built for {config.num_hidden_layers} layers, vocabulary {config.vocab_size}"
            )
        build(self, config)

    monkeypatch.setattr(modeling_qwen3_gated.Qwen3GatedModel, "__init__", refuse)

    def expire(signum, frame):
        raise TimeoutError("still running after 60 s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def harness_tasks(monkeypatch):
    """eval looks its tasks up in lm-evaluation-harness before loading; where that extra is not installed, a
    stand-in that knows every task lets the command reach the model, which is what these tests are about."""
    import importlib.util

    if importlib.util.find_spec("lm_eval") is None:
        from gated_qwen.tools import evaluation

        monkeypatch.setattr(evaluation, "task_manager", lambda include_path=None, tasks=(): None)


def run(way: str, arm: Path, out: Path, corpus: Path, capsys) -> tuple[int, str, str]:
    argv = [arg.format(arm=arm, out=out, corpus=corpus) for arg in WAYS[way]]
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("way", WAYS)
@pytest.mark.slow
def test_each_row_is_refused_by_each_command_in_one_line(arms, way, row, tmp_path, capsys, guarded, harness_tasks):
    out = tmp_path / "out"
    status, stdout, stderr = run(way, arms["rows"][row], out, arms["corpus"], capsys)
    lines = stderr.strip().splitlines()
    assert status == 2 and "Traceback" not in stderr, stderr
    assert lines[-1].startswith(f"gated-qwen {way}: error: {arms['rows'][row]}: "), stderr
    assert ROWS[row][1] in lines[-1], lines[-1]
    assert not out.exists()  # refused before anything was written
    if way == "inspect":
        assert stdout == ""  # no table of what the config claims


@pytest.mark.parametrize("way", ["inspect", "convert", "export"])
def test_the_unedited_arm_passes_the_same_commands(arms, way, tmp_path, capsys):
    """The refusals above are the edits', not the arm's (the commands that load a model are covered by from_pretrained)."""
    status, stdout, stderr = run(way, arms["released"], tmp_path / "out", arms["corpus"], capsys)
    assert status == 0, stderr


def test_inspect_names_a_config_value_that_makes_no_model(arms, tmp_path, capsys):
    folder = shutil.copytree(arms["released"], tmp_path / "zero")
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 0
    (folder / "config.json").write_text(json.dumps(config))
    status, _, stderr = run("inspect", folder, tmp_path / "out", arms["corpus"], capsys)
    assert status == 2 and "Traceback" not in stderr
    assert "says intermediate_size 0, which makes no model: it must be a positive integer" in stderr
