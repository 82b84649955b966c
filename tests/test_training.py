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
