"""The arguments of a training run (:class:`TrainRunArguments`), importable without torch.

Kept apart from :mod:`gated_qwen.tools.training.trainer` (as transformers keeps ``TrainingArguments`` apart from its
``Trainer``) so that ``gated-qwen train --help`` shows the defaults without importing torch.
"""

from __future__ import annotations

import dataclasses
import math

from ...errors import GatedQwenError
from ...utils.names import (
    CONVERSION_INITS,
    GATE_TYPES,
    GATE_VARIANT_CHOICES,
    GATE_VARIANT_DEFAULTS,
    GATE_VARIANT_HELP,
)


DEFAULT_VOCAB_SIZE = 4096  # of the BPE trained when no tokenizer is given
TRAINABLE = ("all", "gate")  # what --trainable accepts: every parameter, or the gate rows of q_proj
PRECISIONS = ("auto", "bf16", "fp32")


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
    "gate_position",
    "gate_shared_across_heads",
    "gate_activation",
    "gate_combination",
    "gate_input",
    "attn_output_transform",
    "sandwich_norm",
)


class TrainingError(GatedQwenError):
    """Training inputs that cannot work: missing data, a clashing output folder, a bad resume folder."""


def _option(default=None, help: str = "", group: str = "run", **metadata):
    """A field of :class:`TrainRunArguments` with what its command-line option needs (``gated-qwen train``).

    ``metadata`` keys, read by :func:`gated_qwen.cli.train.add_dataclass_arguments` (which follows transformers'
    ``HfArgumentParser``): ``help``, ``aliases`` (other spellings accepted), ``choices``, ``metavar``, ``group``
    (the help section), ``exclusive`` (a required mutually exclusive group), ``negatable`` (a bool with ``--no-``),
    ``cli=False`` (not on the command line), ``at_least`` (the least value, checked whenever the arguments are made),
    ``trainer=True`` (a field of transformers' ``TrainingArguments`` by the same name, passed to it as it is).
    """
    metadata = {"help": help, "group": group, **metadata}
    if default is dataclasses.MISSING:  # a field every run gives
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


_DEFAULT = " (default %(default)s)"


def _variant_option(key: str):
    """The field of a design-space key (``--gate-position``, ``--sandwich-norm``, ...): its default, help and
    choices from the tables in :mod:`gated_qwen.utils.names`, which convert and bench read too."""
    default = GATE_VARIANT_DEFAULTS[key]
    if isinstance(default, bool):
        return _option(default, help=GATE_VARIANT_HELP[key], group="model")
    return _option(default, help=GATE_VARIANT_HELP[key] + _DEFAULT, group="model", choices=GATE_VARIANT_CHOICES[key])


@dataclasses.dataclass
class TrainRunArguments:
    """Everything one training run depends on; saved as ``train_args.json`` in the output folder.

    Named so as not to shadow transformers' ``TrainingArguments``, which :func:`gated_qwen.tools.training.train`
    builds from it (``_hf_arguments``): a module using both needs no ``as``. It holds what a gated run needs
    beside Trainer's options (data, model, gate) and the Trainer options the command offers: those marked
    ``trainer=True`` pass as they are, the others (batch size, schedule, precision, ...) are translated. Each
    field is also the definition of its ``gated-qwen train`` option (its metadata: help, aliases, choices), from
    which the command line is derived.

    >>> args = TrainRunArguments(train_file="train.jsonl", output_dir="runs/x", max_steps=10)
    >>> args.tokens_per_step(num_processes=1)
    4096
    >>> TrainRunArguments(train_file="train.jsonl", output_dir="runs/x", max_steps=10, batch_size=0)
    Traceback (most recent call last):
    ...
    gated_qwen.tools.training.arguments.TrainingError: --batch-size must be at least 1, not 0
    """

    # local .jsonl/.json/.parquet/.txt file(s), comma-separated; or None with `dataset`
    train_file: str | None = _option(
        dataclasses.MISSING,
        help="training text: local .jsonl/.json/.parquet/.csv file(s) (comma-separated) "
        "with a text field, or .txt (one document per file)",
        group="data",
        exclusive="source",
    )
    output_dir: str = _option(
        dataclasses.MISSING, help="output folder", aliases=["--out"], required=True, trainer=True
    )
    heldout_file: str | None = _option(
        help="held-out text, same formats; evaluated every --eval-every steps", group="data"
    )
    # Hugging Face `datasets` input (see training.data): a hub data set or a local folder instead of train_file
    dataset: str | None = _option(
        help="training text: a Hugging Face data set (hub id or local folder) read with datasets",
        group="data",
        exclusive="source",
    )
    dataset_config: str | None = _option(help="the --dataset configuration (its name on the hub)", group="data")
    split: str = _option("train", help="the --dataset split to train on" + _DEFAULT, group="data")
    heldout_split: str | None = _option(
        help="a --dataset split to evaluate on, instead of --heldout-file", group="data"
    )
    text_field: str = _option("text", help="the field holding the text" + _DEFAULT, group="data")
    # True: read the data as it trains (datasets streaming); False: through datasets' Arrow cache
    streaming: bool = _option(
        False,
        help="stream the data as it trains, its documents shuffled in a buffer (--shuffle-buffer): for data "
        "larger than the disk, or a hub data set not to download first. Default --no-streaming: datasets' Arrow "
        "cache (memory-mapped), each shard packed once into rows that every epoch permutes",
        group="data",
        negatable=True,
    )
    data_shards: int | None = _option(
        help="read the data as N shards, the global stream taking one row of each in turn and process r of W its "
        "rows r, r+W, ... (default: 1; streamed, one per process, N a multiple of W); runs with the same N see the "
        "same rows per step whatever their process count",
        group="data",
        metavar="N",
        at_least=1,
    )
    shuffle_buffer: int = _option(
        1000, help="--streaming: documents in each shard's shuffle buffer" + _DEFAULT, group="data", at_least=1
    )
    # a config.json (e.g. configs/small_4M.json; an MoE one by model_type); None: Qwen3GatedConfig defaults + flags
    config: str | None = _option(
        help="from scratch: a config.json for the architecture, e.g. configs/small_4M.json "
        "(model_type qwen3_moe or qwen3_moe_gated: a mixture of experts)",
        group="model",
    )
    gate: str | None = _option(
        help="from scratch: the gate (overrides the config); with --init-from: convert a checkpoint "
        "without a gate to this one",
        group="model",
        choices=GATE_TYPES,
    )
    gate_position: str = _variant_option("gate_position")
    gate_shared_across_heads: bool = _variant_option("gate_shared_across_heads")
    gate_activation: str = _variant_option("gate_activation")
    gate_combination: str = _variant_option("gate_combination")
    gate_input: str = _variant_option("gate_input")
    attn_output_transform: str = _variant_option("attn_output_transform")
    sandwich_norm: bool = _variant_option("sandwich_norm")
    tokenizer: str | None = _option(
        help="from scratch: a tokenizer folder to use instead of training one", group="data"
    )
    vocab_size: int | None = _option(
        help=f"from scratch: BPE vocabulary to train (default {DEFAULT_VOCAB_SIZE})", group="data", at_least=1
    )
    seq_len: int = _option(256, help="tokens per row" + _DEFAULT, group="data", at_least=1)
    batch_size: int = _option(
        16, help="rows per step per process and accumulation step" + _DEFAULT, group="optimisation", at_least=1
    )
    max_steps: int | None = _option(help="optimizer steps", group="optimisation", exclusive="budget", at_least=1)
    # the token budget; sets max_steps when max_steps is None
    max_tokens: int | None = _option(
        help="token budget (sets the steps)", group="optimisation", exclusive="budget", at_least=1
    )
    learning_rate: float = _option(
        3e-3, help="peak learning rate" + _DEFAULT, group="optimisation", aliases=["--lr"], trainer=True
    )
    min_lr_rate: float = _option(0.1, help="final lr / peak lr" + _DEFAULT, group="optimisation")
    warmup_steps: int = _option(100, help="linear warmup" + _DEFAULT, group="optimisation")
    weight_decay: float = _option(0.1, help="AdamW weight decay" + _DEFAULT, group="optimisation", trainer=True)
    adam_betas: tuple[float, float] = _option((0.9, 0.95), cli=False)
    max_grad_norm: float = _option(1.0, help="gradient clipping" + _DEFAULT, group="optimisation", trainer=True)
    # auto (bf16 on a GPU that has it, else fp32), bf16, fp32
    precision: str = _option(
        "auto",
        help="auto: bf16 autocast on a GPU that supports it, else fp32" + _DEFAULT,
        group="optimisation",
        choices=PRECISIONS,
    )
    eval_every: int = _option(100, help="steps between evaluations" + _DEFAULT, at_least=1)
    # held-out rows per evaluation (the first ones, always the same)
    eval_rows: int = _option(64, help="held-out rows per evaluation" + _DEFAULT, at_least=1)
    save_every: int = _option(0, help="steps between checkpoints; 0: at the end only")
    gradient_accumulation_steps: int = _option(
        1,
        help="batches accumulated into one optimizer step" + _DEFAULT,
        group="optimisation",
        metavar="N",
        at_least=1,
        trainer=True,
    )
    gradient_checkpointing: bool = _option(
        False, help="recompute activations in the backward pass", group="optimisation"
    )
    # transformers TrainingArguments.fsdp, e.g. "full_shard auto_wrap" (GPUs only)
    fsdp: str | None = _option(
        help='transformers\' --fsdp, e.g. "full_shard auto_wrap" (needs GPUs: accelerate enables FSDP only there)',
        metavar="OPTIONS",
    )
    fsdp_config: str | None = _option(help="transformers' --fsdp_config: a JSON file or string", metavar="JSON")
    deepspeed: str | None = _option(
        help="a DeepSpeed JSON config, as transformers' --deepspeed", metavar="JSON", trainer=True
    )
    report_to: str = _option(
        "none", help="where Trainer also logs: none, all, tensorboard, wandb, ..." + _DEFAULT, trainer=True
    )
    seed: int = _option(0, help="weights and data order" + _DEFAULT, group="optimisation", trainer=True)
    threads: int | None = _option(help="torch CPU threads")
    overwrite: bool = _option(False, help="replace a non-empty --out")
    progress: bool = _option(True, help="a progress bar (--no-progress: none)", negatable=True)
    # Continuing a checkpoint instead of training from scratch (see training.load_initial_model, parameter_groups).
    init_from: str | None = _option(
        help="continue this Qwen3, Qwen3Gated, Qwen3-MoE or Qwen3MoeGated checkpoint (folder or hub id) "
        "with its tokenizer, instead of training from scratch",
        group="model",
        metavar="CHECKPOINT",
    )
    init_from_subfolder: str = _option(
        "", help="the --init-from checkpoint's subfolder (e.g. 1B_baseline)", group="model", aliases=["--subfolder"]
    )
    init_from_revision: str | None = _option(
        help="the --init-from checkpoint's hub revision", group="model", aliases=["--revision"]
    )
    # identity/random: how `gate` converts init_from (default identity)
    gate_init: str | None = _option(
        help="how --gate converts the --init-from checkpoint: identity (zero gate rows, the same "
        "outputs; the default) or random",
        group="model",
        choices=CONVERSION_INITS,
        aliases=["--init"],
    )
    trainable: str = _option(
        "all",
        help="all parameters, or only the gate rows of q_proj and their bias" + _DEFAULT,
        group="model",
        choices=TRAINABLE,
    )
    gate_lr_scale: float = _option(
        1.0, help="learning rate of the gate rows: --lr times X" + _DEFAULT, group="model", metavar="X"
    )

    def __post_init__(self):
        # a count below its least value would only fail later, some (batch_size=0) by exhausting the memory
        for field in dataclasses.fields(self):
            bound, value = field.metadata.get("at_least"), getattr(self, field.name)
            if bound is not None and value is not None and value < bound:
                raise TrainingError(f"--{field.name.replace('_', '-')} must be at least {bound}, not {value}")

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


__all__ = [
    "DEFAULT_VOCAB_SIZE",
    "PRECISIONS",
    "RUN_DATA_KEYS",
    "TRAINABLE",
    "TrainRunArguments",
    "TrainingError",
]
