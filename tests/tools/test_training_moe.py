"""``train`` on Qwen3-MoE models (issue 23): --init-from a stock Qwen3-MoE converted on the fly (--gate, --init),
--trainable gate and --gate-lr-scale on an MoE, the router's auxiliary loss in the trained loss, and an MoE
config trained from scratch."""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import tiny_moe_config_dict, write_stock_moe_checkpoint, write_tiny_tokenizer, write_training_corpus
from transformers import AutoTokenizer, Qwen3MoeForCausalLM

from gated_qwen.models.layout import split_query_and_gate
from gated_qwen.models.qwen3_moe_gated.modeling_qwen3_moe_gated import Qwen3MoeGatedForCausalLM
from gated_qwen.tools.training import TrainRunArguments, load_initial_model, train
from gated_qwen.tools.training.data import PackedRows, load_documents
from gated_qwen.tools.training.reporting import evaluate
from gated_qwen.transforms.conversion import convert_qwen3_to_gated


@pytest.fixture
def corpus(tmp_path):
    return write_training_corpus(tmp_path / "corpus.jsonl")


@pytest.fixture(scope="module")
def stock_moe_source(tmp_path_factory) -> Path:
    """A tiny stock Qwen3-MoE (2 sparse layers, 4 experts, 2 per token) with the tiny tokenizer beside it."""
    return write_stock_moe_checkpoint(tmp_path_factory.mktemp("stock_moe_train"))


def moe_args(corpus: Path, out: Path, **overrides) -> TrainRunArguments:
    values = {
        "train_file": str(corpus),
        "heldout_file": str(corpus),
        "output_dir": str(out),
        "seq_len": 32,
        "batch_size": 4,
        "max_steps": 2,
        "learning_rate": 3e-3,
        "warmup_steps": 0,
        "eval_every": 2,
        "eval_rows": 8,
        "seed": 0,
        "threads": 1,
        "progress": False,
    }
    return TrainRunArguments(**{**values, **overrides})


def read_log(folder: Path) -> list[dict]:
    return list(csv.DictReader((folder / "log.csv").open()))


def load_stock(folder: Path) -> Qwen3MoeForCausalLM:
    return Qwen3MoeForCausalLM.from_pretrained(folder, dtype=torch.float32)


def load_gated(folder: Path) -> Qwen3MoeGatedForCausalLM:
    return Qwen3MoeGatedForCausalLM.from_pretrained(folder, dtype=torch.float32)


def heldout(args: TrainRunArguments, tokenizer) -> torch.Tensor:
    from gated_qwen.tools.training.data import read_heldout_rows

    return read_heldout_rows(args, tokenizer)


@pytest.mark.parametrize("gate, init", [("headwise", "identity"), ("elementwise", "random")])
def test_init_from_a_stock_moe_converts_it_and_trains(corpus, tmp_path, stock_moe_source, gate, init):
    from transformers import AutoModelForCausalLM  # gated_qwen, imported above, registered the gated MoE with it

    args = moe_args(corpus, tmp_path / "run", init_from=str(stock_moe_source), gate=gate, gate_init=init)
    stock = load_stock(stock_moe_source)
    start = load_initial_model(args)
    assert isinstance(start, Qwen3MoeGatedForCausalLM) and start.config.gate_type == gate
    ids = torch.randint(start.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        same_logits = torch.equal(start(ids).logits, stock(ids).logits)
    # identity: the model before step 1 computes the stock model's logits bit for bit; random: the gate acts
    assert same_logits == (init == "identity")

    summary = train(args)
    tokenizer = AutoTokenizer.from_pretrained(stock_moe_source)
    rows = heldout(args, tokenizer)
    log = read_log(tmp_path / "run")
    assert log[0]["step"] == "0" and log[-1]["step"] == "2"
    assert log[0]["heldout_loss"] == f"{evaluate(start, rows)['loss']:.5f}"
    if init == "identity":
        assert log[0]["heldout_loss"] == f"{evaluate(stock, rows)['loss']:.5f}"

    final = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final", dtype=torch.float32)
    assert type(final) is Qwen3MoeGatedForCausalLM and final.config.model_type == "qwen3_moe_gated"
    assert summary["gate"] == final.config.gate_type == gate
    assert (final.config.num_experts, final.config.num_experts_per_tok) == (4, 2)
    trained, started = final.state_dict(), start.state_dict()
    assert trained.keys() == started.keys()
    assert not torch.equal(trained["model.layers.0.mlp.gate.weight"], started["model.layers.0.mlp.gate.weight"])
    assert AutoTokenizer.from_pretrained(tmp_path / "run" / "final").get_vocab() == tokenizer.get_vocab()


def split_rows(config, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gate_dim = {"headwise": 1, "elementwise": config.head_dim}[config.gate_type]
    return split_query_and_gate(tensor, config.num_key_value_heads, config.head_dim, gate_dim, dim=0)


@pytest.mark.parametrize("layers", ["sparse", "a dense layer among sparse ones"])
def test_trainable_gate_on_an_moe_changes_the_gate_rows_and_nothing_else(corpus, tmp_path, request, layers):
    stock = request.getfixturevalue("stock_moe_source" if layers == "sparse" else "stock_moe_dense_layer")
    source = tmp_path / "stock_aux"  # with the auxiliary loss on: its gradient reaches the router too
    shutil.copytree(stock, source)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(
        json.dumps({**config, "output_router_logits": True, "router_aux_loss_coef": 0.5})
    )
    before = convert_qwen3_to_gated(load_stock(source), gate="headwise").state_dict()
    before = {name: tensor.clone() for name, tensor in before.items()}
    args = moe_args(
        corpus,
        tmp_path / "run",
        init_from=str(source),
        gate="headwise",
        trainable="gate",
        max_steps=3,
        weight_decay=0.1,
        learning_rate=1e-2,
    )
    summary = train(args)
    after = load_gated(tmp_path / "run" / "final")
    num_layers = after.config.num_hidden_layers
    assert summary["trainable_parameters"] == num_layers * 4 * 32  # layers x 4 heads x 32 inputs (no q bias)
    assert after.state_dict().keys() == before.keys()
    assert any(".mlp.experts." in name for name in before) and any(
        name.endswith(".mlp.gate.weight") for name in before
    )
    changed = 0
    for name, tensor in after.state_dict().items():
        if ".self_attn.q_proj." in name:
            (query_before, gate_before), (query_after, gate_after) = (
                split_rows(after.config, t) for t in (before[name], tensor)
            )
            assert torch.equal(query_after, query_before), name
            assert not torch.equal(gate_after, gate_before), name
            changed += 1
        else:  # router, experts, norms, embeddings, the rest of the attention: bit for bit as they were
            assert torch.equal(tensor, before[name]), name
    assert changed == num_layers
    if layers != "sparse":
        assert after.config.mlp_only_layers == [1] and "model.layers.1.mlp.gate_proj.weight" in before


def test_gate_lr_scale_on_an_moe_scales_the_gate_rows_update_only(corpus, tmp_path, stock_moe_source):
    before = convert_qwen3_to_gated(load_stock(stock_moe_source), gate="headwise", init="random")
    config = before.config
    converted = tmp_path / "converted"
    before.save_pretrained(converted)
    write_tiny_tokenizer(converted)
    before = load_gated(converted).state_dict()
    finals = {}
    for scale in (1.0, 8.0):
        args = moe_args(corpus, tmp_path / f"scale{scale}", init_from=str(converted), max_steps=1, gate_lr_scale=scale)
        train(args)
        finals[scale] = load_gated(Path(args.output_dir) / "final").state_dict()
    for name, tensor in before.items():
        if ".self_attn.q_proj." not in name:
            assert torch.equal(finals[1.0][name], finals[8.0][name]), name
            continue
        (_, gate), (query_1, gate_1), (query_8, gate_8) = (
            split_rows(config, t) for t in (tensor, finals[1.0][name], finals[8.0][name])
        )
        assert torch.equal(query_1, query_8), name
        assert not torch.equal(gate_1, gate)
        torch.testing.assert_close(gate_8 - gate, 8 * (gate_1 - gate), rtol=1e-4, atol=1e-7)


def aux_sources(tmp_path: Path, stock: Path, coef: float) -> dict[bool, Path]:
    """Copies of ``stock`` whose config has the auxiliary loss off (False) and on (True), at ``coef``."""
    sources = {}
    for aux in (False, True):
        source = sources[aux] = tmp_path / f"stock_aux_{aux}"
        shutil.copytree(stock, source)
        config = json.loads((source / "config.json").read_text())
        (source / "config.json").write_text(
            json.dumps({**config, "output_router_logits": aux, "router_aux_loss_coef": coef})
        )
    return sources


def first_aux_losses(args: TrainRunArguments, micro_batches: int, rank: int = 0, world_size: int = 1) -> list[float]:
    """The starting model's load-balancing loss on each of the first ``micro_batches`` batches of this process."""
    tokenizer = AutoTokenizer.from_pretrained(args.init_from)
    rows = iter(
        PackedRows(
            load_documents(args), tokenizer, args.seq_len, world_size, rank, world_size, args.seed, args.shuffle_buffer
        )
    )
    model = load_initial_model(args)
    losses = []
    for _ in range(micro_batches):
        batch = torch.stack([next(rows)["input_ids"] for _ in range(args.batch_size)])
        with torch.no_grad():
            losses.append(model(input_ids=batch, labels=batch).aux_loss.item())
    return losses


@pytest.mark.parametrize("batch_size, accumulation", [(4, 1), (2, 2)])
def test_the_trained_loss_includes_the_routers_auxiliary_loss_when_the_config_asks(
    corpus, tmp_path, stock_moe_source, batch_size, accumulation
):
    """output_router_logits in the config: the loss Trainer optimises (log.csv's train_loss) is the language-model
    loss plus router_aux_loss_coef x the load-balancing loss, as transformers' Qwen3-MoE computes it; with
    accumulated batches, coef x the mean of the micro-batches' (Trainer alone would weigh their sum)."""
    coef = 0.5
    sources = aux_sources(tmp_path, stock_moe_source, coef)
    losses = {}
    for aux, source in sources.items():
        args = moe_args(
            corpus,
            tmp_path / f"run_{aux}",
            init_from=str(source),
            gate="headwise",
            max_steps=1,
            batch_size=batch_size,
            gradient_accumulation_steps=accumulation,
        )
        train(args)
        losses[aux] = float(read_log(Path(args.output_dir))[1]["train_loss"])
    aux_losses = first_aux_losses(args, accumulation)
    assert all(value > 0 for value in aux_losses)
    assert losses[True] - losses[False] == pytest.approx(coef * sum(aux_losses) / accumulation, abs=2e-5)


def torchrun_train(*flags: str) -> None:
    """``gated-qwen train FLAGS`` under torchrun, 2 processes on a free port, one thread each."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
    }
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}"]
    launched = subprocess.run(
        [*torchrun, "-m", "gated_qwen", "train", *flags, "--threads", "1", "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert launched.returncode == 0, launched.stderr[-3000:]


@pytest.mark.slow
def test_two_processes_weigh_the_auxiliary_loss_as_one_does(corpus, tmp_path, stock_moe_source):
    """torchrun, 2 processes x 2 rows: the step's loss is coef x the mean of the two processes' auxiliary losses
    (Trainer alone multiplies it by the process count: transformers issue #48690). Also: an MoE trains under DDP."""
    coef = 0.5
    sources = aux_sources(tmp_path, stock_moe_source, coef)
    losses = {}
    for aux, source in sources.items():
        out = tmp_path / f"run_{aux}"
        torchrun_train(
            "--train-file", str(corpus), "--out", str(out), "--init-from", str(source), "--gate", "headwise",
            "--seq-len", "32", "--batch-size", "2", "--data-shards", "2", "--max-steps", "1", "--warmup-steps", "0",
        )  # fmt: skip
        losses[aux] = float(read_log(out)[-1]["train_loss"])
    args = moe_args(corpus, tmp_path / "unused", init_from=str(sources[True]), gate="headwise", batch_size=2)
    aux_losses = [first_aux_losses(args, 1, rank, world_size=2)[0] for rank in (0, 1)]
    assert losses[True] - losses[False] == pytest.approx(coef * sum(aux_losses) / 2, abs=2e-5)
    assert Qwen3MoeGatedForCausalLM.from_pretrained(tmp_path / "run_True" / "final").config.gate_type == "headwise"


@pytest.mark.slow
def test_resume_of_an_moe_run_under_two_processes_is_exact(corpus, tmp_path, stock_moe_source):
    """Under DDP each process loads the checkpoint's per-expert tensors into its fused experts: the resumed steps
    have the losses of the uninterrupted run."""
    flags = [
        "--train-file", str(corpus), "--heldout-file", str(corpus), "--init-from", str(stock_moe_source),
        "--gate", "headwise", "--init", "random", "--seq-len", "32", "--batch-size", "2", "--data-shards", "2",
        "--max-steps", "3", "--save-every", "1", "--eval-every", "3", "--eval-rows", "4", "--warmup-steps", "0",
    ]  # fmt: skip
    torchrun_train(*flags, "--out", str(tmp_path / "whole"))
    torchrun_train(*flags, "--out", str(tmp_path / "resumed"), "--resume", str(tmp_path / "whole" / "checkpoint-1"))
    whole, resumed = read_log(tmp_path / "whole"), read_log(tmp_path / "resumed")
    assert [row["step"] for row in resumed] == ["2", "3"]
    assert [row["train_loss"] for row in resumed] == [row["train_loss"] for row in whole[-2:]]
    assert resumed[-1]["heldout_loss"] == whole[-1]["heldout_loss"]


def test_an_moe_config_trains_from_scratch(corpus, tmp_path):
    from transformers import AutoModelForCausalLM

    config = {
        **tiny_moe_config_dict(),
        "model_type": "qwen3_moe_gated",
        "architectures": ["Qwen3MoeGatedForCausalLM"],
        "headwise_attn_output_gate": True,
        "elementwise_attn_output_gate": False,
        "output_router_logits": True,
    }
    (tmp_path / "moe.json").write_text(json.dumps(config))
    args = moe_args(corpus, tmp_path / "run", config=str(tmp_path / "moe.json"), vocab_size=300, max_steps=3)
    summary = train(args)
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final")
    assert type(final) is Qwen3MoeGatedForCausalLM and final.config.gate_type == summary["gate"] == "headwise"
    assert (final.config.num_experts, final.config.num_experts_per_tok, final.config.output_router_logits) == (
        4,
        2,
        True,
    )
    assert final.config.vocab_size == len(AutoTokenizer.from_pretrained(tmp_path / "run" / "final"))
    log = read_log(tmp_path / "run")
    assert [row["step"] for row in log] == ["0", "1", "2", "3"]
    assert float(log[-1]["heldout_loss"]) < float(log[0]["heldout_loss"])


def test_a_stock_moe_config_with_gate_trains_as_the_gated_moe(corpus, tmp_path):
    (tmp_path / "stock.json").write_text(json.dumps(tiny_moe_config_dict()))  # model_type "qwen3_moe"
    args = moe_args(
        corpus, tmp_path / "run", config=str(tmp_path / "stock.json"), gate="elementwise", vocab_size=300, max_steps=1
    )
    summary = train(args)
    final = load_gated(tmp_path / "run" / "final")
    assert summary["gate"] == final.config.gate_type == "elementwise"
    assert final.config.model_type == "qwen3_moe_gated"


def test_an_invalid_moe_config_is_refused_naming_the_family(corpus, tmp_path):
    from gated_qwen.tools.training.arguments import TrainingError

    (tmp_path / "bad.json").write_text(json.dumps(tiny_moe_config_dict(num_experts=2, num_experts_per_tok=3)))
    with pytest.raises(TrainingError, match="not a valid Qwen3MoeGated config.*num_experts_per_tok"):
        train(moe_args(corpus, tmp_path / "run", config=str(tmp_path / "bad.json"), vocab_size=300, max_steps=1))
    assert not (tmp_path / "run").exists()


def test_gate_options_on_moe_checkpoints_are_refused_as_on_dense_ones(corpus, tmp_path, stock_moe_source, capsys):
    from gated_qwen.cli import main

    converted = tmp_path / "converted"
    convert_qwen3_to_gated(load_stock(stock_moe_source), gate="headwise").save_pretrained(converted)
    write_tiny_tokenizer(converted)
    base = ["train", "--train-file", str(corpus), "--out", str(tmp_path / "out"), "--max-steps", "1", "--no-progress"]
    for extra, message in (
        (["--init-from", str(converted), "--gate", "elementwise"], "already has a headwise gate"),
        (
            ["--init-from", str(stock_moe_source), "--trainable", "gate"],
            "has no gate, so --trainable gate would train nothing",
        ),
    ):
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_gradient_checkpointing_gives_an_moe_the_same_steps(corpus, tmp_path, stock_moe_source):
    source = aux_sources(tmp_path, stock_moe_source, coef=0.01)[True]
    summaries = [
        train(
            moe_args(
                corpus,
                tmp_path / f"run_{checkpointing}",
                init_from=str(source),
                gate="headwise",
                max_steps=3,
                gradient_checkpointing=checkpointing,
            )
        )
        for checkpointing in (False, True)
    ]
    assert summaries[0]["final_train_loss"] == pytest.approx(summaries[1]["final_train_loss"], abs=1e-6)
    assert summaries[0]["heldout"]["loss"] == pytest.approx(summaries[1]["heldout"]["loss"], abs=1e-6)


def test_resume_of_an_moe_run_equals_an_uninterrupted_one(corpus, tmp_path, stock_moe_source):
    """Trainer's checkpoints hold the experts as transformers saves them (one tensor per expert, the layout
    from_pretrained and vLLM read); resuming loads them back exactly, also from shards that split an expert
    tensor's pieces between files (Trainer loads a shard at a time)."""
    from huggingface_hub import save_torch_state_dict
    from safetensors.torch import load_file

    from gated_qwen.transforms.experts import is_fused_experts

    source = aux_sources(tmp_path, stock_moe_source, coef=0.01)[True]
    args = moe_args(
        corpus,
        tmp_path / "whole",
        init_from=str(source),
        gate="headwise",
        gate_init="random",
        max_steps=4,
        save_every=2,
        eval_every=4,
    )
    train(args)
    checkpoint = tmp_path / "whole" / "checkpoint-2"
    saved = load_file(checkpoint / "model.safetensors")
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in saved
    assert not [name for name in saved if is_fused_experts(name)]
    reloaded = Qwen3MoeGatedForCausalLM.from_pretrained(checkpoint)  # strict: every tensor where the config says
    assert torch.equal(
        reloaded.model.layers[1].mlp.experts.down_proj[3], saved["model.layers.1.mlp.experts.3.down_proj.weight"]
    )

    sharded = tmp_path / "sharded" / "checkpoint-2"
    shutil.copytree(checkpoint, sharded)
    (sharded / "model.safetensors").unlink()
    save_torch_state_dict(saved, sharded, max_shard_size=5_000)  # about two expert pieces (16 x 32 floats) a file
    weight_map = json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"]
    gate_up = [f"model.layers.0.mlp.experts.{e}.{p}.weight" for e in range(4) for p in ("gate_proj", "up_proj")]
    assert len({weight_map[name] for name in gate_up}) > 1  # one fused tensor's pieces in several shards

    whole = read_log(tmp_path / "whole")
    for resume_from, out in ((checkpoint, "resumed"), (sharded, "resumed_sharded")):
        train(dataclasses.replace(args, output_dir=str(tmp_path / out)), resume=resume_from)
        resumed = read_log(tmp_path / out)
        assert [row["step"] for row in resumed] == ["3", "4"]
        assert [row["train_loss"] for row in resumed] == [row["train_loss"] for row in whole[-2:]]
        assert resumed[-1]["heldout_loss"] == whole[-1]["heldout_loss"]
