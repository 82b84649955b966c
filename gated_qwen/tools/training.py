"""Train a Qwen3Gated model on plain text: from scratch, or continuing a Qwen3 / Qwen3Gated checkpoint.

The pieces, each usable alone:

* :func:`read_documents` reads ``.jsonl`` (one ``{"text": ...}`` per line) or ``.txt`` (one document per file);
* :func:`train_tokenizer` trains a byte-level BPE with the tokenizers library;
* :func:`pack_documents` tokenizes documents into one stream, an end-of-text token after each, and
  :class:`PackedBatches` cuts it into fixed-length rows in a seeded order that depends only on the seed and
  the step, so "the data position" of a checkpoint is just its step;
* :func:`evaluate` gives held-out loss and perplexity, :func:`unigram_perplexity` the floor a model that
  ignores context reaches on the same tokens;
* :func:`train` runs AdamW with linear warmup and cosine decay, gradient clipping, bf16 autocast on devices
  that support it, and an :class:`accelerate.Accelerator`, so the same code runs on CPU, one GPU, or several
  under ``accelerate launch`` (data parallel: each process takes its rows of every global batch). It logs to
  ``log.csv``, plots ``loss.png`` when matplotlib is installed, saves ``checkpoint-STEP/`` folders that
  :func:`train` resumes from (model, optimizer, scheduler and RNG through ``Accelerator.save_state``, step and
  tokens in ``trainer_state.json``), and the trained model with its tokenizer in ``final/``;
* :func:`load_initial_model` continues a checkpoint instead (``init_from``), converting a model without a
  gate on the fly (:func:`gated_qwen.transforms.conversion.convert_qwen3_to_gated`), and :func:`parameter_groups`
  trains all of it or only the gate rows of q_proj (``trainable="gate"``), the gate rows at their own
  learning rate (``gate_lr_scale``).

Two runs with the same seed, data, token budget and architecture see the same rows in the same order, with
weights initialised from the same seed, so arms that differ only in ``gate`` are a matched comparison.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import pickle
import time
from pathlib import Path

import torch

from ..models.qwen3_gated.configuration_qwen3_gated import Qwen3GatedConfig
from ..errors import GatedQwenError
from ..checkpoint.outputs import OutputError, OutputFolder, output_file, resolve_destination, write_text
from .training_args import DEFAULT_VOCAB_SIZE, TRAINABLE, TrainingArguments, TrainingError

from transformers.utils import logging


logger = logging.get_logger(__name__)

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
LOG_FIELDS = ("step", "tokens", "lr", "train_loss", "heldout_loss", "heldout_ppl", "tokens_per_s", "elapsed_s")


def read_documents(path: str | Path) -> list[str]:
    """The documents of a ``.jsonl`` file (its ``"text"`` fields) or a ``.txt`` file (the whole file).

    >>> read_documents("data/stdlib_docstrings/train.jsonl")[0][:6]  # doctest: +SKIP
    'Record'
    """
    path = Path(path)
    if not path.is_file():
        raise TrainingError(f"{path} does not exist; build the corpus with `python scripts/prepare_corpus.py`")
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".jsonl":
        return [text]
    documents = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            documents.append(json.loads(line)["text"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise TrainingError(f'{path}:{number} is not a JSON object with a "text" field') from None
    if not documents:
        raise TrainingError(f"{path} holds no documents")
    return documents


def train_tokenizer(documents: list[str], vocab_size: int):
    """A byte-level BPE tokenizer (transformers fast tokenizer) trained on ``documents``.

    It has ``<|endoftext|>`` (end of document, also the eos token) and ``<|pad|>``, and decodes bytes
    exactly, so any text round-trips.

    >>> tokenizer = train_tokenizer(["def add(a, b):\\n    return a + b\\n"] * 4, vocab_size=300)
    >>> tokenizer.decode(tokenizer("return a + b").input_ids)
    'return a + b'
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 2:
        raise TrainingError(f"vocab_size {vocab_size} is too small: a byte-level BPE needs at least {len(alphabet) + 2}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS_TOKEN, PAD_TOKEN], initial_alphabet=alphabet, show_progress=False
    )
    tokenizer.train_from_iterator(documents, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)


def pack_documents(documents: list[str], tokenizer) -> torch.Tensor:
    """All documents as one token stream, the eos token after each: a 1-D int64 tensor.

    >>> tokenizer = train_tokenizer(["ab ab ab"], vocab_size=260)
    >>> pack_documents(["ab", "ab"], tokenizer).tolist() == [*tokenizer("ab").input_ids, 0] * 2
    True
    """
    if tokenizer.eos_token_id is None:
        raise TrainingError("the tokenizer has no eos token; documents need one to be packed into a stream")
    ids: list[int] = []
    for encoded in tokenizer(documents, add_special_tokens=False).input_ids:
        ids.extend(encoded)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


class PackedBatches:
    """Fixed-length rows of a token stream, in an order fixed by the seed; batch ``step`` is a pure function.

    The stream is cut into ``len // seq_len`` non-overlapping rows. Each pass over them (an epoch) is a
    permutation drawn from ``seed + epoch``, and global batch ``step`` takes the next ``global_batch`` rows
    of that sequence, so resuming at a step needs no iterator state, and any two runs with the same
    seed, data and batch shape see the same rows in the same order.

    >>> data = PackedBatches(torch.arange(40), seq_len=4, global_batch=2, seed=0)
    >>> data.batch(0).shape, len(data)
    (torch.Size([2, 4]), 10)
    """

    def __init__(self, stream: torch.Tensor, seq_len: int, global_batch: int, seed: int):
        rows = len(stream) // seq_len
        if rows < global_batch:
            raise TrainingError(
                f"the training text has {len(stream)} tokens, fewer than one batch of {global_batch} rows of "
                f"{seq_len}; give more text or lower --batch-size / --seq-len"
            )
        self.rows = stream[: rows * seq_len].view(rows, seq_len)  # (N, T)
        self.global_batch = global_batch
        self.seed = seed

    def __len__(self) -> int:
        return len(self.rows)

    def _order(self, epoch: int) -> torch.Tensor:
        return torch.randperm(len(self.rows), generator=torch.Generator().manual_seed(self.seed + epoch))

    def batch(self, step: int) -> torch.Tensor:
        """The ``global_batch`` rows of global step ``step``: (global_batch, seq_len)."""
        start = step * self.global_batch
        picked = []
        while len(picked) < self.global_batch:
            epoch, offset = divmod(start + len(picked), len(self.rows))
            order = self._order(epoch)
            picked.extend(order[offset : offset + self.global_batch - len(picked)].tolist())
        return self.rows[picked]


def heldout_rows(stream: torch.Tensor, seq_len: int, max_rows: int | None = None) -> torch.Tensor:
    """The first ``max_rows`` non-overlapping rows of a held-out stream, in order: (N, seq_len)."""
    rows = len(stream) // seq_len
    if rows == 0:
        raise TrainingError(f"the held-out text has {len(stream)} tokens, fewer than one row of {seq_len}")
    rows = rows if max_rows is None else min(rows, max_rows)
    return stream[: rows * seq_len].view(rows, seq_len)


@torch.no_grad()
def evaluate(model, rows: torch.Tensor, batch_size: int = 16) -> dict:
    """Mean next-token loss (nats) and perplexity over every predicted token of ``rows`` (N, T).

    Each row is scored on its own: tokens 1..T-1 given the ones before them in the row.

    >>> evaluate(model, heldout_rows(stream, 256, 32))  # doctest: +SKIP
    {'loss': 2.91, 'ppl': 18.4, 'tokens': 8160}
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


def _config_values(args: TrainingArguments) -> dict:
    """The keys of ``args.config`` (or none: the defaults) with the gate of ``args.gate``."""
    values = {}
    if args.config:
        path = Path(args.config)
        if not path.is_file():
            raise TrainingError(f"config {path} does not exist; pass a config.json such as configs/small_4M.json")
        try:
            values = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise TrainingError(f"config {path} is not valid JSON: {error}") from None
    values.pop("model_type", None)
    values.pop("architectures", None)
    if args.gate is not None:
        from ..models.layout import GATE_TYPES

        if args.gate not in GATE_TYPES:
            raise TrainingError(f"unknown gate {args.gate!r}; expected one of {', '.join(GATE_TYPES)}")
        values["headwise_attn_output_gate"] = args.gate == "headwise"
        values["elementwise_attn_output_gate"] = args.gate == "elementwise"
    return values


def build_config(args: TrainingArguments, tokenizer) -> Qwen3GatedConfig:
    """The model config: ``args.config`` (or defaults), the gate of ``args.gate``, the tokenizer's vocabulary
    and special tokens, and room for ``seq_len`` positions."""
    values = _config_values(args)
    values.update(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_position_embeddings=max(values.get("max_position_embeddings", 0), args.seq_len),
    )
    return _make_config(args, values)


def _make_config(args: TrainingArguments, values: dict) -> Qwen3GatedConfig:
    try:
        return Qwen3GatedConfig(**values)
    except (TypeError, ValueError) as error:
        raise TrainingError(f"config {args.config or '(defaults)'} is not a valid Qwen3Gated config: {error}") from None


# ----------------------------------------------------------------------------------------------
# Continuing a checkpoint: which model, which parameters train


def check_arguments(args: TrainingArguments) -> None:
    """Refuse option combinations that cannot mean anything, before anything is read or written.

    >>> check_arguments(TrainingArguments(train_file="t.jsonl", output_dir="o", max_steps=1, gate_init="random"))
    Traceback (most recent call last):
    ...
    gated_qwen.tools.training_args.TrainingError: --init says how --gate converts the --init-from checkpoint; give --init-from and --gate with it, or leave --init out
    """
    from ..utils.names import CONVERSION_INITS as INITS

    if args.trainable not in TRAINABLE:
        raise TrainingError(f"unknown --trainable {args.trainable!r}; expected one of {', '.join(TRAINABLE)}")
    if not (math.isfinite(args.gate_lr_scale) and args.gate_lr_scale > 0):
        raise TrainingError(f"--gate-lr-scale must be a positive number, got {args.gate_lr_scale}")
    if args.gate_init is not None and args.gate_init not in INITS:
        raise TrainingError(f"unknown --init {args.gate_init!r}; expected one of {', '.join(INITS)}")
    if args.gate_init is not None and (args.init_from is None or args.gate is None):
        raise TrainingError(
            "--init says how --gate converts the --init-from checkpoint; give --init-from and --gate with it, or leave --init out"
        )
    if args.init_from is None:
        for value, flag in ((args.init_from_subfolder, "--subfolder"), (args.init_from_revision, "--revision")):
            if value:
                raise TrainingError(f"{flag} applies to the --init-from checkpoint; give --init-from, or leave {flag} out")
        if args.trainable == "gate":
            raise TrainingError(
                "--trainable gate trains only the gate of a pretrained model; give the model with --init-from "
                "(from scratch, train all parameters)"
            )
        return
    for value, flag in ((args.config, "--config"), (args.tokenizer, "--tokenizer"), (args.vocab_size, "--vocab-size")):
        if value is not None:
            raise TrainingError(
                f"{flag} does not apply with --init-from: the architecture and the tokenizer are the checkpoint's; leave {flag} out"
            )
    if args.gate == "none":
        raise TrainingError(
            "--gate with --init-from converts a checkpoint without a gate into a gated one; "
            "'none' converts nothing: leave --gate out to continue the checkpoint as it is"
        )


def read_init_config(args: TrainingArguments) -> Qwen3GatedConfig:
    """The config of the model training will start from: ``args.init_from``'s, converted to ``args.gate``.

    Only config.json is read (for a hub id, only it is downloaded). Refuses a gate conversion of a
    checkpoint that has a gate, and ``trainable="gate"`` or a ``gate_lr_scale`` for a model without one.

    >>> read_init_config(TrainingArguments(train_file="t.jsonl", output_dir="o", max_steps=1,
    ...                                    init_from="gated_qwen/default_models/baseline", gate="headwise")).gate_type  # doctest: +SKIP
    'headwise'
    """
    from .generation import local_checkpoint_folder

    source = args.init_from + (f" (subfolder {args.init_from_subfolder})" if args.init_from_subfolder else "")
    # one clear error for a missing folder, an unknown or unreachable hub repository
    local_checkpoint_folder(args.init_from, args.init_from_subfolder, args.init_from_revision)
    try:
        config = Qwen3GatedConfig.from_pretrained(
            args.init_from, subfolder=args.init_from_subfolder, revision=args.init_from_revision
        )
    except (OSError, ValueError) as error:
        if isinstance(error, GatedQwenError):
            raise
        reason = " ".join(str(error).split())
        raise TrainingError(f"cannot read the config of {source}: {reason}") from None
    if args.gate is not None:
        if config.gate_type != "none":
            raise TrainingError(
                f"{source} already has a {config.gate_type} gate; --gate converts a checkpoint without one. "
                "Leave --gate out to continue training it as it is"
            )
        config.headwise_attn_output_gate = args.gate == "headwise"
        config.elementwise_attn_output_gate = args.gate == "elementwise"
    _check_gate_options(args, config.gate_type, f"{source} has no gate")
    return config


def _check_gate_options(args: TrainingArguments, gate_type: str, no_gate: str) -> None:
    if gate_type != "none":
        return
    hint = "add --gate headwise or --gate elementwise to convert it" if args.init_from else "choose a gate with --gate"
    if args.trainable == "gate":
        raise TrainingError(f"{no_gate}, so --trainable gate would train nothing; {hint}")
    if args.gate_lr_scale != 1.0:
        raise TrainingError(f"{no_gate}, so --gate-lr-scale has nothing to scale; {hint}, or leave --gate-lr-scale out")


def load_initial_model(args: TrainingArguments):
    """The model of ``args.init_from`` in float32, converted to ``args.gate`` when that is given.

    Any Qwen3 or Qwen3Gated checkpoint loads (a released arm, a stock Qwen3, one saved here) through
    :meth:`Qwen3GatedForCausalLM.from_pretrained`, which never runs code from the checkpoint. The
    weights train in float32 whatever dtype the checkpoint stores. The conversion
    (:func:`gated_qwen.transforms.conversion.convert_qwen3_to_gated`) draws a random gate init right after
    ``torch.manual_seed(args.seed)``, so the same seed gives the same model again.

    >>> model = load_initial_model(TrainingArguments(train_file="t.jsonl", output_dir="o", max_steps=1,
    ...                            init_from="gated_qwen/default_models/baseline", gate="headwise"))  # doctest: +SKIP
    >>> model.config.gate_type  # doctest: +SKIP
    'headwise'
    """
    from ..transforms.conversion import convert_qwen3_to_gated
    from ..models.qwen3_gated.modeling_qwen3_gated import Qwen3GatedForCausalLM

    model = Qwen3GatedForCausalLM.from_pretrained(
        args.init_from, subfolder=args.init_from_subfolder, revision=args.init_from_revision, dtype=torch.float32
    )
    if args.gate is not None:
        torch.manual_seed(args.seed)
        model = convert_qwen3_to_gated(model, gate=args.gate, init=args.gate_init or "identity")
    return model


class QueryAndGateRows(torch.nn.Module):
    """A ``torch.nn.utils.parametrize`` parametrization of q_proj's weight (or bias) as two tensors.

    ``right_inverse`` splits the fused rows into the query rows and the gate rows (each flattened to
    ``(rows, *inputs)``, so a weight stays a matrix and a bias a vector); ``forward`` merges them back
    in the released layout. Both go through :mod:`gated_qwen.models.layout`. The gate rows so become a
    Parameter of their own, which an optimizer can treat apart from the rest of q_proj.

    >>> rows = QueryAndGateRows(num_key_value_heads=2, head_dim=4, gate_dim=1)
    >>> fused = torch.arange(20.0)                            # K=2 groups of G=2 heads: 16 query + 4 gate rows
    >>> query, gate = rows.right_inverse(fused)
    >>> gate.tolist(), torch.equal(rows(query, gate), fused)
    ([8.0, 9.0, 18.0, 19.0], True)
    """

    def __init__(self, num_key_value_heads: int, head_dim: int, gate_dim: int):
        super().__init__()
        self.num_key_value_heads, self.head_dim, self.gate_dim = num_key_value_heads, head_dim, gate_dim

    def forward(self, query_rows: torch.Tensor, gate_rows: torch.Tensor) -> torch.Tensor:
        from ..models.layout import merge_query_and_gate

        query = query_rows.unflatten(0, (self.num_key_value_heads, -1, self.head_dim))  # (K, G, D, *inputs)
        gate = gate_rows.unflatten(0, (self.num_key_value_heads, -1, self.gate_dim))  # (K, G, g, *inputs)
        return merge_query_and_gate(query, gate, dim=0)

    def right_inverse(self, fused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from ..models.layout import split_query_and_gate

        query, gate = split_query_and_gate(fused, self.num_key_value_heads, self.head_dim, self.gate_dim, dim=0)
        return query.flatten(0, 2).clone(), gate.flatten(0, 2).clone()


def _gated_q_projs(model) -> list[tuple[torch.nn.Module, QueryAndGateRows]]:
    from ..models.qwen3_gated.modeling_qwen3_gated import Qwen3GatedAttention

    return [
        # K from the key projection, as the attention itself reads it
        (module.q_proj, QueryAndGateRows(module.k_proj.out_features // module.head_dim, module.head_dim, module.gate_dim))
        for module in model.modules()
        if isinstance(module, Qwen3GatedAttention) and module.gate_dim
    ]


def separate_gate_rows(model) -> list[torch.nn.Parameter]:
    """Give the gate rows of every gated q_proj (weight and bias) a Parameter of their own; returns them.

    Registers :class:`QueryAndGateRows` on q_proj's ``weight`` and ``bias``: q_proj then computes with
    the merged rows as before (same values, same layout), while its query rows and its gate rows are
    two Parameters (``q_proj.parametrizations.weight.original0`` and ``original1``).
    :func:`merge_gate_rows` undoes it. A model without a gate is left as it is.

    >>> gate_rows = separate_gate_rows(model)  # doctest: +SKIP
    >>> merge_gate_rows(model)  # doctest: +SKIP
    """
    from torch.nn.utils import parametrize

    gate_rows = []
    for q_proj, rows in _gated_q_projs(model):
        for name in ("weight", "bias"):
            if getattr(q_proj, name) is not None:
                parametrize.register_parametrization(q_proj, name, rows)
                gate_rows.append(q_proj.parametrizations[name].original1)
    return gate_rows


def merge_gate_rows(model) -> None:
    """Undo :func:`separate_gate_rows`: each q_proj holds one plain weight (and bias) again, as saved."""
    from torch.nn.utils import parametrize

    for module in model.modules():
        if parametrize.is_parametrized(module):
            for name in list(module.parametrizations):
                parametrize.remove_parametrizations(module, name, leave_parametrized=True)


def parameter_groups(model, args: TrainingArguments) -> list[dict]:
    """AdamW parameter groups: matrices with weight decay, vectors (norms, biases) without.

    With ``args.trainable == "gate"`` only the gate rows of q_proj are in them and every other
    parameter is frozen (``requires_grad=False``), the rest of q_proj included; with a
    ``gate_lr_scale`` other than 1 the gate rows form groups of their own at that multiple of the
    learning rate. Either way :func:`separate_gate_rows` first gives the gate rows a Parameter of
    their own: an optimizer, weight decay included, then never touches what it does not hold, so
    every frozen value stays bit for bit as it was (zeroing gradients would not: AdamW's decoupled
    decay and its momentum move a parameter whose gradient is zero). Each group carries its
    ``lr_scale``; the scheduler multiplies every group's own rate.

    >>> groups = parameter_groups(model, TrainingArguments(train_file="t", output_dir="o", max_steps=1, trainable="gate"))  # doctest: +SKIP
    >>> [group["lr_scale"] for group in groups]  # doctest: +SKIP
    [1.0, 1.0]
    """
    apart = args.trainable == "gate" or args.gate_lr_scale != 1.0
    gate_rows = separate_gate_rows(model) if apart else []
    gate_ids = {id(p) for p in gate_rows}
    others = [p for p in model.parameters() if id(p) not in gate_ids]
    if args.trainable == "gate":
        for p in others:
            p.requires_grad_(False)
        others = []
    groups = [
        {"params": [p for p in others if p.dim() >= 2], "weight_decay": args.weight_decay, "lr_scale": 1.0},
        {"params": [p for p in others if p.dim() < 2], "weight_decay": 0.0, "lr_scale": 1.0},
        {"params": [p for p in gate_rows if p.dim() >= 2], "weight_decay": args.weight_decay, "lr_scale": args.gate_lr_scale},
        {"params": [p for p in gate_rows if p.dim() < 2], "weight_decay": 0.0, "lr_scale": args.gate_lr_scale},
    ]
    groups = [group for group in groups if group["params"]]
    for group in groups:
        group["lr"] = args.learning_rate * group["lr_scale"]
    return groups


def _resolve_precision(precision: str, accelerator_device: torch.device) -> str:
    if precision == "auto":
        # CPU bf16 autocast exists but is slower than fp32 on most CPUs without AMX, and less exact.
        cuda_bf16 = accelerator_device.type == "cuda" and torch.cuda.is_bf16_supported()
        return "bf16" if cuda_bf16 else "no"
    if precision not in ("bf16", "fp32"):
        raise TrainingError(f"unknown precision {precision!r}; expected auto, bf16 or fp32")
    return "bf16" if precision == "bf16" else "no"


def latest_checkpoint(folder: str | Path) -> Path:
    """``folder`` itself if it is a checkpoint, else its ``checkpoint-STEP`` with the highest step.

    >>> latest_checkpoint("runs/headwise")  # doctest: +SKIP
    PosixPath('runs/headwise/checkpoint-1200')
    """
    folder = Path(folder)
    if (folder / "trainer_state.json").is_file():
        return folder
    found = sorted(folder.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[-1]))
    if not found:
        raise TrainingError(f"{folder} holds no checkpoint (a folder with trainer_state.json); nothing to resume")
    return found[-1].parent


RUN_FILES = ("tokenizer", "train_args.json")  # what a run writes into --out before its first step


def _output_folder(args: TrainingArguments, checkpoint: Path | None) -> OutputFolder:
    """--out, checked before any work (nothing is written yet): the :class:`OutputFolder` of the run's first files.

    A new run needs an empty or missing --out (or --overwrite). A run resumed into the folder of the
    checkpoint it continues keeps that folder and replaces only its tokenizer and train_args.json.
    """
    try:
        out = resolve_destination(args.output_dir)
        if checkpoint is not None and out in (checkpoint.resolve(), checkpoint.resolve().parent):
            if args.overwrite:
                raise TrainingError(f"--overwrite would delete {checkpoint}, which --resume continues from; drop --overwrite")
            return OutputFolder(out, overwrite=True, merge=True, names=RUN_FILES)
        if list(out.glob("checkpoint-*/trainer_state.json")):
            advice = f"pass --resume {args.output_dir} to continue the run in it, or --overwrite to replace it"
        else:
            advice = "it holds no checkpoint to resume from: pass --overwrite to replace it, or choose another --out"
        return OutputFolder(out, overwrite=args.overwrite, advice=advice)
    except OutputError as error:
        raise TrainingError(str(error)) from None


def _save_checkpoint(
    accelerator, out: Path, args, tokenizer, step: int, tokens: int, elapsed: float, train_loss, heldout
) -> None:
    """checkpoint-STEP/ in ``out``, whole or absent: every process saves into one staging folder, put in place at the end."""
    from accelerate.utils import broadcast_object_list

    folder = OutputFolder(out / f"checkpoint-{step}", overwrite=True) if accelerator.is_main_process else None
    staging = [str(folder.open()) if folder is not None else None]
    broadcast_object_list(staging)  # the other processes write their RNG state into the same folder
    staging = Path(staging[0])
    try:
        accelerator.save_state(str(staging), safe_serialization=True)
        if folder is not None:
            # train_loss and heldout let a run resumed at its last step report them (summary.json)
            state = {"step": step, "tokens": tokens, "elapsed_s": elapsed, "train_loss": train_loss, "heldout": heldout,
                     "args": dataclasses.asdict(args)}
            tokenizer.save_pretrained(staging / "tokenizer")
            (staging / "trainer_state.json").write_text(json.dumps(state, indent=2) + "\n")
        accelerator.wait_for_everyone()
    except BaseException:
        if folder is not None:
            folder.discard()
        raise
    if folder is not None:
        folder.commit()
    accelerator.wait_for_everyone()


def _save_model(accelerator, model, tokenizer, out: Path, continued: bool) -> Path:
    from transformers import GenerationConfig

    final = out / "final"
    if accelerator.is_main_process:
        with OutputFolder(final, overwrite=True) as staging:
            unwrapped = accelerator.unwrap_model(model)
            unwrapped.save_pretrained(staging, safe_serialization=True)
            tokenizer.save_pretrained(staging)
            # A model continued from a checkpoint keeps the generation config it was loaded with (save_pretrained
            # wrote it); one trained from scratch has only the defaults derived from its config: give it ours.
            if not continued:
                GenerationConfig(
                    eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.pad_token_id,
                    do_sample=True,
                    temperature=0.8,
                    top_k=50,
                    max_new_tokens=64,
                ).save_pretrained(staging)
    accelerator.wait_for_everyone()
    return final


CHECKPOINT_FILES = ("trainer_state.json", "model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl")


def read_checkpoint(checkpoint: str | Path) -> dict:
    """Check every file of a training checkpoint, without loading it into a model; returns its trainer state.

    Each file must be whole, and the ``.bin``/``.pkl`` files (torch pickles, written by
    ``Accelerator.save_state``) must hold plain data only: they are opened with
    ``torch.load(weights_only=True)`` (memory-mapped, so nothing large is read), which never runs code a
    pickle names. Anything else is a :class:`TrainingError` naming the file and what to do, raised
    before a run writes anything.

    >>> read_checkpoint("runs/headwise/checkpoint-400")["step"]  # doctest: +SKIP
    400
    """
    from accelerate.utils import load
    from safetensors import safe_open

    checkpoint = Path(checkpoint)
    earlier = sorted(
        (p for p in checkpoint.parent.glob("checkpoint-*") if p != checkpoint and (p / "trainer_state.json").is_file()),
        key=lambda p: int(p.name.rpartition("-")[2]) if p.name.rpartition("-")[2].isdigit() else -1,
    )
    advice = f"resume from {earlier[-1]} instead" if earlier else "start again with --overwrite"
    for name in CHECKPOINT_FILES:
        if not (checkpoint / name).is_file():
            raise TrainingError(f"{checkpoint} has no {name}; it is not a whole checkpoint of this package: {advice}")
    state_path = checkpoint / "trainer_state.json"
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TrainingError(f"{state_path} is not readable JSON ({error}); it is damaged: {advice}") from None
    if not isinstance(state, dict) or not {"step", "tokens", "elapsed_s", "args"} <= state.keys():
        raise TrainingError(f"{state_path} lacks step, tokens, elapsed_s or args; it is not this package's: {advice}")
    for path in sorted(checkpoint.iterdir()):
        try:
            if path.suffix == ".safetensors":
                with safe_open(str(path), framework="pt") as handle:
                    handle.keys()
            elif path.suffix in (".bin", ".pkl"):
                load(path, map_location="cpu", weights_only=True, mmap=True)
        except pickle.UnpicklingError as error:
            if "weights only" not in str(error).lower():
                raise TrainingError(f"{path} is damaged or truncated ({type(error).__name__}); {advice}") from None
            raise TrainingError(
                f"{path} holds more than plain tensors (a pickle that would run code or build arbitrary objects); "
                f"it was not loaded. Use checkpoints this package wrote: {advice}"
            ) from None
        except Exception as error:  # safetensors, zip and pickle readers raise several types
            raise TrainingError(f"{path} is damaged or truncated ({_first_sentence(error)}); {advice}") from None
    return state


def _first_sentence(error: Exception) -> str:
    """A library's error message on one line, up to its first full stop (torch's go on for several sentences)."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text.split(". ")[0].rstrip(".")[:200]


def plot_losses(log_path: str | Path, png_path: str | Path) -> Path:
    """Plot train and held-out loss of a ``log.csv`` against tokens into a PNG (needs the ``plot`` extra).

    >>> plot_losses("runs/headwise/log.csv", "runs/headwise/loss.png")  # doctest: +SKIP
    PosixPath('runs/headwise/loss.png')
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise GatedQwenError("plotting needs matplotlib: pip install 'gated-qwen[plot]'") from None
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


def train(args: TrainingArguments, resume: str | Path | None = None) -> dict:
    """Train (or, with ``resume``, continue) a model as ``args`` says; returns a summary dict.

    The model is new (``args.config``, a tokenizer trained on the text or ``args.tokenizer``) or, with
    ``args.init_from``, a checkpoint's, with its tokenizer (:func:`load_initial_model`); which of its
    parameters train, and at which rate, says :func:`parameter_groups`. Every check on the options and
    on the checkpoint comes before the output folder is touched.

    ``resume`` is a checkpoint folder or an output folder (its latest checkpoint is taken); the run
    continues at the saved step with the saved optimizer, scheduler and RNG state, and the data order
    continues where it left off, so the losses equal those of an uninterrupted run. With ``init_from``
    the model is built again as at the start (the checkpoint must still be readable; a random gate
    init is drawn from the seed again), then every weight is replaced by the saved one.

    >>> train(TrainingArguments(train_file="train.jsonl", output_dir="runs/x", max_steps=100))  # doctest: +SKIP
    {'steps': 100, 'tokens': 409600, ...}
    """
    from accelerate import Accelerator, PartialState
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer, get_cosine_with_min_lr_schedule_with_warmup

    from .generation import load_tokenizer
    from ..models.qwen3_gated.modeling_qwen3_gated import Qwen3GatedForCausalLM

    if args.threads:
        torch.set_num_threads(args.threads)
    check_arguments(args)
    checkpoint = latest_checkpoint(resume) if resume is not None else None
    state = read_checkpoint(checkpoint) if checkpoint is not None else None
    if state is not None:
        _check_resume_matches(args, state["args"])
    initial_model = initial_tokenizer = None
    if args.init_from:
        read_init_config(args)  # the options against the checkpoint's config, before any weight is read
        if checkpoint is None:  # a resumed run takes the tokenizer saved with its checkpoint, as always
            # --init-from keeps the model's own tokenizer: there is no "elsewhere" to point to
            initial_tokenizer = load_tokenizer(args.init_from, args.init_from_subfolder, args.init_from_revision, elsewhere=None)
        initial_model = load_initial_model(args)
        if initial_tokenizer is not None and len(initial_tokenizer) > initial_model.config.vocab_size:
            raise TrainingError(
                f"the tokenizer of {args.init_from} has {len(initial_tokenizer)} tokens but its model's vocab_size is "
                f"{initial_model.config.vocab_size}: it is not this model's tokenizer"
            )
    else:
        _check_gate_options(args, _make_config(args, _config_values(args)).gate_type, "the model has no gate")
    # The precision depends on the device, which accelerate knows before the Accelerator exists.
    accelerator = Accelerator(mixed_precision=_resolve_precision(args.precision, PartialState().device))
    # --out is checked now and written only once every input has been read and checked (below).
    output = _output_folder(args, checkpoint)
    out = Path(args.output_dir)
    set_seed(args.seed)

    documents = read_documents(args.train_file)
    if args.tokenizer:
        source = args.tokenizer
    elif checkpoint is not None:
        source = checkpoint / "tokenizer"
    else:
        source = None
    if source is not None:
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(source))
        except Exception as error:  # a damaged tokenizer.json raises the tokenizers library's own errors
            raise TrainingError(f"cannot load the tokenizer in {source} ({_first_sentence(error)}); it is damaged or not a tokenizer folder") from None
    elif initial_tokenizer is not None:
        tokenizer = initial_tokenizer
    else:
        tokenizer = train_tokenizer(documents, args.vocab_size or DEFAULT_VOCAB_SIZE)

    train_stream = pack_documents(documents, tokenizer)
    data = PackedBatches(train_stream, args.seq_len, args.batch_size * accelerator.num_processes, args.seed)
    heldout = None
    if args.heldout_file:
        heldout = heldout_rows(pack_documents(read_documents(args.heldout_file), tokenizer), args.seq_len, args.eval_rows)

    if initial_model is None:
        config = build_config(args, tokenizer)
        torch.manual_seed(args.seed)
        model = Qwen3GatedForCausalLM(config)
    else:
        model, config = initial_model, initial_model.config
        if args.seq_len > config.max_position_embeddings:
            logger.warning(
                f"--seq-len {args.seq_len} is longer than {args.init_from}'s max_position_embeddings "
                f"({config.max_position_embeddings}): the model trains on positions it has not seen"
            )
    groups = parameter_groups(model, args)
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate, betas=tuple(args.adam_betas))
    total_steps = args.total_steps(accelerator.num_processes)
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, min(args.warmup_steps, total_steps), total_steps, min_lr_rate=args.min_lr_rate
    )
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    step, tokens, elapsed_before = 0, 0, 0.0
    last_eval, train_loss = None, None
    if checkpoint is not None:
        try:
            accelerator.load_state(str(checkpoint), load_kwargs={"weights_only": True})
        except Exception as error:  # read_checkpoint checked the files: this is a mismatch with the model
            raise TrainingError(f"cannot restore the training state saved in {checkpoint} ({_first_sentence(error)}); "
                                "it was saved by a different model or optimizer") from None
        step, tokens, elapsed_before = state["step"], state["tokens"], state["elapsed_s"]
        train_loss, last_eval = state.get("train_loss"), state.get("heldout")
        logger.info(f"resuming from {checkpoint} at step {step}")
    if step > total_steps:
        raise TrainingError(f"{checkpoint} is at step {step}, past this run's {total_steps} steps")

    summary_path = out / "summary.json"
    if checkpoint is not None and step == total_steps and summary_path.is_file():
        # A finished run: nothing to train, and its results stay as they are.
        try:
            summary = json.loads(summary_path.read_text())
        except (OSError, ValueError):
            summary = None
        if isinstance(summary, dict) and summary.get("steps") == step:
            logger.warning(f"{out} already finished its {total_steps} steps; nothing to do (its results: {summary_path})")
            return summary

    # Every input has been read and checked: from here on the run writes.
    accelerator.wait_for_everyone()  # all processes have checked --out before it is written
    if accelerator.is_main_process:
        with output as staging:
            tokenizer.save_pretrained(staging / "tokenizer")
            (staging / "train_args.json").write_text(json.dumps(dataclasses.asdict(args), indent=2) + "\n")
    accelerator.wait_for_everyone()

    parameters = sum(p.numel() for p in accelerator.unwrap_model(model).parameters())
    trainable_parameters = sum(p.numel() for group in groups for p in group["params"])
    if args.init_from or args.trainable != "all":
        logger.info(f"training {trainable_parameters:,} of {parameters:,} parameters")
    log_path = out / "log.csv"
    if accelerator.is_main_process:
        _truncate_log(log_path, step)

    def log(row: dict) -> None:
        if accelerator.is_main_process:
            new = not log_path.exists()
            with log_path.open("a", newline="") as f:
                writer = csv.DictWriter(f, LOG_FIELDS)
                if new:
                    writer.writeheader()
                writer.writerow({k: row.get(k, "") for k in LOG_FIELDS})

    def run_eval() -> dict | None:
        if heldout is None:
            return None
        return evaluate(accelerator.unwrap_model(model), heldout, args.batch_size)

    if checkpoint is None and heldout is not None:
        result = run_eval()
        log({"step": 0, "tokens": 0, "heldout_loss": f"{result['loss']:.5f}", "heldout_ppl": f"{result['ppl']:.3f}"})

    rank, per_rank = accelerator.process_index, args.batch_size
    model.train()
    bar = tqdm(total=total_steps, initial=step, disable=not (args.progress and accelerator.is_main_process), unit="step")
    start_time, window_start, window_tokens = time.perf_counter(), time.perf_counter(), 0
    while step < total_steps:
        input_ids = data.batch(step)[rank * per_rank : (rank + 1) * per_rank].to(accelerator.device)  # (B, T)
        with accelerator.autocast():
            loss = model(input_ids=input_ids, labels=input_ids).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        tokens += args.tokens_per_step(accelerator.num_processes)
        window_tokens += args.tokens_per_step(accelerator.num_processes)

        train_loss = accelerator.reduce(loss.detach(), reduction="mean").item()
        now = time.perf_counter()
        tokens_per_s = window_tokens / max(now - window_start, 1e-9)
        bar.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{tokens_per_s:,.0f}")
        bar.update(1)
        row = {
            "step": step,
            "tokens": tokens,
            # the base rate (--lr, scheduled); the first group may be the gate rows at lr * gate_lr_scale
            "lr": f"{scheduler.get_last_lr()[0] / optimizer.param_groups[0].get('lr_scale', 1.0):.6g}",
            "train_loss": f"{train_loss:.5f}",
            "tokens_per_s": f"{tokens_per_s:.1f}",
            "elapsed_s": f"{elapsed_before + now - start_time:.1f}",
        }
        if heldout is not None and (step % args.eval_every == 0 or step == total_steps):
            last_eval = run_eval()
            row.update(heldout_loss=f"{last_eval['loss']:.5f}", heldout_ppl=f"{last_eval['ppl']:.3f}")
            bar.write(f"step {step}: held-out loss {last_eval['loss']:.4f}, ppl {last_eval['ppl']:.2f}")
            window_start, window_tokens = time.perf_counter(), 0  # evaluation time is not training speed
        log(row)
        if args.save_every and step % args.save_every == 0 and step < total_steps:
            _save_checkpoint(accelerator, out, args, tokenizer, step, tokens, elapsed_before + time.perf_counter() - start_time,
                             train_loss, last_eval)
    bar.close()

    elapsed = elapsed_before + time.perf_counter() - start_time
    if checkpoint is None or step > state["step"]:  # a run resumed at its end already has this checkpoint
        _save_checkpoint(accelerator, out, args, tokenizer, step, tokens, elapsed, train_loss, last_eval)
    merge_gate_rows(accelerator.unwrap_model(model))  # final/ holds the plain q_proj a checkpoint has
    final = _save_model(accelerator, model, tokenizer, out, continued=bool(args.init_from))
    summary = {
        "steps": step,
        "tokens": tokens,
        "parameters": parameters,
        "trainable_parameters": trainable_parameters,
        "init_from": args.init_from,
        "gate": config.gate_type,
        "elapsed_s": round(elapsed, 1),
        "final_train_loss": train_loss,
        "heldout": last_eval,
        "model": str(final),
    }
    if accelerator.is_main_process:
        write_text(summary_path, json.dumps(summary, indent=2) + "\n")
        try:
            plot_losses(log_path, out / "loss.png")
        except GatedQwenError as error:
            logger.warning(f"{error}; the losses are in {log_path}")
    return summary


def _check_resume_matches(args: TrainingArguments, saved: dict) -> None:
    """A resumed run must cut and order its data as the saved one did, and start from the same model
    with the same parameters training, or its losses mean nothing."""
    keys = ("train_file", "seed", "seq_len", "batch_size", "gate", "config", "max_steps", "max_tokens")
    keys += ("init_from", "init_from_subfolder", "init_from_revision", "gate_init", "trainable", "gate_lr_scale")
    defaults = {field.name: field.default for field in dataclasses.fields(TrainingArguments)}
    for key in keys:
        used = saved.get(key, defaults[key])  # a key added since the run was saved had its default then
        if used != getattr(args, key):
            raise TrainingError(
                f"{key} is {getattr(args, key)!r} but the resumed run used {used!r}; pass the same value"
            )


def _truncate_log(log_path: Path, step: int) -> None:
    """Drop log rows after ``step``: a resumed run rewrites the steps it repeats."""
    if not log_path.exists():
        return
    rows = list(csv.DictReader(log_path.open()))
    with output_file(log_path) as partial, partial.open("w", newline="") as f:
        writer = csv.DictWriter(f, LOG_FIELDS)
        writer.writeheader()
        writer.writerows(r for r in rows if int(r["step"]) <= step)


__all__ = [
    "PackedBatches",
    "QueryAndGateRows",
    "TrainingArguments",
    "TrainingError",
    "check_arguments",
    "evaluate",
    "heldout_rows",
    "latest_checkpoint",
    "load_initial_model",
    "merge_gate_rows",
    "pack_documents",
    "parameter_groups",
    "plot_losses",
    "read_checkpoint",
    "read_documents",
    "read_init_config",
    "separate_gate_rows",
    "train",
    "train_tokenizer",
    "unigram_perplexity",
]
