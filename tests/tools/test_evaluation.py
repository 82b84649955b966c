"""gated_qwen.tools.evaluation and ``gated-qwen eval``: lm-evaluation-harness on a loaded Qwen3Gated model.

The task is defined here (a YAML file and a small JSON-lines dataset written by the test); nothing is
downloaded. The harness's log-likelihoods are checked against ones computed by hand from the model's logits.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import write_released_checkpoint, write_tiny_tokenizer

from gated_qwen.cli import main
from gated_qwen.errors import GatedQwenError


ITEMS = [
    {
        "question": "The gate scales each head's attention",
        "choices": ["output", "lazy dog", "return a + b"],
        "answer": 0,
    },
    {"question": "def add(a, b):\n    return", "choices": ["a + b", "the attention sink"], "answer": 0},
    {"question": "The quick brown fox jumps over the", "choices": ["gate", "lazy dog"], "answer": 1},
]
TASK = "gated_qwen_tiny_choice"


@pytest.fixture
def lm_eval():
    return pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install 'gated-qwen[eval]')")


@pytest.fixture
def task_folder(tmp_path):
    return write_task_folder(tmp_path)


def write_task_folder(tmp_path):
    """The tiny multiple-choice task (YAML and JSON-lines data) in ``tmp_path / "tasks"``."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    data = folder / "items.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    (folder / f"{TASK}.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        f"  data_files:\n    test: {data}\n"
        f"  cache_dir: {tmp_path / 'datasets_cache'}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    return folder


def write_arm(folder, seed, gate="headwise"):
    write_released_checkpoint(folder, seed=seed, gate=gate, vocab_size=320, gate_scale=2.0)
    write_tiny_tokenizer(folder)
    return folder


@pytest.fixture
def arm(tmp_path):
    return write_arm(tmp_path / "arm", seed=0)


def loglikelihood_by_hand(model, tokenizer, context: str, continuation: str) -> float:
    """Sum of log p(continuation tokens | context), one forward over context + continuation."""
    whole = tokenizer(context + continuation, add_special_tokens=False).input_ids
    n_context = len(tokenizer(context, add_special_tokens=False).input_ids)
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([whole[:-1]])).logits[0].double(), dim=-1)  # (T-1, V)
    return sum(logprobs[position - 1, whole[position]].item() for position in range(n_context, len(whole)))


def test_harness_loglikelihoods_equal_the_models_own(lm_eval, arm, task_folder):
    from gated_qwen.tools.evaluation import evaluate
    from gated_qwen.tools.generation import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(str(arm), device="cpu", dtype="float32")
    result = evaluate(
        model, tokenizer, [TASK], include_path=task_folder, log_samples=True, bootstrap_iters=0, batch_size=2
    )
    samples = sorted(result["samples"][TASK], key=lambda sample: sample["doc_id"])
    assert len(samples) == len(ITEMS)
    correct = 0
    for item, sample in zip(ITEMS, samples):
        expected = [
            loglikelihood_by_hand(model, tokenizer, item["question"], " " + choice) for choice in item["choices"]
        ]
        harness = [float(loglikelihood) for loglikelihood, _ in sample["filtered_resps"]]
        assert harness == pytest.approx(expected, abs=1e-4)
        correct += max(range(len(expected)), key=expected.__getitem__) == item["answer"]
    assert result["results"][TASK]["acc,none"] == pytest.approx(correct / len(ITEMS))


def test_eval_command_compares_arms_and_writes_results(lm_eval, tmp_path, task_folder, capfd, monkeypatch):
    capsys = capfd  # file-descriptor level: git, run by the harness, writes to it directly
    monkeypatch.chdir(tmp_path)  # not a git repository
    first, second = (
        write_arm(tmp_path / "a" / "final", seed=0),
        write_arm(tmp_path / "b" / "final", seed=1, gate="elementwise"),
    )
    out = tmp_path / "results"
    argv = [
        "eval",
        str(first),
        "--compare",
        str(second),
        "--tasks",
        TASK,
        "--include-path",
        str(task_folder),
        "--output-path",
        str(out),
    ]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "| task | metric | n-shot | final | final-2 |" in table
    report = json.loads((out / "results.json").read_text())
    assert set(report["arms"]) == {"final", "final-2"}
    assert report["arms"]["final-2"]["source"]["model"] == str(second)
    assert (out / "results.md").read_text().strip() == table.strip()
    assert "fatal" not in capsys.readouterr().err  # nor the harness's git probe outside a repository
    # the same output again is refused before anything is evaluated, and allowed with --overwrite
    assert main(argv) == 2
    assert "already holds results.json" in capsys.readouterr().err
    assert (
        main(
            [
                *argv[:2],
                "--tasks",
                TASK,
                "--include-path",
                str(task_folder),
                "--output-path",
                str(out),
                "--overwrite",
                "--limit",
                "1",
            ]
        )
        == 0
    )


def test_eval_command_refuses_what_cannot_work_before_loading(lm_eval, tmp_path, arm, task_folder, capsys):
    cases = [
        (
            ["--tasks", "no_such_task_anywhere", "--include-path", str(task_folder)],
            "unknown task no_such_task_anywhere",
        ),
        (["--tasks", TASK, "--include-path", str(tmp_path / "none")], "no such folder"),
        (["--tasks", TASK, "--include-path", str(task_folder), "--subfolder", "a", "b"], "--subfolder"),
    ]
    for extra, message in cases:
        assert main(["eval", str(arm), *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert main(["eval", str(tmp_path / "missing"), "--tasks", TASK, "--include-path", str(task_folder)]) == 2
    assert "missing does not exist" in capsys.readouterr().err


def test_eval_without_the_harness_says_what_to_install(monkeypatch):
    from gated_qwen.tools import evaluation

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval now raises ImportError
    with pytest.raises(GatedQwenError, match=r"pip install 'gated-qwen\[eval\]'"):
        evaluation.task_manager(None, ["hellaswag"])


def test_table_puts_each_arm_in_a_column():
    from gated_qwen.tools.evaluation import format_table

    results = {
        "baseline": {
            "results": {
                "hellaswag": {
                    "alias": "hellaswag",
                    "sample_len": 10042,
                    "acc,none": 0.41,
                    "acc_stderr,none": 0.005,
                    "acc_norm,none": 0.52,
                }
            },
            "n-shot": {"hellaswag": 0},
        },
        "headwise": {
            "results": {"hellaswag": {"acc,none": 0.43, "acc_stderr,none": 0.005}},
            "n-shot": {"hellaswag": 0},
        },
    }
    lines = format_table(results).splitlines()
    assert lines[2] == "| hellaswag | acc | 0 | 0.4100 ± 0.0050 | 0.4300 ± 0.0050 |"
    assert lines[3] == "| hellaswag | acc_norm | 0 | 0.5200 | - |"
    assert len(lines) == 4  # counts and aliases are not metrics
