"""Training: loss goes down, resume equals an uninterrupted run, data order, errors; the shipped models."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from gated_qwen import Qwen3GatedForCausalLM
from gated_qwen.cli import main
from gated_qwen.default_models import default_model_path
from gated_qwen.training import (
    PackedBatches,
    TrainingArguments,
    TrainingError,
    evaluate,
    train,
    unigram_perplexity,
)

from conftest import TOKENIZER_TEXT

TINY_CONFIG = str(Path(__file__).parents[1] / "configs" / "tiny_headwise.json")


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    with path.open("w") as f:
        for i in range(12):
            for text in TOKENIZER_TEXT:
                f.write(json.dumps({"text": f"{i}: {text}"}) + "\n")
    return path


def tiny_args(corpus: Path, out: Path, **overrides) -> TrainingArguments:
    values = dict(
        train_file=str(corpus), heldout_file=str(corpus), output_dir=str(out), config=TINY_CONFIG, gate="headwise",
        vocab_size=300, seq_len=32, batch_size=4, max_steps=12, learning_rate=3e-3, warmup_steps=2,
        eval_every=4, eval_rows=8, seed=0, threads=1, progress=False,
    )
    return TrainingArguments(**{**values, **overrides})


def read_log(folder: Path) -> list[dict]:
    return list(csv.DictReader((folder / "log.csv").open()))


def test_a_few_steps_lower_the_heldout_loss(corpus, tmp_path):
    summary = train(tiny_args(corpus, tmp_path / "run"))
    log = read_log(tmp_path / "run")
    first, last = float(log[0]["heldout_loss"]), float(log[-1]["heldout_loss"])
    assert log[0]["step"] == "0" and log[-1]["step"] == "12"
    assert last < first - 0.5, (first, last)
    assert summary["tokens"] == 12 * 4 * 32
    reloaded = Qwen3GatedForCausalLM.from_pretrained(tmp_path / "run" / "final")
    assert reloaded.config.gate_type == "headwise"


def test_resume_continues_at_the_same_step_with_the_same_losses(corpus, tmp_path):
    train(tiny_args(corpus, tmp_path / "whole", max_steps=6, save_every=3))
    train(tiny_args(corpus, tmp_path / "resumed", max_steps=6, save_every=3), resume=tmp_path / "whole" / "checkpoint-3")
    whole, resumed = read_log(tmp_path / "whole"), read_log(tmp_path / "resumed")
    assert [row["step"] for row in resumed] == ["4", "5", "6"]
    assert [row["train_loss"] for row in resumed] == [row["train_loss"] for row in whole[-3:]]
    assert resumed[-1]["heldout_loss"] == whole[-1]["heldout_loss"]


def test_resume_refuses_a_different_seed(corpus, tmp_path):
    train(tiny_args(corpus, tmp_path / "run", max_steps=2))
    with pytest.raises(TrainingError, match="seed"):
        train(tiny_args(corpus, tmp_path / "other", max_steps=2, seed=1), resume=tmp_path / "run")


def test_a_non_empty_output_folder_is_not_overwritten(corpus, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("mine")
    with pytest.raises(TrainingError, match="not empty"):
        train(tiny_args(corpus, tmp_path / "run", max_steps=1))
    assert (tmp_path / "run" / "keep.txt").read_text() == "mine"


def test_batches_depend_only_on_seed_and_step_and_cover_each_epoch():
    stream = torch.arange(60)
    data = PackedBatches(stream, seq_len=3, global_batch=4, seed=7)  # 20 rows, 5 steps per epoch
    again = PackedBatches(stream, seq_len=3, global_batch=4, seed=7)
    assert torch.equal(data.batch(6), again.batch(6))
    first_epoch = torch.cat([data.batch(step) for step in range(5)])
    assert sorted(first_epoch[:, 0].tolist()) == list(range(0, 60, 3))
    assert not torch.equal(data.batch(0), PackedBatches(stream, seq_len=3, global_batch=4, seed=8).batch(0))


def test_unigram_perplexity_is_the_smoothed_frequency():
    train_stream = torch.tensor([0, 0, 0, 1])  # add-one counts 4, 2, 1 over vocab 3
    rows = torch.tensor([[2, 0, 1]])  # targets 0 and 1
    expected = torch.tensor([4 / 7, 2 / 7]).log().mean().neg().exp().item()
    assert unigram_perplexity(train_stream, rows, vocab_size=3)["ppl"] == pytest.approx(expected)


def test_cli_reports_a_missing_train_file(tmp_path, capsys):
    status = main(["train", "--train-file", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o"), "--max-steps", "1"])
    assert status == 2
    assert "nope.jsonl does not exist" in capsys.readouterr().err


def test_cli_reports_a_malformed_corpus_line(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\nnot json\n')
    status = main(["train", "--train-file", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "o"), "--max-steps", "1"])
    assert status == 2
    assert "bad.jsonl:2" in capsys.readouterr().err


@pytest.mark.parametrize("arm", ["headwise", "baseline"])
def test_shipped_model_loads_generates_and_matches_its_card(arm):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = default_model_path(arm)
    assert folder is not None, f"gated_qwen/default_models/{arm} is missing"
    card = json.loads((folder / "eval.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert isinstance(model, Qwen3GatedForCausalLM)
    assert model.config.gate_type == card["gate"] == ("headwise" if arm == "headwise" else "none")

    rows = torch.tensor(json.loads((folder / "heldout_slice.json").read_text())["input_ids"])
    measured = evaluate(model, rows)
    assert measured["tokens"] == card["heldout_slice"]["tokens"]
    assert measured["loss"] == pytest.approx(card["heldout_slice"]["loss"], abs=2e-3)
    assert card["heldout"]["ppl"] < card["unigram"]["ppl"] / 5  # far better than context-free guessing

    prompt = tokenizer("def read_config(path):", return_tensors="pt").input_ids
    output = model.generate(prompt, do_sample=False, max_new_tokens=8)
    assert output.shape[1] > prompt.shape[1]
    assert tokenizer.decode(output[0]).startswith("def read_config(path):")


def test_the_default_model_is_the_headwise_arm_and_the_pair_is_small():
    assert default_model_path() == default_model_path("headwise")
    shipped = [p for arm in ("headwise", "baseline") for p in default_model_path(arm).iterdir()]
    assert sum(p.stat().st_size for p in shipped) < 30 * 2**20


# ---------------------------------------------------------------------------------------------- writing and resuming safely


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 4-step run with a checkpoint at step 2 and at the end: (corpus, run folder, its summary)."""
    root = tmp_path_factory.mktemp("finished")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"{i}: {text}"}) + "\n" for i in range(12) for text in TOKENIZER_TEXT))
    summary = train(tiny_args(corpus, root / "run", max_steps=4, save_every=2))
    return corpus, root / "run", summary


def cli_train(corpus: Path, out: Path, *extra: str) -> list[str]:
    """The command line of tiny_args(corpus, out, max_steps=4, save_every=2)."""
    return ["train", "--train-file", str(corpus), "--heldout-file", str(corpus), "--out", str(out), "--config", TINY_CONFIG,
            "--gate", "headwise", "--vocab-size", "300", "--seq-len", "32", "--batch-size", "4", "--max-steps", "4",
            "--lr", "3e-3", "--warmup-steps", "2", "--eval-every", "4", "--eval-rows", "8", "--save-every", "2",
            "--threads", "1", "--no-progress", *extra]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_one_line(err: str, *parts: str) -> None:
    assert err.startswith("gated-qwen train: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for part in parts:
        assert part in err, (part, err)


def test_empty_training_text_writes_nothing_and_a_rerun_works(corpus, tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    out = tmp_path / "run"
    args = ["train", "--train-file", str(tmp_path / "empty.txt"), "--out", str(out), "--config", TINY_CONFIG,
            "--vocab-size", "300", "--seq-len", "32", "--batch-size", "4", "--max-steps", "1", "--no-progress"]
    assert main(args) == 2
    assert_one_line(capsys.readouterr().err, "fewer than one batch")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "empty.txt"]
    args[2] = str(corpus)
    assert main(args) == 0  # the same --out, now with text: not refused as "not empty"
    assert (out / "final" / "model.safetensors").is_file() and (out / "summary.json").is_file()


@pytest.mark.parametrize(
    "damaged, damage, message",
    [
        ("model.safetensors", "truncate", "model.safetensors is damaged or truncated"),
        ("optimizer.bin", "truncate", "optimizer.bin is damaged or truncated"),
        ("trainer_state.json", "truncate", "trainer_state.json is not readable JSON"),
        ("random_states_0.pkl", "delete", "has no random_states_0.pkl"),
    ],
)
def test_resume_from_a_damaged_checkpoint_names_the_file_and_writes_nothing(finished_run, tmp_path, capsys, damaged, damage, message):
    import shutil

    corpus, run, _ = finished_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    path = copy / "checkpoint-4" / damaged
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.unlink()
    before = snapshot(copy)
    assert main(cli_train(corpus, tmp_path / "elsewhere", "--resume", str(copy))) == 2
    assert_one_line(capsys.readouterr().err, str(path) if damage == "truncate" else message, message,
                    f"resume from {copy / 'checkpoint-2'} instead")
    assert main(cli_train(corpus, copy, "--resume", str(copy))) == 2  # resumed into its own folder
    assert snapshot(copy) == before and not (tmp_path / "elsewhere").exists()


def test_a_pickle_payload_in_optimizer_bin_never_runs(finished_run, tmp_path, capsys):
    import shutil

    corpus, run, _ = finished_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    marker = tmp_path / "payload-ran"

    class Payload:  # unpickling calls open(marker, "w"): the file appears if the pickle is ever run
        def __reduce__(self):
            return (open, (str(marker), "w"))

    state = torch.load(copy / "checkpoint-4" / "optimizer.bin", weights_only=True)
    state["payload"] = Payload()
    torch.save(state, copy / "checkpoint-4" / "optimizer.bin")
    before = snapshot(copy)
    assert main(cli_train(corpus, copy, "--resume", str(copy))) == 2
    assert_one_line(capsys.readouterr().err, "optimizer.bin holds more than plain tensors", "it was not loaded")
    assert not marker.exists()
    assert snapshot(copy) == before


def test_resuming_a_finished_run_keeps_its_results(finished_run, tmp_path):
    import shutil

    corpus, run, summary = finished_run
    assert summary["final_train_loss"] is not None and summary["heldout"] is not None
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    before = snapshot(copy)
    again = train(tiny_args(corpus, copy, max_steps=4, save_every=2), resume=copy)
    assert again == json.loads((copy / "summary.json").read_text()) and again["final_train_loss"] == summary["final_train_loss"]
    assert snapshot(copy) == before  # nothing rewritten

    # killed after its last checkpoint, before summary.json: resuming finishes it with the same results
    (copy / "summary.json").unlink()
    shutil.rmtree(copy / "final")
    done = train(tiny_args(corpus, copy, max_steps=4, save_every=2), resume=copy)
    ignore = {"elapsed_s", "model"}
    assert {k: v for k, v in done.items() if k not in ignore} == {k: v for k, v in summary.items() if k not in ignore}
    assert (copy / "final" / "model.safetensors").read_bytes() == (run / "final" / "model.safetensors").read_bytes()


def test_a_resumed_run_removes_the_checkpoint_a_killed_run_was_writing(finished_run, tmp_path):
    import shutil
    import subprocess
    import sys

    corpus, run, _ = finished_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "checkpoint-4")
    shutil.rmtree(copy / "final")
    (copy / "summary.json").unlink()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a process that is gone, as a killed run is
    from gated_qwen.outputs import _host_hash

    stale = copy / f".checkpoint-4.gated-qwen-{child.pid}-0-{_host_hash()}-abcdef.partial"
    shutil.copytree(run / "checkpoint-2", stale)
    train(tiny_args(corpus, copy, max_steps=4, save_every=2), resume=copy)
    assert not stale.exists()
    assert sorted(p.name for p in copy.iterdir()) == [
        "checkpoint-2", "checkpoint-4", "final", "log.csv", "loss.png", "summary.json", "tokenizer", "train_args.json"
    ]
