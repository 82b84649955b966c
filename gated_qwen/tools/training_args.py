"""The arguments of a training run (:class:`TrainingArguments`), importable without torch.

Kept apart from :mod:`gated_qwen.tools.training` (as transformers keeps ``TrainingArguments`` apart from its
``Trainer``) so that ``gated-qwen train --help`` shows the defaults without importing torch.
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import GatedQwenError


DEFAULT_VOCAB_SIZE = 4096  # of the BPE trained when no tokenizer is given
TRAINABLE = ("all", "gate")  # what --trainable accepts: every parameter, or the gate rows of q_proj


# What fixes the rows a run reads and the model it starts from: a resumed run must give the same values.
RUN_DATA_KEYS = (
    "train_file",
    "dataset",
    "dataset_config",
    "split",
    "text_field",
    "streaming",
    "shuffle_buffer",
    "seed",
    "seq_len",
    "gate",
    "config",
    "max_steps",
    "max_tokens",
    "init_from",
    "init_from_subfolder",
    "init_from_revision",
    "gate_init",
    "trainable",
    "gate_lr_scale",
)


class TrainingError(GatedQwenError):
    """Training inputs that cannot work: missing data, a clashing output folder, a bad resume folder."""


@dataclasses.dataclass
class TrainingArguments:
    """Everything one training run depends on; saved as ``train_args.json`` in the output folder.

    >>> args = TrainingArguments(train_file="train.jsonl", output_dir="runs/x", max_steps=10)
    >>> args.tokens_per_step(num_processes=1)
    4096
    """

    train_file: str | None  # local .jsonl/.json/.parquet/.txt file(s), comma-separated; or None with `dataset`
    output_dir: str
    heldout_file: str | None = None
    # Hugging Face `datasets` input (see training.data): a hub data set or a local folder instead of train_file
    dataset: str | None = None
    dataset_config: str | None = None
    split: str = "train"
    heldout_split: str | None = None  # a split of `dataset` to evaluate on, instead of heldout_file
    text_field: str = "text"
    streaming: bool = (
        False  # True: read the data as it trains (datasets streaming); False: through datasets' Arrow cache
    )
    data_shards: int | None = None  # the data is read as this many shards (None: 1, streamed one per process); data.py
    shuffle_buffer: int = 1000  # streaming: documents in the shuffle buffer of each shard
    config: str | None = (
        None  # a config.json (e.g. configs/small_4M.json; an MoE one by model_type); None: Qwen3GatedConfig defaults + flags
    )
    gate: str | None = None  # none/headwise/elementwise; overrides the config's gate flags
    tokenizer: str | None = None  # a tokenizer folder; None: train a byte-level BPE of vocab_size
    vocab_size: int | None = None  # of the BPE to train; None: DEFAULT_VOCAB_SIZE
    seq_len: int = 256
    batch_size: int = 16
    max_steps: int | None = None
    max_tokens: int | None = None  # the token budget; sets max_steps when max_steps is None
    learning_rate: float = 3e-3
    min_lr_rate: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    adam_betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: float = 1.0
    precision: str = "auto"  # auto (bf16 on a GPU that has it, else fp32), bf16, fp32
    eval_every: int = 100
    eval_rows: int = 64  # held-out rows per evaluation (the first ones, always the same)
    save_every: int = 0  # 0: only at the end
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = False
    fsdp: str | None = None  # transformers TrainingArguments.fsdp, e.g. "full_shard auto_wrap" (GPUs only)
    fsdp_config: str | None = None  # a JSON file or string, as transformers' --fsdp_config
    deepspeed: str | None = None  # a DeepSpeed JSON config, as transformers' --deepspeed
    report_to: str = "none"  # transformers' report_to: none, all, tensorboard, wandb, ...
    seed: int = 0
    threads: int | None = None  # torch CPU threads
    overwrite: bool = False
    progress: bool = True
    # Continuing a checkpoint instead of training from scratch (see training.load_initial_model, parameter_groups).
    init_from: str | None = (
        None  # a Qwen3 / Qwen3Gated / Qwen3-MoE / Qwen3MoeGated checkpoint folder or hub id; its tokenizer is kept
    )
    init_from_subfolder: str = ""
    init_from_revision: str | None = None
    gate_init: str | None = None  # identity/random: how `gate` converts init_from (default identity)
    trainable: str = "all"  # all, or gate: only the gate rows of q_proj (weight and bias) are trained
    gate_lr_scale: float = 1.0  # the gate rows learn at learning_rate * gate_lr_scale

    def rows_per_step(self, num_processes: int = 1) -> int:
        """The global batch: rows of seq_len tokens per optimizer step, over every process."""
        return self.batch_size * self.gradient_accumulation_steps * num_processes

    def tokens_per_step(self, num_processes: int = 1) -> int:
        return self.rows_per_step(num_processes) * self.seq_len

    def total_steps(self, num_processes: int = 1) -> int:
        if self.max_steps is not None:
            return self.max_steps
        if self.max_tokens is None:
            raise TrainingError("give a budget: max_steps (--max-steps) or max_tokens (--max-tokens)")
        return math.ceil(self.max_tokens / self.tokens_per_step(num_processes))


__all__ = ["DEFAULT_VOCAB_SIZE", "RUN_DATA_KEYS", "TRAINABLE", "TrainingArguments", "TrainingError"]
