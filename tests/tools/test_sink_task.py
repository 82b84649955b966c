"""gated_qwen.tools.sink_task: the Bigram-Backcopy task's rules, its measurements on known attention, and training."""

from __future__ import annotations

import math

import pytest
import torch

from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM
from gated_qwen.tools.sink_task import (
    BigramBackcopy,
    _loss_by_kind,
    first_token_attention_by_head,
    measure_sink,
    model_config,
    train_on_task,
    uniform_first_token_attention,
)


def test_after_a_trigger_the_next_token_copies_the_token_before_it():
    task = BigramBackcopy()
    rows = task.sample(512, seed=3)
    triggers = task.is_trigger(rows)
    row, t = torch.nonzero(triggers[:, :-1], as_tuple=True)
    assert len(t) > 100  # the rule is exercised
    assert torch.equal(rows[row, t + 1], rows[row, t - 1])
    assert (rows[:, 0] == task.bos_token_id).all() and not triggers[:, 1].any()  # BOS, then a real non-trigger
    assert (rows[:, 1:] < task.vocab_size).all()  # BOS only first


def test_other_tokens_follow_the_bigram_model():
    task = BigramBackcopy(vocab_size=6, num_triggers=1, seq_len=64, concentration=1.0)
    rows = task.sample(2000, seed=0)
    bigram = task.bigram_targets(rows)
    current, following = rows[:, :-1][bigram[:, :-1]], rows[:, 1:][bigram[:, :-1]]
    counts = torch.zeros(6, 6, dtype=torch.float64).index_put_(
        (current, following), torch.ones(len(current), dtype=torch.float64), accumulate=True
    )
    frequencies = counts / counts.sum(1, keepdim=True)
    sources = torch.from_numpy(~task.is_trigger(torch.arange(6)).numpy())  # a trigger's row is never drawn from
    assert torch.allclose(frequencies[sources], torch.from_numpy(task.transitions)[sources], atol=0.03)


def test_rows_and_task_are_seeded():
    assert torch.equal(BigramBackcopy().sample(64, seed=5), BigramBackcopy().sample(64, seed=5))
    assert not torch.equal(BigramBackcopy().sample(64, seed=5), BigramBackcopy().sample(64, seed=6))
    assert not (BigramBackcopy(task_seed=1).transitions == BigramBackcopy().transitions).all()
    assert list(BigramBackcopy().triggers) == list(BigramBackcopy().triggers)


def test_target_kinds_split_every_predicting_position():
    task = BigramBackcopy()
    rows = task.sample(64, seed=0)
    copies, bigram, queries = task.copy_targets(rows), task.bigram_targets(rows), task.non_trigger_queries(rows)
    assert not (copies & bigram).any()
    assert ((copies | bigram)[:, 1:-1] == True).all()  # noqa: E712  every position but BOS and the last predicts one
    assert torch.equal(queries[:, 1:], ~task.is_trigger(rows)[:, 1:]) and not queries[:, 0].any()


def _model(task, **keys):
    torch.manual_seed(0)
    return Qwen3GatedForCausalLM(Qwen3GatedConfig(**model_config(task), **keys)).eval()


def test_a_head_that_attends_uniformly_measures_the_uniform_figure():
    task = BigramBackcopy()
    model = _model(task)
    torch.nn.init.zeros_(model.model.layers[0].self_attn.q_proj.weight)  # every score 0: uniform attention
    rows = task.sample(64, seed=1)
    measured = first_token_attention_by_head(model, task, rows)
    uniform = uniform_first_token_attention(task, rows)
    assert measured.shape == (1, 1)
    assert measured.item() == pytest.approx(uniform, abs=1e-6)
    # the trigger queries are left out: counting them too would give another figure
    every_query = (1.0 / torch.arange(2, task.seq_len + 1).double()).mean().item()
    assert abs(every_query - uniform) > 1e-4
    row = measure_sink(model, task, rows)
    assert row["sinking_heads"] == 0.0 and row["first_token_attention"] == pytest.approx(uniform, abs=1e-6)


def test_a_head_that_attends_only_to_bos_measures_one():
    """Keys are zero except BOS's (its own embedding direction); every query points at it."""
    task = BigramBackcopy()
    model = _model(task)
    attention = model.model.layers[0].self_attn
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0  # every token: direction 0
        model.model.embed_tokens.weight[task.bos_token_id, 1] = 1.0  # BOS also direction 1
        for projection in (attention.q_proj, attention.k_proj):
            projection.weight.zero_()
        last = attention.head_dim - 1  # the slowest-turning rotary pair: rotation is negligible over 16 positions
        attention.q_proj.weight[last, 0] = 1.0  # every query along `last`
        attention.k_proj.weight[last, 1] = 1.0  # only BOS has a key, along `last`
        attention.q_norm.weight.fill_(4.0)
    rows = task.sample(64, seed=1)
    row = measure_sink(model, task, rows)
    assert row["first_token_attention"] > 0.999 and row["sinking_heads"] == 1.0
    assert row["uniform_attention"] < 0.2


def test_loss_and_accuracy_are_split_by_target_kind():
    task = BigramBackcopy()
    rows = task.sample(32, seed=2)
    vocab = task.vocab_size + 1
    logits = torch.zeros(*rows.shape, vocab)  # the bigram targets uniform (loss log 65, no argmax right but by ties)
    copies = task.copy_targets(rows)[:, :-1]
    logits[:, :-1][copies] = torch.nn.functional.one_hot(rows[:, 1:][copies], vocab) * 50.0  # copies right, certain
    row = _loss_by_kind(task, logits, rows)
    assert row["copy_accuracy"] == 1.0 and row["copy_loss"] < 1e-6
    assert row["bigram_loss"] == pytest.approx(math.log(vocab), rel=1e-5)
    assert row["copy_loss"] < row["loss"] < row["bigram_loss"]


@pytest.mark.slow  # three training runs: about 5 seconds on a free core
def test_a_tiny_training_run_gives_the_same_numbers_twice():
    first = train_on_task(
        BigramBackcopy(), {"gate_type": "elementwise"}, seed=1, steps=3, batch_size=8, curve_every=1, probe_rows=16
    )
    second = train_on_task(
        BigramBackcopy(), {"gate_type": "elementwise"}, seed=1, steps=3, batch_size=8, curve_every=1, probe_rows=16
    )
    assert first == second
    assert first["curve"]["steps"] == [0, 1, 2, 3] and 0 < first["final"]["mean_gate"] < 1
    other = train_on_task(
        BigramBackcopy(), {"gate_type": "elementwise"}, seed=2, steps=3, batch_size=8, curve_every=1, probe_rows=16
    )
    assert other["final"]["loss"] != first["final"]["loss"]
