"""What a run reports: held-out loss and perplexity, the unigram floor, ``log.csv`` and ``loss.png``, written as
Trainer runs by :class:`RunCallback` (which also saves the run state in every checkpoint)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import statistics
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from ...checkpoint.outputs import output_file, write_text
from ...errors import GatedQwenError
from .arguments import TrainRunArguments
from .checkpoints import RUN_STATE


LOG_FIELDS = ("step", "tokens", "lr", "train_loss", "heldout_loss", "heldout_ppl", "tokens_per_s", "elapsed_s")

# A logged training loss is a spike when it exceeds SPIKE_FACTOR x the median of the SPIKE_WINDOW losses logged
# before it, once at least SPIKE_MIN_HISTORY are there (docs/training.md, "Loss spikes").
SPIKE_FACTOR = 1.5
SPIKE_WINDOW = 50
SPIKE_MIN_HISTORY = 10


class LossSpikes:
    """Counts the loss spikes of a run, fed one logged training loss at a time (:meth:`add`).

    >>> spikes = LossSpikes()
    >>> [spikes.add(step, 2.0) for step in range(1, 11)] == [False] * 10
    True
    >>> spikes.add(11, 3.5), spikes.add(12, 2.9), spikes.steps
    (True, False, [11])
    """

    def __init__(self, history: list[float] | None = None, steps: list[int] | None = None):
        self.history = list(history or [])[-SPIKE_WINDOW:]
        self.steps = list(steps or [])

    def add(self, step: int, loss: float) -> bool:
        """Record ``loss`` logged at ``step``; whether it is a spike against the losses before it."""
        spike = len(self.history) >= SPIKE_MIN_HISTORY and loss > SPIKE_FACTOR * statistics.median(self.history)
        if spike:
            self.steps.append(step)
        self.history = [*self.history, loss][-SPIKE_WINDOW:]
        return spike

    def summary(self) -> dict:
        return {"loss_spikes": len(self.steps), "loss_spike_steps": list(self.steps)}


@torch.no_grad()
def evaluate(model, rows: torch.Tensor, batch_size: int = 16) -> dict:
    """Mean next-token loss (nats) and perplexity over every predicted token of ``rows`` (N, T).

    Each row is scored on its own: tokens 1..T-1 given the ones before them in the row.

    >>> from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM
    >>> model = Qwen3GatedForCausalLM(Qwen3GatedConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, gate_type="headwise"))
    >>> rows = torch.randint(64, (4, 16), generator=torch.Generator().manual_seed(0))
    >>> result = evaluate(model, rows)
    >>> result["tokens"], math.isclose(result["ppl"], math.exp(result["loss"]))  # 4 rows x 15 predicted tokens
    (60, True)
    >>> abs(result["loss"] - math.log(64)) < 0.5  # untrained: close to uniform over the 64 tokens
    True
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(rows), batch_size):
        input_ids = rows[start : start + batch_size].to(device)
        logits = model(input_ids=input_ids).logits.float()  # (B, T, V)
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1), reduction="sum"
        )
        total += nll.item()
        count += input_ids[:, 1:].numel()
    model.train(was_training)
    loss = total / count
    return {"loss": loss, "ppl": math.exp(loss), "tokens": count}


def unigram_perplexity(train_stream: torch.Tensor, rows: torch.Tensor, vocab_size: int) -> dict:
    """Loss and perplexity of a unigram model (add-one smoothed train token frequencies) on the tokens
    :func:`evaluate` scores in ``rows``: what a model that ignores context reaches.

    >>> round(unigram_perplexity(torch.tensor([0, 0, 1]), torch.tensor([[1, 0, 0]]), vocab_size=2)["ppl"], 4)  # 1 / (3/5)
    1.6667
    """
    counts = torch.bincount(train_stream, minlength=vocab_size).double() + 1.0
    log_prob = counts.log() - counts.sum().log()
    targets = rows[:, 1:].reshape(-1)
    loss = -log_prob[targets].mean().item()
    return {"loss": loss, "ppl": math.exp(loss), "tokens": targets.numel()}


def plot_losses(log_path: str | Path, png_path: str | Path) -> Path:
    """Plot train and held-out loss of a ``log.csv`` against tokens into a PNG (needs the ``plot`` extra).

    >>> import tempfile
    >>> folder = tempfile.TemporaryDirectory()
    >>> log = Path(folder.name) / "log.csv"
    >>> for step, loss in ((10, 5.0), (20, 4.2), (30, 3.9)):
    ...     append_log_row(log, {"step": step, "tokens": step * 4096, "train_loss": loss, "heldout_loss": loss + 0.1})
    >>> png = plot_losses(log, Path(folder.name) / "loss.png")
    >>> png.name, png.stat().st_size > 0
    ('loss.png', True)
    >>> folder.cleanup()
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise GatedQwenError("plotting needs matplotlib: pip install 'gated-qwen[plot]'") from error
    rows = list(csv.DictReader(Path(log_path).open()))
    figure, axes = plt.subplots(figsize=(6, 4))
    for field, label in (("train_loss", "train"), ("heldout_loss", "held-out")):
        points = [(int(r["tokens"]), float(r[field])) for r in rows if r[field]]
        if points:
            axes.plot(*zip(*points), label=label, marker="o" if field == "heldout_loss" else None, markersize=3)
    axes.set_xlabel("tokens")
    axes.set_ylabel("loss (nats/token)")
    axes.set_title(Path(log_path).parent.name)
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    with output_file(png_path) as partial:
        figure.savefig(partial, dpi=100, format="png")
    plt.close(figure)
    return Path(png_path)


def append_log_row(log_path: Path, row: dict) -> None:
    """Append one row to ``log.csv`` (its header first when the file is new)."""
    new = not log_path.exists()
    with log_path.open("a", newline="") as f:
        writer = csv.DictWriter(f, LOG_FIELDS)
        if new:
            writer.writeheader()
        writer.writerow({k: row.get(k, "") for k in LOG_FIELDS})


def truncate_log(log_path: Path, step: int) -> None:
    """Drop log rows after ``step``: a resumed run rewrites the steps it repeats."""
    if not log_path.exists():
        return
    rows = list(csv.DictReader(log_path.open()))
    with output_file(log_path) as partial, partial.open("w", newline="") as f:
        writer = csv.DictWriter(f, LOG_FIELDS)
        writer.writeheader()
        writer.writerows(r for r in rows if int(r["step"]) <= step)


class RunCallback(TrainerCallback):
    """Held-out loss every ``eval_every`` steps, a ``log.csv`` row per step, ``run_state.json`` in every checkpoint."""

    def __init__(
        self,
        args: TrainRunArguments,
        heldout,
        out: Path,
        num_processes: int,
        data_shards: int,
        is_main: bool,
        state: dict | None,
    ):
        self.args, self.heldout, self.out = args, heldout, out
        self.num_processes, self.data_shards, self.is_main = num_processes, data_shards, is_main
        self.train_loss = state.get("train_loss") if state else None
        self.last_eval = state.get("heldout") if state else None
        self.elapsed_before = state["elapsed_s"] if state else 0.0
        self.resumed = state is not None
        # older checkpoints have no loss history: their spikes are counted from the resumed step on
        self.spikes = LossSpikes(
            state.get("loss_history") if state else None, state.get("loss_spike_steps") if state else None
        )
        self.start = self.window_start = time.perf_counter()
        self.window_steps = 0
        self.pending_eval = None

    @property
    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.start

    def tokens(self, step: int) -> int:
        return step * self.args.tokens_per_step(self.num_processes)

    def _evaluate(self, model) -> dict:
        return evaluate(model, self.heldout, self.args.batch_size)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.start = self.window_start = time.perf_counter()
        if self.heldout is not None and not self.resumed:
            result = self._evaluate(model)
            if self.is_main:
                append_log_row(
                    self.out / "log.csv",
                    {
                        "step": 0,
                        "tokens": 0,
                        "heldout_loss": f"{result['loss']:.5f}",
                        "heldout_ppl": f"{result['ppl']:.3f}",
                    },
                )

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.window_steps += 1
        step = state.global_step
        if self.heldout is not None and (step % self.args.eval_every == 0 or step == state.max_steps):
            now = time.perf_counter()
            self.pending_eval = self._evaluate(model)
            self.last_eval = self.pending_eval
            self.eval_seconds = time.perf_counter() - now

    def on_log(self, args, state, control, logs=None, optimizer=None, lr_scheduler=None, **kwargs):
        if not logs or "loss" not in logs:
            return
        step = state.global_step
        self.train_loss = logs["loss"]
        self.spikes.add(step, self.train_loss)
        now = time.perf_counter()
        seconds = now - self.window_start - (self.eval_seconds if self.pending_eval is not None else 0.0)
        tokens_per_s = self.window_steps * self.args.tokens_per_step(self.num_processes) / max(seconds, 1e-9)
        # the base rate (--lr, scheduled); the first group may be the gate rows at lr * gate_lr_scale
        lr = lr_scheduler.get_last_lr()[0] / optimizer.param_groups[0].get("lr_scale", 1.0)
        row = {
            "step": step,
            "tokens": self.tokens(step),
            "lr": f"{lr:.6g}",
            "train_loss": f"{self.train_loss:.5f}",
            "tokens_per_s": f"{tokens_per_s:.1f}",
            "elapsed_s": f"{self.elapsed:.1f}",
        }
        if self.pending_eval is not None:
            row.update(heldout_loss=f"{self.pending_eval['loss']:.5f}", heldout_ppl=f"{self.pending_eval['ppl']:.3f}")
            if self.args.progress and self.is_main:
                print(
                    f"step {step}: held-out loss {self.pending_eval['loss']:.4f}, ppl {self.pending_eval['ppl']:.2f}",
                    flush=True,
                )
            self.pending_eval = None
        if self.is_main:
            append_log_row(self.out / "log.csv", row)
        self.window_start, self.window_steps = time.perf_counter(), 0

    def run_state(self, step: int) -> dict:
        return {
            "step": step,
            "tokens": self.tokens(step),
            "elapsed_s": self.elapsed,
            "train_loss": self.train_loss,
            "heldout": self.last_eval,
            "num_processes": self.num_processes,
            "rows_per_step": self.args.rows_per_step(self.num_processes),
            "data_shards": self.data_shards,
            "loss_history": self.spikes.history,
            "loss_spike_steps": self.spikes.steps,
            "args": dataclasses.asdict(self.args),
        }

    def on_save(self, args, state, control, **kwargs):
        if self.is_main:  # after Trainer's files: a checkpoint without it is one a killed run did not finish
            folder = self.out / f"checkpoint-{state.global_step}"
            write_text(folder / RUN_STATE, json.dumps(self.run_state(state.global_step), indent=2) + "\n")


__all__ = [
    "RunCallback",
    "LOG_FIELDS",
    "SPIKE_FACTOR",
    "SPIKE_MIN_HISTORY",
    "SPIKE_WINDOW",
    "LossSpikes",
    "append_log_row",
    "evaluate",
    "plot_losses",
    "truncate_log",
    "unigram_perplexity",
]
