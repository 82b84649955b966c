"""Training: loss goes down, resume equals an uninterrupted run, data order, errors; the shipped models;
continuing a checkpoint (--init-from), with only the gate rows trainable or at their own learning rate."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from conftest import write_released_arm, write_released_checkpoint, write_tiny_tokenizer, write_training_corpus
from transformers import GenerationConfig

from gated_qwen import Qwen3GatedForCausalLM, convert_checkpoint, convert_qwen3_to_gated
from gated_qwen.cli import main
from gated_qwen.default_models import default_model_path
from gated_qwen.models.layout import split_query_and_gate
from gated_qwen.tools.training import (
    TrainingError,
    TrainRunArguments,
    evaluate,
    heldout_rows,
    load_initial_model,
    pack_documents,
    read_documents,
    train,
    unigram_perplexity,
)


TINY_CONFIG = str(Path(__file__).parents[2] / "configs" / "tiny_headwise.json")


@pytest.fixture
def corpus(tmp_path):
    return write_training_corpus(tmp_path / "corpus.jsonl")


def tiny_args(corpus: Path, out: Path, **overrides) -> TrainRunArguments:
    values = {
        "train_file": str(corpus),
        "heldout_file": str(corpus),
        "output_dir": str(out),
        "config": TINY_CONFIG,
        "gate": "headwise",
        "vocab_size": 300,
        "seq_len": 32,
        "batch_size": 4,
        "max_steps": 12,
        "learning_rate": 3e-3,
        "warmup_steps": 2,
        "eval_every": 4,
        "eval_rows": 8,
        "seed": 0,
        "threads": 1,
        "progress": False,
    }
    return TrainRunArguments(**{**values, **overrides})


def read_log(folder: Path) -> list[dict]:
    return list(csv.DictReader((folder / "log.csv").open()))


def test_a_few_steps_lower_the_heldout_loss(corpus, tmp_path):
    summary = train(tiny_args(corpus, tmp_path / "run"))
    log = read_log(tmp_path / "run")
    first, last = float(log[0]["heldout_loss"]), float(log[-1]["heldout_loss"])
    assert log[0]["step"] == "0" and log[-1]["step"] == "12"
    assert last < first - 0.5, (first, last)
    assert summary["tokens"] == 12 * 4 * 32
    # the loss spikes (reporting.LossSpikes), in the summary returned and written
    assert summary["loss_spikes"] == len(summary["loss_spike_steps"])
    written_summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written_summary["loss_spike_steps"] == summary["loss_spike_steps"]
    reloaded = Qwen3GatedForCausalLM.from_pretrained(tmp_path / "run" / "final")
    assert reloaded.config.gate_type == "headwise"
    # trained from scratch: the trainer's sampling defaults
    written = GenerationConfig.from_pretrained(tmp_path / "run" / "final")
    assert (written.do_sample, written.temperature, written.top_k, written.max_new_tokens) == (True, 0.8, 50, 64)


def test_resume_continues_at_the_same_step_with_the_same_losses(corpus, tmp_path):
    train(tiny_args(corpus, tmp_path / "whole", max_steps=6, save_every=3))
    train(
        tiny_args(corpus, tmp_path / "resumed", max_steps=6, save_every=3), resume=tmp_path / "whole" / "checkpoint-3"
    )
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


def test_unigram_perplexity_is_the_smoothed_frequency():
    train_stream = torch.tensor([0, 0, 0, 1])  # add-one counts 4, 2, 1 over vocab 3
    rows = torch.tensor([[2, 0, 1]])  # targets 0 and 1
    expected = torch.tensor([4 / 7, 2 / 7]).log().mean().neg().exp().item()
    assert unigram_perplexity(train_stream, rows, vocab_size=3)["ppl"] == pytest.approx(expected)


def test_cli_reports_a_missing_train_file(tmp_path, capsys):
    status = main(
        ["train", "--train-file", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o"), "--max-steps", "1"]
    )
    assert status == 2
    assert "nope.jsonl does not exist" in capsys.readouterr().err


def test_cli_reports_a_malformed_corpus_line(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\nnot json\n')
    status = main(
        ["train", "--train-file", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "o"), "--max-steps", "1"]
    )
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


# ----------------------------------------------------------------------------------------------
# Continuing a checkpoint: --init-from, --gate/--init conversion, --trainable, --gate-lr-scale


def write_stock_checkpoint(folder: Path, attention_bias: bool = False, tokenizer: bool = True, seed: int = 0) -> Path:
    """A stock transformers Qwen3ForCausalLM saved with save_pretrained, with the tiny tokenizer beside it."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=320,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        attention_bias=attention_bias,
        tie_word_embeddings=False,
    )
    Qwen3ForCausalLM(config).save_pretrained(folder)
    if tokenizer:
        write_tiny_tokenizer(folder)
    return folder


def continue_args(corpus: Path, out: Path, source: Path, **overrides) -> TrainRunArguments:
    """tiny_args for continuing ``source``: its architecture and tokenizer, not a config or a trained BPE."""
    return tiny_args(
        corpus, out, **{"config": None, "gate": None, "vocab_size": None, "init_from": str(source), **overrides}
    )


def load(folder: Path) -> Qwen3GatedForCausalLM:
    return Qwen3GatedForCausalLM.from_pretrained(folder, dtype=torch.float32)


def split_rows(model, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(query rows, gate rows) of a q_proj weight or bias of ``model``."""
    config = model.config
    gate_dim = {"headwise": 1, "elementwise": config.head_dim}[config.gate_type]
    return split_query_and_gate(tensor, config.num_key_value_heads, config.head_dim, gate_dim, dim=0)


def test_init_from_starts_exactly_at_the_sources_loss(corpus, tmp_path):
    stock = write_stock_checkpoint(tmp_path / "stock")
    GenerationConfig(do_sample=True, temperature=0.3, top_p=0.5, max_new_tokens=7).save_pretrained(stock)
    convert_checkpoint(stock, tmp_path / "converted", gate="headwise", progress=False)
    runs = {
        "stock": continue_args(corpus, tmp_path / "stock_run", stock, max_steps=2),
        "converted on the fly": continue_args(corpus, tmp_path / "fly_run", stock, max_steps=2, gate="headwise"),
        "converted on disk": continue_args(corpus, tmp_path / "disk_run", tmp_path / "converted", max_steps=2),
    }
    for args in runs.values():
        train(args)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(stock)
    rows = heldout_rows(pack_documents(read_documents(corpus), tokenizer), 32, 8)
    source_loss = evaluate(load(stock), rows)["loss"]
    # the model the trainer starts from, converted on the fly, scores exactly what its source does
    assert evaluate(load_initial_model(runs["converted on the fly"]), rows)["loss"] == source_loss
    logs = {name: read_log(Path(args.output_dir)) for name, args in runs.items()}
    for name, log in logs.items():
        assert log[0]["step"] == "0" and log[0]["heldout_loss"] == f"{source_loss:.5f}", name
        # step 1's train loss is the starting model's, on the same first batch in every run
        assert log[1]["train_loss"] == logs["stock"][1]["train_loss"], name
        final = Path(runs[name].output_dir) / "final"
        assert load(final).config.gate_type == ("none" if name == "stock" else "headwise")
        # the checkpoint's tokenizer and generation config are kept, not a new tokenizer and the trainer's defaults
        assert AutoTokenizer.from_pretrained(final).get_vocab() == tokenizer.get_vocab(), name
        kept = GenerationConfig.from_pretrained(final)
        assert (kept.temperature, kept.top_p, kept.max_new_tokens) == (0.3, 0.5, 7), name


@pytest.mark.slow
def test_init_from_the_released_baseline_arm_as_downloaded(corpus, tmp_path):
    """pytorch_model.bin, model_type "qwen2", Qwen's tokenizer without a pad token; converted on the fly.
    (A released gated arm continued as it is: test_trainable_gate_changes_the_gate_rows_and_nothing_else.)"""
    from transformers import AutoTokenizer

    arm = tmp_path / "1B_baseline"
    write_released_arm(arm, gate="none")
    args = continue_args(
        corpus,
        tmp_path / "run",
        arm,
        max_steps=2,
        batch_size=2,
        seq_len=16,
        eval_rows=2,
        gate="headwise",
        trainable="gate",
    )
    summary = train(args)
    final = Path(args.output_dir) / "final"
    assert summary["gate"] == load(final).config.gate_type == "headwise"
    tokenizer = AutoTokenizer.from_pretrained(arm)
    assert AutoTokenizer.from_pretrained(final).get_vocab() == tokenizer.get_vocab()
    rows = heldout_rows(pack_documents(read_documents(corpus), tokenizer), 16, 2)
    assert read_log(Path(args.output_dir))[0]["heldout_loss"] == f"{evaluate(load(arm), rows)['loss']:.5f}"


@pytest.mark.parametrize("source_kind", ["released gated arm", "stock converted on the fly"])
def test_trainable_gate_changes_the_gate_rows_and_nothing_else(corpus, tmp_path, released_checkpoint, source_kind):
    if source_kind == "released gated arm":
        source, _ = released_checkpoint(gate="headwise", qkv_bias=True, vocab_size=320)
        write_tiny_tokenizer(source)
        start = load(source)
        args = continue_args(corpus, tmp_path / "run", source, trainable="gate")
    else:
        source = write_stock_checkpoint(tmp_path / "stock", attention_bias=True)
        start = convert_qwen3_to_gated(load(source), gate="headwise")
        args = continue_args(corpus, tmp_path / "run", source, trainable="gate", gate="headwise")
    before = {name: tensor.clone() for name, tensor in start.state_dict().items()}
    # weight decay and several steps: a frozen value that an optimizer held would move
    summary = train(dataclasses.replace(args, max_steps=4, weight_decay=0.1, learning_rate=1e-2))
    after = load(Path(args.output_dir) / "final")
    assert summary["trainable_parameters"] == 2 * (4 * 32 + 4)  # 2 layers x 4 heads x (32 inputs + bias)

    changed = 0
    assert after.state_dict().keys() == before.keys()
    for name, tensor in after.state_dict().items():
        if ".self_attn.q_proj." in name:
            query_before, gate_before = split_rows(after, before[name])
            query_after, gate_after = split_rows(after, tensor)
            assert torch.equal(query_after, query_before), name
            assert not torch.equal(gate_after, gate_before), name
            changed += 1
        else:
            assert torch.equal(tensor, before[name]), name
    assert changed == 4  # weight and bias of both layers


def test_gate_lr_scale_scales_the_gate_rows_update_only(corpus, tmp_path, released_checkpoint):
    source, _ = released_checkpoint(gate="headwise", qkv_bias=True, vocab_size=320)
    write_tiny_tokenizer(source)
    before = load(source).state_dict()
    finals, logged_lr = {}, set()
    for scale in (1.0, 8.0):
        args = continue_args(
            corpus, tmp_path / f"scale{scale}", source, max_steps=1, warmup_steps=0, gate_lr_scale=scale
        )
        train(args)
        finals[scale] = load(Path(args.output_dir) / "final").state_dict()
        logged_lr.add(read_log(Path(args.output_dir))[1]["lr"])
    assert len(logged_lr) == 1  # the log shows the base rate, whatever the gate rows' scale
    model = load(source)
    for name, tensor in before.items():
        if ".self_attn.q_proj." not in name:
            assert torch.equal(finals[1.0][name], finals[8.0][name]), name
            continue
        (query, gate), (query_1, gate_1), (query_8, gate_8) = (
            split_rows(model, t) for t in (tensor, finals[1.0][name], finals[8.0][name])
        )
        assert torch.equal(query_1, query_8), name
        # AdamW's step (its Adam part and its decay) is linear in the learning rate
        assert not torch.equal(gate_1, gate)
        torch.testing.assert_close(gate_8 - gate, 8 * (gate_1 - gate), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(
    "options",
    [{"gate": "headwise", "gate_init": "random"}, {"gate": "headwise", "trainable": "gate", "gate_lr_scale": 5.0}],
)
def test_resume_with_init_from_equals_an_uninterrupted_run(corpus, tmp_path, options):
    stock = write_stock_checkpoint(tmp_path / "stock")
    whole = continue_args(corpus, tmp_path / "whole", stock, max_steps=6, save_every=3, **options)
    train(whole)
    train(dataclasses.replace(whole, output_dir=str(tmp_path / "resumed")), resume=tmp_path / "whole" / "checkpoint-3")
    logs = read_log(tmp_path / "whole"), read_log(tmp_path / "resumed")
    assert [row["step"] for row in logs[1]] == ["4", "5", "6"]
    assert [row["train_loss"] for row in logs[1]] == [row["train_loss"] for row in logs[0][-3:]]
    finals = [load(tmp_path / run / "final").state_dict() for run in ("whole", "resumed")]
    assert all(torch.equal(finals[0][name], finals[1][name]) for name in finals[0])


def test_a_random_gate_init_is_drawn_again_from_the_seed(tmp_path):
    stock = write_stock_checkpoint(tmp_path / "stock")
    args = TrainRunArguments(
        train_file="unused",
        output_dir="unused",
        max_steps=1,
        init_from=str(stock),
        gate="headwise",
        gate_init="random",
    )
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    first, again = (load_initial_model(args).state_dict()[q_proj] for _ in range(2))
    other = load_initial_model(dataclasses.replace(args, seed=1)).state_dict()[q_proj]
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_resume_refuses_a_different_trainable(corpus, tmp_path):
    stock = write_stock_checkpoint(tmp_path / "stock")
    train(continue_args(corpus, tmp_path / "run", stock, max_steps=1, gate="headwise"))
    with pytest.raises(TrainingError, match="trainable"):
        train(
            continue_args(corpus, tmp_path / "other", stock, max_steps=1, gate="headwise", trainable="gate"),
            resume=tmp_path / "run",
        )


BAD_COMBINATIONS = {
    "--gate on a gated checkpoint": (["--init-from", "{gated}", "--gate", "headwise"], "already has a headwise gate"),
    "--gate none with --init-from": (["--init-from", "{stock}", "--gate", "none"], "'none' converts nothing"),
    "--trainable gate without a gate": (
        ["--init-from", "{stock}", "--trainable", "gate"],
        "has no gate, so --trainable gate would train nothing",
    ),
    "--gate-lr-scale without a gate": (
        ["--init-from", "{stock}", "--gate-lr-scale", "4"],
        "has no gate, so --gate-lr-scale",
    ),
    "--gate-lr-scale from scratch without a gate": (
        ["--gate", "none", "--gate-lr-scale", "4"],
        "the model has no gate",
    ),
    "--gate-lr-scale not positive": (
        ["--init-from", "{gated}", "--gate-lr-scale", "0"],
        "--gate-lr-scale must be a positive number",
    ),
    "--init without --gate": (["--init-from", "{stock}", "--init", "random"], "--init says how --gate converts"),
    "--init without --init-from": (["--gate", "headwise", "--init", "identity"], "--init says how --gate converts"),
    "--config with --init-from": (
        ["--init-from", "{stock}", "--config", TINY_CONFIG],
        "--config does not apply with --init-from",
    ),
    "--vocab-size with --init-from": (
        ["--init-from", "{stock}", "--vocab-size", "300"],
        "--vocab-size does not apply with --init-from",
    ),
    "--tokenizer with --init-from": (
        ["--init-from", "{stock}", "--tokenizer", "{stock}"],
        "--tokenizer does not apply with --init-from",
    ),
    "--trainable gate from scratch": (
        ["--trainable", "gate"],
        "--trainable gate trains only the gate of a pretrained model",
    ),
    "--subfolder without --init-from": (["--subfolder", "arm"], "--subfolder applies to the --init-from checkpoint"),
    "a missing checkpoint": (["--init-from", "{missing}"], "does not exist"),
    "a checkpoint without a tokenizer": (["--init-from", "{bare}"], "has no tokenizer files"),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A released gated arm, a stock Qwen3, one without tokenizer files, and a path that does not exist."""
    folder = tmp_path_factory.mktemp("checkpoints")
    write_released_checkpoint(folder / "gated", gate="headwise", vocab_size=320)
    write_tiny_tokenizer(folder / "gated")
    return {
        "gated": folder / "gated",
        "stock": write_stock_checkpoint(folder / "stock"),
        "bare": write_stock_checkpoint(folder / "bare", tokenizer=False),
        "missing": folder / "missing",
    }


@pytest.mark.parametrize("case", list(BAD_COMBINATIONS))
def test_cli_refuses_a_bad_combination_in_one_line(corpus, tmp_path, checkpoints, capsys, case):
    capsys.readouterr()  # the fixture's own output
    extra, fragment = BAD_COMBINATIONS[case]
    out = tmp_path / "out"
    argv = ["train", "--train-file", str(corpus), "--out", str(out), "--max-steps", "1", "--threads", "1"]
    status = main(argv + [arg.format(**{k: str(v) for k, v in checkpoints.items()}) for arg in extra])
    captured = capsys.readouterr()
    assert status == 2
    assert "Traceback" not in captured.err and not captured.out
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gated-qwen train: error:"), captured.err
    assert fragment in lines[0], lines[0]
    assert not out.exists()  # refused before anything was written


# ---------------------------------------------------------------------------------------------- writing and resuming safely


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 4-step run with a checkpoint at step 2 and at the end: (corpus, run folder, its summary)."""
    root = tmp_path_factory.mktemp("finished")
    corpus = write_training_corpus(root / "corpus.jsonl")
    summary = train(tiny_args(corpus, root / "run", max_steps=4, save_every=2))
    return corpus, root / "run", summary


def cli_train(corpus: Path, out: Path, *extra: str) -> list[str]:
    """The command line of tiny_args(corpus, out, max_steps=4, save_every=2)."""
    return [
        "train",
        "--train-file",
        str(corpus),
        "--heldout-file",
        str(corpus),
        "--out",
        str(out),
        "--config",
        TINY_CONFIG,
        "--gate",
        "headwise",
        "--vocab-size",
        "300",
        "--seq-len",
        "32",
        "--batch-size",
        "4",
        "--max-steps",
        "4",
        "--lr",
        "3e-3",
        "--warmup-steps",
        "2",
        "--eval-every",
        "4",
        "--eval-rows",
        "8",
        "--save-every",
        "2",
        "--threads",
        "1",
        "--no-progress",
        *extra,
    ]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_one_line(err: str, *parts: str) -> None:
    assert err.startswith("gated-qwen train: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for part in parts:
        assert part in err, (part, err)


def test_empty_training_text_writes_nothing_and_a_rerun_works(corpus, tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    out = tmp_path / "run"
    args = [
        "train",
        "--train-file",
        str(tmp_path / "empty.txt"),
        "--out",
        str(out),
        "--config",
        TINY_CONFIG,
        "--vocab-size",
        "300",
        "--seq-len",
        "32",
        "--batch-size",
        "4",
        "--max-steps",
        "1",
        "--no-progress",
    ]
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
        ("optimizer.pt", "truncate", "optimizer.pt is damaged or truncated"),
        ("trainer_state.json", "truncate", "trainer_state.json is not readable JSON"),
        ("run_state.json", "truncate", "run_state.json is not readable JSON"),
        ("rng_state.pth", "delete", "has no rng_state.pth"),
    ],
)
def test_resume_from_a_damaged_checkpoint_names_the_file_and_writes_nothing(
    finished_run, tmp_path, capsys, damaged, damage, message
):
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
    assert_one_line(
        capsys.readouterr().err,
        str(path) if damage == "truncate" else message,
        message,
        f"resume from {copy / 'checkpoint-2'} instead",
    )
    assert main(cli_train(corpus, copy, "--resume", str(copy))) == 2  # resumed into its own folder
    assert snapshot(copy) == before and not (tmp_path / "elsewhere").exists()


def test_a_pickle_payload_in_optimizer_pt_never_runs(finished_run, tmp_path, capsys):
    import shutil

    corpus, run, _ = finished_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    marker = tmp_path / "payload-ran"

    class Payload:  # unpickling calls open(marker, "w"): the file appears if the pickle is ever run
        def __reduce__(self):
            return (open, (str(marker), "w"))

    state = torch.load(copy / "checkpoint-4" / "optimizer.pt", weights_only=True)
    state["payload"] = Payload()
    torch.save(state, copy / "checkpoint-4" / "optimizer.pt")
    before = snapshot(copy)
    assert main(cli_train(corpus, copy, "--resume", str(copy))) == 2
    assert_one_line(capsys.readouterr().err, "optimizer.pt holds more than plain tensors", "it was not loaded")
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
    assert (
        again == json.loads((copy / "summary.json").read_text())
        and again["final_train_loss"] == summary["final_train_loss"]
    )
    assert snapshot(copy) == before  # nothing rewritten

    # killed after its last checkpoint, before summary.json: resuming finishes it with the same results
    (copy / "summary.json").unlink()
    shutil.rmtree(copy / "final")
    done = train(tiny_args(corpus, copy, max_steps=4, save_every=2), resume=copy)
    ignore = {"elapsed_s", "model"}
    assert {k: v for k, v in done.items() if k not in ignore} == {k: v for k, v in summary.items() if k not in ignore}
    assert (copy / "final" / "model.safetensors").read_bytes() == (run / "final" / "model.safetensors").read_bytes()


def test_a_run_finishes_from_a_checkpoint_whose_weights_are_sharded(finished_run, tmp_path):
    """save_pretrained shards a model above its max_shard_size (an index and several files): such a checkpoint is
    read as a whole one; one with no weights at all (FSDP's sharded state) is refused in one line."""
    import shutil

    from huggingface_hub import save_torch_state_dict
    from safetensors.torch import load_file

    corpus, run, summary = finished_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "summary.json").unlink()
    shutil.rmtree(copy / "final")
    weights = copy / "checkpoint-4" / "model.safetensors"
    save_torch_state_dict(load_file(weights), weights.parent, max_shard_size=20_000)
    weights.unlink(missing_ok=True)  # save_torch_state_dict removes the single file itself
    assert len(list(weights.parent.glob("model-*.safetensors"))) > 1
    done = train(tiny_args(corpus, copy, max_steps=4, save_every=2), resume=copy)
    assert done["final_train_loss"] == summary["final_train_loss"] and done["heldout"] == summary["heldout"]
    assert (copy / "final" / "model.safetensors").read_bytes() == (run / "final" / "model.safetensors").read_bytes()

    shutil.rmtree(copy / "final")
    (copy / "summary.json").unlink()
    for shard in weights.parent.glob("model*.safetensors*"):
        shard.unlink()
    with pytest.raises(TrainingError, match="has no model.safetensors \\(nor its index\\).*FULL_STATE_DICT"):
        train(tiny_args(corpus, copy, max_steps=4, save_every=2), resume=copy / "checkpoint-4")
    assert not (copy / "final").exists()


def test_a_checkpoint_a_killed_run_did_not_finish_is_not_resumed_from(finished_run, tmp_path):
    """Trainer writes checkpoint-STEP/ in place; run_state.json comes last, so a folder without it is unfinished."""
    import shutil

    corpus, run, summary = finished_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "checkpoint-4" / "run_state.json").unlink()  # killed while writing checkpoint-4
    (copy / "checkpoint-4" / "optimizer.pt").write_bytes(b"half")
    shutil.rmtree(copy / "final")
    (copy / "summary.json").unlink()
    done = train(tiny_args(corpus, copy, max_steps=4, save_every=2), resume=copy)  # from checkpoint-2
    assert done["final_train_loss"] == summary["final_train_loss"] and done["heldout"] == summary["heldout"]
    assert (copy / "checkpoint-4" / "run_state.json").is_file()
    assert (copy / "final" / "model.safetensors").read_bytes() == (run / "final" / "model.safetensors").read_bytes()


@pytest.mark.parametrize(
    "row",
    [
        {"gate": "elementwise", "gate_activation": "identity", "gate_combination": "additive"},
        {"gate": "elementwise", "gate_activation": "ns_sigmoid"},
        {"gate": "elementwise", "gate_input": "none"},
        {"gate": "none", "attn_output_transform": "silu"},
        {"gate": "none", "attn_output_transform": "rmsnorm"},
        {"gate": "none", "sandwich_norm": True},
    ],
    ids=["additive-identity", "ns-sigmoid", "input-independent", "sdpa-silu", "sdpa-rmsnorm", "sandwich-norm"],
)
def test_each_paper_row_trains_and_reloads(corpus, tmp_path, row):
    summary = train(tiny_args(corpus, tmp_path / "run", max_steps=6, eval_every=6, **row))
    log = read_log(tmp_path / "run")
    assert float(log[-1]["heldout_loss"]) < float(log[0]["heldout_loss"]) and summary["tokens"] == 6 * 4 * 32
    config = Qwen3GatedForCausalLM.from_pretrained(tmp_path / "run" / "final").config
    assert config.gate_type == row["gate"]
    assert all(getattr(config, key) == value for key, value in row.items() if key != "gate")
