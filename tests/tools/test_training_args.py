"""The train command's options: defined once (TrainRunArguments), every old flag still accepted; the gate
variant options reaching the config; the loss-spike detector and the summary keys it fills."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gated_qwen.cli import build_parser
from gated_qwen.cli.train import run_arguments
from gated_qwen.tools.training.arguments import RUN_DATA_KEYS, TrainRunArguments
from gated_qwen.tools.training.reporting import SPIKE_FACTOR, SPIKE_MIN_HISTORY, SPIKE_WINDOW, LossSpikes


def parse(*argv):
    return run_arguments(build_parser().parse_args(["train", *argv]))


def test_old_flags_are_aliases_of_the_field_names():
    old = parse(
        "--train-file", "t.jsonl", "--out", "o", "--max-steps", "3", "--lr", "0.5", "--init-from", "ckpt",
        "--subfolder", "sub", "--revision", "main", "--init", "random", "--gate", "headwise", "--no-progress",
        "--bf16",
    )  # fmt: skip
    new = parse(
        "--train-file", "t.jsonl", "--output-dir", "o", "--max-steps", "3", "--learning-rate", "0.5",
        "--init-from", "ckpt", "--init-from-subfolder", "sub", "--init-from-revision", "main", "--gate-init",
        "random", "--gate", "headwise", "--no-progress", "--precision", "bf16",
    )  # fmt: skip
    assert old == new
    assert (old.output_dir, old.learning_rate, old.init_from_subfolder, old.init_from_revision) == (
        "o",
        0.5,
        "sub",
        "main",
    )
    assert (old.gate_init, old.progress, old.precision) == ("random", False, "bf16")


def test_defaults_are_the_dataclass_defaults():
    parsed = parse("--dataset", "d", "--out", "o", "--max-tokens", "100")
    assert parsed == TrainRunArguments(train_file=None, dataset="d", output_dir="o", max_tokens=100)


def test_the_trainer_options_reach_trainer_under_their_own_names(tmp_path):
    """The fields marked trainer=True are transformers' TrainingArguments fields, passed as they are."""
    from transformers import TrainingArguments

    from gated_qwen.tools.training.trainer import _hf_arguments

    passed = [field.name for field in dataclasses.fields(TrainRunArguments) if field.metadata.get("trainer")]
    assert {"learning_rate", "seed", "gradient_accumulation_steps"} <= set(passed)
    assert set(passed) <= {field.name for field in dataclasses.fields(TrainingArguments)}
    args = TrainRunArguments(
        train_file="t.jsonl", output_dir=str(tmp_path), max_steps=3, learning_rate=0.25, weight_decay=0.5,
        max_grad_norm=2.0, gradient_accumulation_steps=3, seed=7,
    )  # fmt: skip
    hf = _hf_arguments(args, total_steps=3, num_processes=1)
    assert all(getattr(hf, name) == getattr(args, name) for name in passed if name not in ("report_to", "deepspeed"))
    assert hf.report_to == [] and hf.deepspeed is None  # "none" as transformers reads it; no DeepSpeed config
    assert hf.average_tokens_across_devices is False  # the mean of each process's packed rows is DDP's to average


@pytest.mark.parametrize(
    "argv",
    [
        ["--out", "o", "--max-steps", "1"],  # no data
        ["--train-file", "t", "--dataset", "d", "--out", "o", "--max-steps", "1"],  # both
        ["--train-file", "t", "--max-steps", "1"],  # no --out
        ["--train-file", "t", "--out", "o"],  # no budget
        ["--train-file", "t", "--out", "o", "--max-steps", "1", "--gate-position", "nowhere"],
    ],
)
def test_bad_command_lines_are_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exit:
        build_parser().parse_args(["train", *argv])
    assert exit.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_bounds_are_checked():
    with pytest.raises(Exception, match="--seq-len must be at least 1, not 0"):
        parse("--train-file", "t", "--out", "o", "--max-steps", "1", "--seq-len", "0")


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(TrainRunArguments) if "at_least" in f.metadata])
def test_bounds_are_checked_when_the_arguments_are_made_in_python(field):
    """train(TrainRunArguments(batch_size=0)) ran out of memory; every bounded count is refused when made."""
    from gated_qwen.tools.training.arguments import TrainingError

    bound = TrainRunArguments.__dataclass_fields__[field].metadata["at_least"]
    with pytest.raises(TrainingError, match=f"--{field.replace('_', '-')} must be at least {bound}, not {bound - 1}"):
        TrainRunArguments("t.jsonl", "o", **{"max_steps": 1, field: bound - 1})
    assert getattr(TrainRunArguments("t.jsonl", "o", **{"max_steps": 1, field: bound}), field) == bound


def test_old_train_args_json_loads():
    fields = {field.name for field in dataclasses.fields(TrainRunArguments)}
    old = json.loads(json.dumps(dataclasses.asdict(TrainRunArguments("t", "o", max_steps=1))))
    for key in ("gate_position", "gate_shared_across_heads", "gate_activation", "gate_combination"):
        old.pop(key)  # a run saved before the gate variant options
    assert set(old) <= fields
    assert TrainRunArguments(**old).gate_position == "sdpa_output"


def test_gate_variant_reaches_the_config(tmp_path):
    import json

    from gated_qwen.tools.training import model_init

    args = parse(
        "--train-file", "t", "--out", "o", "--max-steps", "1", "--gate", "headwise", "--gate-position", "value",
        "--gate-shared-across-heads", "--gate-activation", "silu", "--gate-combination", "additive",
    )  # fmt: skip
    assert {"gate_position", "gate_shared_across_heads", "gate_activation", "gate_combination"} <= set(RUN_DATA_KEYS)
    config = model_init._make_config(args, model_init._config_values(args))
    assert (config.gate_type, config.gate_position, config.gate_shared_across_heads) == ("headwise", "value", True)
    assert (config.gate_activation, config.gate_combination) == ("silu", "additive")
    # a config.json's gate keys stay where the options are left at their defaults; --gate decides the type
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"gate_position": "key", "elementwise_attn_output_gate": True}))
    args = parse("--train-file", "t", "--out", "o", "--max-steps", "1", "--gate", "headwise", "--config", str(path))
    config = model_init._make_config(args, model_init._config_values(args))
    assert (config.gate_type, config.gate_position) == ("headwise", "key")


def test_the_paper_rows_reach_the_config_with_or_without_a_gate():
    from gated_qwen.errors import GatedQwenError
    from gated_qwen.tools.training import model_init

    assert {"gate_input", "attn_output_transform", "sandwich_norm"} <= set(RUN_DATA_KEYS)
    args = parse(
        "--train-file", "t", "--out", "o", "--max-steps", "1", "--gate", "none", "--attn-output-transform", "rmsnorm",
        "--sandwich-norm",
    )  # fmt: skip
    model_init.check_arguments(args)
    config = model_init._make_config(args, model_init._config_values(args))
    assert (config.gate_type, config.attn_output_transform, config.sandwich_norm) == ("none", "rmsnorm", True)
    args = parse(
        "--train-file", "t", "--out", "o", "--max-steps", "1", "--gate", "elementwise", "--gate-input", "none",
        "--gate-activation", "ns_sigmoid",
    )  # fmt: skip
    config = model_init._make_config(args, model_init._config_values(args))
    assert (config.gate_type, config.gate_input, config.gate_activation) == ("elementwise", "none", "ns_sigmoid")
    args = parse("--train-file", "t", "--out", "o", "--max-steps", "1", "--gate", "none", "--gate-input", "none")
    with pytest.raises(GatedQwenError, match="gate_input='none' describe a gate, but gate_type is 'none'"):
        model_init._make_config(args, model_init._config_values(args))


def test_gate_variant_needs_gate():
    from gated_qwen.tools.training import TrainingError
    from gated_qwen.tools.training.model_init import check_arguments

    with pytest.raises(TrainingError, match="give --gate with them"):
        check_arguments(TrainRunArguments("t", "o", max_steps=1, gate_activation="silu"))
    check_arguments(TrainRunArguments("t", "o", max_steps=1, gate="headwise", gate_position="key"))


def test_init_from_converts_to_any_variant_exactly_and_trains_only_its_gate():
    import torch

    from gated_qwen.tools.training.groups import gate_parameter_groups
    from gated_qwen.tools.training.model_init import load_initial_model, read_init_config

    baseline = "gated_qwen/default_models/baseline"
    args = TrainRunArguments("t", "o", max_steps=1, init_from=baseline, gate="headwise", gate_position="value")
    assert (read_init_config(args).gate_type, read_init_config(args).gate_position) == ("headwise", "value")
    model = load_initial_model(args)
    from transformers import AutoModelForCausalLM

    stock = AutoModelForCausalLM.from_pretrained(baseline, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, stock(ids).logits)
    groups = gate_parameter_groups(model, lr=1e-3, trainable="gate")
    trained = [p for group in groups for p in group["params"]]
    assert trained and all(p is layer.self_attn.g_proj.weight for p, layer in zip(trained, model.model.layers))
    # no identity for a multiplying SiLU gate: refused before any weight is read
    silu = TrainRunArguments("t", "o", max_steps=1, init_from=baseline, gate="headwise", gate_activation="silu")
    with pytest.raises(Exception, match="no exact form"):
        read_init_config(silu)


def test_loss_spikes():
    assert (SPIKE_FACTOR, SPIKE_WINDOW, SPIKE_MIN_HISTORY) == (1.5, 50, 10)
    smooth = [3.0 - 0.01 * i for i in range(100)]
    detector = LossSpikes()
    assert not any(detector.add(step, loss) for step, loss in enumerate(smooth, 1))
    assert detector.summary() == {"loss_spikes": 0, "loss_spike_steps": []}

    losses = [2.0] * 60
    losses[4] = 10.0  # before 10 losses are known: not counted
    losses[30] = 3.1  # 1.55 x the median 2.0
    losses[40] = 2.9  # 1.45 x: not a spike
    losses[55] = 6.0
    detector = LossSpikes()
    flags = [detector.add(step, loss) for step, loss in enumerate(losses, 1)]
    assert detector.steps == [31, 56] and flags.count(True) == 2
    assert detector.summary() == {"loss_spikes": 2, "loss_spike_steps": [31, 56]}
    assert len(detector.history) == SPIKE_WINDOW

    # resumed with its history, it counts as if it had not stopped
    resumed = LossSpikes(losses[:50], [31])
    for step, loss in enumerate(losses[50:], 51):
        resumed.add(step, loss)
    assert resumed.steps == [31, 56]
