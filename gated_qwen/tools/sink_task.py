"""A miniature where attention sinks form: the Bigram-Backcopy task (arXiv 2410.13835), and what to measure on it.

Guo et al. ("Active-Dormant Attention Heads", arXiv 2410.13835) show that a one-layer transformer trained on
this task grows an attention sink: the head that copies is needed only after a trigger token and goes "dormant"
on every other token by parking its attention on the first token. The task, seeded, nothing downloaded:

- a vocabulary of ``vocab_size`` tokens plus a BOS token (id ``vocab_size``), which starts every row;
- a bigram model: each token's row of next-token probabilities is drawn from a Dirichlet(``concentration``);
- ``num_triggers`` trigger tokens: after a trigger the next token copies the token *before* the trigger;
  every other next token follows the bigram model. The first token after BOS is drawn uniformly from the
  tokens that are not triggers, so that a trigger always has a real token before it.

:class:`BigramBackcopy` generates rows and says which positions are copy targets, bigram targets and
non-trigger queries; :func:`measure_sink` measures a model on rows (first-token attention with the project's
:func:`~gated_qwen.tools.analysis.sinks.record_attention`, massive activations with
:func:`~gated_qwen.tools.analysis.sinks.massive_activations`, gates with :func:`~gated_qwen.tools.analysis.gates.record_gates`,
and what the analysis has no function for: loss and accuracy by kind of target, residual and value-state norms);
:func:`train_on_task` trains a model on it with the project's Trainer (:func:`.training.trainer_for_rows`),
measuring first-token attention along the way. ``scripts/run_sink_ablation.py`` runs the design-space arms.

>>> task = BigramBackcopy(seq_len=8)
>>> rows = task.sample(2, seed=0)
>>> rows.shape, bool((rows[:, 0] == task.bos_token_id).all())
(torch.Size([2, 8]), True)
"""

from __future__ import annotations

import dataclasses
import tempfile
from contextlib import contextmanager

import numpy as np
import torch
from transformers import TrainerCallback

from .analysis.gates import attention_layers, gated_attention_layers, record_gates, summarize_gates
from .analysis.sinks import massive_activations, record_attention


SINK_THRESHOLD = 0.3  # a head "sinks" when its first-token attention is above this (arXiv 2410.10781)


@dataclasses.dataclass
class BigramBackcopy:
    """The Bigram-Backcopy task: its bigram model and triggers, drawn from ``task_seed``, and rows sampled from it.

    >>> task = BigramBackcopy(vocab_size=8, num_triggers=2, seq_len=12, task_seed=0)
    >>> rows = task.sample(4, seed=1)
    >>> row, t = torch.nonzero(task.copy_targets(rows), as_tuple=True)  # token t is a trigger: t + 1 is a copy
    >>> bool((rows[row, t + 1] == rows[row, t - 1]).all()), len(t) > 0    # of the token before the trigger
    (True, True)
    >>> torch.equal(task.sample(4, seed=1), rows)  # seeded
    True
    """

    vocab_size: int = 64
    num_triggers: int = 3
    seq_len: int = 16
    concentration: float = 0.1
    task_seed: int = 0

    def __post_init__(self):
        if self.num_triggers >= self.vocab_size or self.seq_len < 3:
            raise ValueError("the task needs fewer triggers than tokens and rows of at least 3 tokens")
        rng = np.random.default_rng(self.task_seed)
        self.transitions = rng.dirichlet(np.full(self.vocab_size, self.concentration), size=self.vocab_size)
        self.triggers = np.sort(rng.choice(self.vocab_size, self.num_triggers, replace=False))
        self._is_trigger = np.zeros(self.vocab_size + 1, dtype=bool)
        self._is_trigger[self.triggers] = True

    @property
    def bos_token_id(self) -> int:
        return self.vocab_size

    def sample(self, num_rows: int, seed: int) -> torch.Tensor:
        """``num_rows`` rows of ``seq_len`` token ids, (N, T), BOS first; the same ``seed`` gives the same rows."""
        rng = np.random.default_rng(seed)
        ids = np.empty((num_rows, self.seq_len), dtype=np.int64)
        ids[:, 0] = self.bos_token_id
        ids[:, 1] = rng.choice(np.flatnonzero(~self._is_trigger[: self.vocab_size]), num_rows)
        cumulative = np.cumsum(self.transitions, axis=1)
        cumulative[:, -1] = 1.0
        for t in range(1, self.seq_len - 1):
            current = ids[:, t]
            drawn = (rng.random(num_rows)[:, None] > cumulative[current]).sum(1)  # inverse CDF of the bigram row
            ids[:, t + 1] = np.where(self._is_trigger[current], ids[:, t - 1], np.minimum(drawn, self.vocab_size - 1))
        return torch.from_numpy(ids)

    def is_trigger(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Whether each token is a trigger, (N, T) bool."""
        return torch.from_numpy(self._is_trigger).to(input_ids.device)[input_ids]

    def copy_targets(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(N, T) bool: position t's next token is a copy (token t is a trigger); the last position predicts nothing."""
        copies = self.is_trigger(input_ids)
        copies[:, -1] = False
        return copies

    def bigram_targets(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(N, T) bool: position t's next token follows the bigram model (t >= 1, token t not a trigger, t not last)."""
        bigram = ~self.is_trigger(input_ids)
        bigram[:, 0] = bigram[:, -1] = False
        return bigram

    def non_trigger_queries(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(N, T) bool: the queries where the copying head has nothing to do (not BOS, not a trigger)."""
        queries = ~self.is_trigger(input_ids)
        queries[:, 0] = False
        return queries

    def bigram_floor(self, input_ids: torch.Tensor) -> dict:
        """The best any model can do on the bigram targets of ``input_ids``: the mean entropy of their bigram rows
        (the least loss) and the mean largest probability (the best accuracy)."""
        rows = torch.from_numpy(self.transitions)[input_ids[self.bigram_targets(input_ids)].cpu()]  # (M, V)
        entropy = -(rows * rows.clamp_min(1e-30).log()).sum(-1)
        return {"loss": entropy.mean().item(), "accuracy": rows.max(-1).values.mean().item()}


def model_config(task: BigramBackcopy, **overrides) -> dict:
    """The miniature's architecture for ``task`` (one layer, one head, width 64, MLP 128), as Qwen3GatedConfig keys.

    >>> model_config(BigramBackcopy())["vocab_size"], model_config(BigramBackcopy(), num_hidden_layers=2)["num_hidden_layers"]
    (65, 2)
    """
    return {
        "vocab_size": task.vocab_size + 1,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "max_position_embeddings": task.seq_len,
        "bos_token_id": task.bos_token_id,
        "eos_token_id": None,
        "pad_token_id": None,
        "tie_word_embeddings": False,
        **overrides,
    }


# ------------------------------------------------------------------------------------------------------- measurement


@contextmanager
def _record_outputs(modules):
    """The output tensor of each module during the forwards inside: {index: [tensor per call]}."""
    outputs, handles = {}, []
    for index, module in enumerate(modules):

        def keep(module, args, output, index=index):
            outputs.setdefault(index, []).append((output[0] if isinstance(output, tuple) else output).detach().float())

        handles.append(module.register_forward_hook(keep))
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def _first_vs_rest(states: torch.Tensor) -> float:
    """The first token's L2 norm over the mean norm of the others, (B, T, C) states averaged over the batch."""
    norms = states.norm(dim=-1)  # (B, T)
    return (norms[:, 0].mean() / norms[:, 1:].mean()).item()


def first_token_attention_by_head(model, task: BigramBackcopy, input_ids: torch.Tensor) -> torch.Tensor:
    """First-token attention per layer and head, (L, H), over the non-trigger queries of ``input_ids``.

    :func:`~gated_qwen.tools.analysis.sinks.record_attention` leaves out the queries its mask marks 0 and takes the first
    marked token as the first token; the mask here marks BOS and the non-trigger queries, so the first token stays
    BOS and only the queries where the copying head has nothing to do count. The model sees no mask.

    >>> task = BigramBackcopy()
    >>> model = build_model(task, {"gate_type": "none"}, seed=0)
    >>> first_token_attention_by_head(model, task, task.sample(8, seed=0)).shape  # (layers, heads)
    torch.Size([1, 1])
    """
    input_ids = input_ids.to(model.device)
    queries = task.non_trigger_queries(input_ids)
    queries[:, 0] = True  # BOS: the first token, not a query (skip_first=1)
    with torch.no_grad(), record_attention(model, skip_first=1, attention_mask=queries.long()) as record:
        model(input_ids=input_ids)
    return record.first_token()


def uniform_first_token_attention(task: BigramBackcopy, input_ids: torch.Tensor) -> float:
    """The first-token attention a head attending uniformly would have on the same queries: mean of 1 / (t + 1).

    >>> round(uniform_first_token_attention(BigramBackcopy(), BigramBackcopy().sample(512, seed=0)), 2)
    0.16
    """
    queries = task.non_trigger_queries(input_ids)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    return (1.0 / (positions[queries] + 1).double()).mean().item()


def _loss_by_kind(task: BigramBackcopy, logits: torch.Tensor, input_ids: torch.Tensor) -> dict:
    losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), input_ids[:, 1:].flatten(), reduction="none"
    ).view(input_ids.shape[0], -1)
    correct = (logits[:, :-1].argmax(-1) == input_ids[:, 1:]).float()
    row = {"loss": losses.mean().item()}
    for kind, mask in (("copy", task.copy_targets(input_ids)), ("bigram", task.bigram_targets(input_ids))):
        mask = mask[:, :-1]
        row[f"{kind}_loss"] = losses[mask].mean().item()
        row[f"{kind}_accuracy"] = correct[mask].mean().item()
    return row


@torch.no_grad()
def measure_sink(model, task: BigramBackcopy, input_ids: torch.Tensor) -> dict:
    """Every column of the sink table for ``model`` on rows of ``task``.

    - ``first_token_attention``: per layer the mean over its heads of the attention non-trigger queries put on
      the first token (BOS), :func:`first_token_attention_by_head`; the largest layer's. ``uniform_attention``:
      the same figure for uniform attention over the causal window; ``sinking_heads``: the share of all heads
      whose first-token attention is above :data:`SINK_THRESHOLD` (arXiv 2410.10781's count);
    - ``loss`` (every target), ``copy_loss``/``copy_accuracy`` (after a trigger) and
      ``bigram_loss``/``bigram_accuracy``, with ``bigram_floor_loss``/``bigram_floor_accuracy``, the best possible;
    - ``largest_activation``: the largest |residual state| after any layer
      (:func:`~gated_qwen.tools.analysis.sinks.massive_activations`); ``first_token_residual_ratio``: the first
      token's residual-state norm over the others' mean, the largest over layers; ``first_token_value_ratio``: the
      same for the value states (``v_proj``'s output, before any value gate) of the layer with the largest
      first-token attention;
    - gated models: ``mean_gate`` and ``gate_below_0.5`` (:func:`~gated_qwen.tools.analysis.gates.summarize_gates`).

    >>> from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM
    >>> task = BigramBackcopy()
    >>> torch.manual_seed(0) and None
    >>> model = Qwen3GatedForCausalLM(Qwen3GatedConfig(**model_config(task), gate_type="headwise")).eval()
    >>> row = measure_sink(model, task, task.sample(32, seed=0))
    >>> 0 < row["first_token_attention"] < 1, row["sinking_heads"] in (0.0, 1.0), 0 < row["mean_gate"] < 1
    (True, True, True)
    """
    input_ids = input_ids.to(model.device)
    attention = first_token_attention_by_head(model, task, input_ids)  # (L, H)
    layer = int(attention.mean(1).argmax())
    decoder_layers = [module for module in model.modules() if type(module).__name__.endswith("DecoderLayer")]
    values = [module.v_proj for module in attention_layers(model)]
    with _record_outputs(decoder_layers) as residuals, _record_outputs(values) as value_states:
        logits = model(input_ids=input_ids).logits
    floor = task.bigram_floor(input_ids)
    row = {
        "first_token_attention": attention[layer].mean().item(),
        "first_token_attention_by_head": attention.tolist(),
        "uniform_attention": uniform_first_token_attention(task, input_ids),
        "sinking_heads": (attention > SINK_THRESHOLD).float().mean().item(),
        **_loss_by_kind(task, logits, input_ids),
        "bigram_floor_loss": floor["loss"],
        "bigram_floor_accuracy": floor["accuracy"],
        "largest_activation": max(entry["max_abs"] for entry in massive_activations(model, input_ids)),
        "first_token_residual_ratio": max(_first_vs_rest(states[0]) for states in residuals.values()),
        "first_token_value_ratio": _first_vs_rest(value_states[layer][0]),
    }
    if gated_attention_layers(model):
        with record_gates(model) as record:
            model(input_ids=input_ids)
        overall = summarize_gates(record)["overall"]
        row["mean_gate"], row["gate_below_0.5"] = overall["mean"], overall["below_0.5"]
    return row


# ---------------------------------------------------------------------------------------------------------- training


class TaskRows(torch.utils.data.Dataset):
    """Rows of token ids as a Dataset of ``{"input_ids", "labels"}`` (the labels are the ids: the model shifts).

    >>> rows = TaskRows(BigramBackcopy().sample(4, seed=0))
    >>> len(rows), sorted(rows[0])
    (4, ['input_ids', 'labels'])
    """

    def __init__(self, input_ids: torch.Tensor):
        self.input_ids = input_ids

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict:
        row = self.input_ids[index]
        return {"input_ids": row, "labels": row}


class SinkCurve(TrainerCallback):
    """Every ``every`` steps (and at the last), the first-token attention of the model on fixed probe rows.

    >>> task = BigramBackcopy()
    >>> curve = SinkCurve(task, task.sample(8, seed=0), every=100)
    >>> curve.record(build_model(task, {"gate_type": "none"}, seed=0), step=0)
    >>> curve.steps, 0 < curve.first_token_attention[0] < 1
    ([0], True)
    """

    def __init__(self, task: BigramBackcopy, probe: torch.Tensor, every: int):
        self.task, self.probe, self.every = task, probe, every
        self.steps: list[int] = []
        self.first_token_attention: list[float] = []

    def record(self, model, step: int) -> None:
        attention = first_token_attention_by_head(model, self.task, self.probe)
        self.steps.append(step)
        self.first_token_attention.append(attention.mean(1).max().item())

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.record(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self.record(model, state.global_step)


def build_model(task: BigramBackcopy, config_keys: dict, seed: int, **architecture):
    """A new Qwen3Gated model for ``task`` with the arm's ``config_keys``, its weights drawn from ``seed``.

    >>> model = build_model(BigramBackcopy(), {"gate_type": "headwise"}, seed=0)
    >>> model.config.gate_type, model.config.num_hidden_layers, model.config.vocab_size
    ('headwise', 1, 65)
    """
    from ..models.qwen3_gated.configuration_qwen3_gated import Qwen3GatedConfig
    from ..models.qwen3_gated.modeling_qwen3_gated import Qwen3GatedForCausalLM

    config = Qwen3GatedConfig(**model_config(task, **architecture), **config_keys)
    torch.manual_seed(seed)
    return Qwen3GatedForCausalLM(config)


def train_on_task(
    task: BigramBackcopy,
    config_keys: dict,
    seed: int,
    steps: int,
    batch_size: int = 128,
    learning_rate: float = 5e-3,
    weight_decay: float = 0.1,
    warmup_steps: int = 100,
    min_lr_rate: float = 1.0,
    curve_every: int = 100,
    probe_rows: int = 512,
    architecture: dict | None = None,
    precision: str = "fp32",
) -> dict:
    """Train a new model with ``config_keys`` on ``task`` with the project's Trainer; its measurements and curve.

    The rows come from ``seed`` (the same for every arm: same data, same order), the weights too; the optimizer
    groups and schedule are :func:`~gated_qwen.tools.training.train`'s (AdamW, linear warmup, then cosine to
    ``min_lr_rate`` of the peak: by default none, a constant rate).
    Measured on ``probe_rows`` rows drawn apart from the training rows (:func:`measure_sink`); ``curve`` holds the
    first-token attention every ``curve_every`` steps. On a GPU (Trainer takes one when there is one) ``precision``
    ``"bf16"`` trains under bf16 autocast, as ``gated-qwen train --precision bf16``.

    >>> result = train_on_task(BigramBackcopy(), {"gate_type": "headwise"}, seed=0, steps=2, batch_size=4,
    ...                        curve_every=1, probe_rows=8)
    >>> result["curve"]["steps"], sorted(result["final"])[:3]
    ([0, 1, 2], ['bigram_accuracy', 'bigram_floor_accuracy', 'bigram_floor_loss'])
    """
    from .training import TrainRunArguments, trainer_for_rows

    model = build_model(task, config_keys, seed, **(architecture or {}))
    rows = TaskRows(task.sample(steps * batch_size, seed=seed))
    probe = task.sample(probe_rows, seed=2**31 - 1 - seed)  # apart from every training stream
    curve = SinkCurve(task, probe, curve_every)
    with tempfile.TemporaryDirectory() as folder:
        args = TrainRunArguments(
            train_file="(generated in memory)",
            output_dir=folder,
            max_steps=steps,
            seq_len=task.seq_len,
            batch_size=batch_size,
            learning_rate=learning_rate,
            weight_decay=weight_decay,
            warmup_steps=warmup_steps,
            min_lr_rate=min_lr_rate,
            seed=seed,
            precision=precision,
            progress=False,
            report_to="none",
        )
        trainer_for_rows(args, model, rows, callbacks=[curve]).train()
    model.eval()
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "final": measure_sink(model, task, probe),
        "curve": {"steps": curve.steps, "first_token_attention": curve.first_token_attention},
    }


def settled_step(curve: list[float], steps: list[int], tolerance: float = 0.05) -> int | None:
    """The first step from which first-token attention stays within ``tolerance`` of its last value (None: empty).

    >>> settled_step([0.1, 0.5, 0.8, 0.82, 0.81], [0, 10, 20, 30, 40])
    20
    """
    if not curve:
        return None
    last, index = curve[-1], len(curve) - 1
    while index > 0 and abs(curve[index - 1] - last) <= tolerance:
        index -= 1
    return steps[index]


__all__ = [
    "SINK_THRESHOLD",
    "BigramBackcopy",
    "SinkCurve",
    "TaskRows",
    "build_model",
    "first_token_attention_by_head",
    "measure_sink",
    "model_config",
    "settled_step",
    "train_on_task",
    "uniform_first_token_attention",
]
