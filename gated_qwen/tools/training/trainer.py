"""``train``: a run of transformers' :class:`~transformers.Trainer` with what Trainer does not know added.

Trainer brings data parallelism (DDP; FSDP and DeepSpeed on GPUs), gradient accumulation, bf16,
gradient checkpointing, the schedule (stepped once per optimizer step, whatever the process count),
checkpoints, resume and logging integrations. :class:`GatedTrainer` adds the gate parameter groups
(:func:`.groups.gate_parameter_groups`) and rows packed on the fly and sharded across processes
(:class:`.data.PackedRows`); :class:`.reporting.RunCallback` the held-out evaluation, ``log.csv`` and the run state
saved with every checkpoint; :func:`train` the model to start from (new, or ``--init-from`` converted on
the fly), the checks made before anything is written, ``final/``, ``summary.json`` and ``loss.png``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from pathlib import Path

import torch
from transformers import Trainer
from transformers.utils import logging

from ...checkpoint.outputs import OutputFolder, write_text
from ...errors import GatedQwenError
from . import checkpoints as ckpt
from .arguments import DEFAULT_VOCAB_SIZE, TrainingError, TrainRunArguments
from .data import (
    PackedRows,
    iter_texts,
    load_documents,
    read_heldout_rows,
    train_tokenizer,
)
from .groups import merge_gate_rows, parameter_groups
from .model_init import build_config, check_arguments, check_model_options, load_initial_model
from .reporting import RunCallback, plot_losses, truncate_log


logger = logging.get_logger(__name__)

_WRAPPER_NAMES = re.compile(r"(^|\.)(?:_fsdp_wrapped_module|_checkpoint_wrapped_module|_orig_mod|module)\.")


def _plain_name(name: str) -> str:
    """A parameter's name without the prefixes FSDP, activation checkpointing, compile or DDP add."""
    while True:
        plain = _WRAPPER_NAMES.sub(r"\1", name)
        if plain == name:
            return plain
        name = plain


class GatedTrainer(Trainer):
    """A :class:`~transformers.Trainer` whose optimizer is AdamW over given parameter groups (the gate rows apart),
    whose training data is already this process's share (:class:`.data.PackedRows`), so its DataLoader is
    not sharded again, and whose model resumes an MoE's experts from the one-tensor-per-expert layout its
    checkpoints are saved in (:func:`.checkpoints.load_experts_as_saved`).

    ``parameter_groups`` name their parameters (``"names"``: the model's parameter names), so that the
    groups hold the parameters of the model as Trainer wrapped it (FSDP replaces them).

    >>> import tempfile
    >>> from transformers import TrainingArguments
    >>> from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM
    >>> from gated_qwen.tools.training import gate_parameter_groups
    >>> model = Qwen3GatedForCausalLM(Qwen3GatedConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, gate_type="headwise"))
    >>> groups = _named_groups(gate_parameter_groups(model, lr=1e-3, gate_lr_scale=10.0), model)  # as train() does
    >>> folder = tempfile.TemporaryDirectory()
    >>> hf_args = TrainingArguments(output_dir=folder.name, report_to="none", use_cpu=True)
    >>> trainer = GatedTrainer(model=model, args=hf_args, parameter_groups=groups)
    >>> [(group["lr"], len(group["params"])) for group in trainer.create_optimizer().param_groups]
    [(0.001, 16), (0.001, 9), (0.01, 2)]
    >>> folder.cleanup()
    """

    def __init__(self, *args, parameter_groups: list[dict], adam_betas=(0.9, 0.95), **kwargs):
        super().__init__(*args, **kwargs)
        self.gate_groups, self.adam_betas = parameter_groups, tuple(adam_betas)
        # checkpoints hold an MoE's experts one tensor per expert, as save_pretrained writes them; resume fuses them
        ckpt.load_experts_as_saved(self.model)

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            parameters = {_plain_name(name): p for name, p in (model or self.model).named_parameters()}
            groups = []
            for group in self.gate_groups:
                groups.append(
                    {
                        **{k: v for k, v in group.items() if k not in ("params", "names")},
                        "params": [parameters[name] for name in group["names"]],
                    }
                )
            self.optimizer = torch.optim.AdamW(
                groups, lr=self.args.learning_rate, betas=self.adam_betas, eps=self.args.adam_epsilon
            )
        return self.optimizer

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Trainer's loss, with an MoE's router auxiliary loss weighted ``router_aux_loss_coef`` per optimizer step.

        Qwen3-MoE returns ``cross-entropy + router_aux_loss_coef * aux_loss`` (when ``output_router_logits``), its
        cross-entropy normalised by ``num_items_in_batch``, the labelled tokens of the whole accumulated batch, so
        Trainer counts the loss as already scaled for gradient accumulation and does not divide it by the steps.
        Applied to the whole sum, that weighs the auxiliary term ``coef`` in every micro-batch, ``steps`` times
        over (transformers issue #48690). Here each micro-batch's term is ``coef * aux_loss / steps``, so the step
        optimises ``coef`` times the mean auxiliary loss of its micro-batches; DDP's average over processes then
        gives the mean over processes (tokens are not averaged across devices: see ``_hf_arguments``).
        """
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        aux_loss = outputs.get("aux_loss") if isinstance(outputs, dict) else None
        # Trainer's own test of a loss scaled for gradient accumulation (Trainer.training_step)
        scaled_for_accumulation = self.model_accepts_loss_kwargs and num_items_in_batch is not None
        if aux_loss is not None and model.training and scaled_for_accumulation:
            steps = getattr(self, "current_gradient_accumulation_steps", None) or self.args.gradient_accumulation_steps
            coef = self.accelerator.unwrap_model(model).router_aux_loss_coef
            loss = loss - coef * aux_loss.to(loss.device) * (1.0 - 1.0 / steps)
        return (loss, outputs) if return_outputs else loss

    def get_train_dataloader(self):
        from transformers import default_data_collator

        # PackedRows already yields this process's rows: a plain DataLoader, not one accelerate shards again
        return torch.utils.data.DataLoader(
            self.train_dataset, batch_size=self.args.train_batch_size, collate_fn=default_data_collator
        )


def _precision(args: TrainRunArguments) -> bool:
    """Whether Trainer trains in bf16 (autocast): ``auto`` takes it on a GPU that has it."""
    if args.precision == "auto":
        # CPU bf16 autocast exists but is slower than fp32 on most CPUs without AMX, and less exact.
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if args.precision not in ("bf16", "fp32"):
        raise TrainingError(f"unknown precision {args.precision!r}; expected auto, bf16 or fp32")
    return args.precision == "bf16"


def check_scaling_options(args: TrainRunArguments, num_processes: int) -> int:
    """The data shards of the run, after refusing scaling options that cannot work here."""
    if args.fsdp and not torch.cuda.is_available():
        raise TrainingError(
            "--fsdp needs GPUs: accelerate, which Trainer runs on, enables FSDP only on CUDA (and other accelerator) "
            "devices. On CPU, leave --fsdp out: several processes then train data-parallel (DDP over gloo)"
        )
    if args.fsdp and (args.trainable == "gate" or args.gate_lr_scale != 1.0):
        raise TrainingError(
            "--fsdp with --trainable gate or --gate-lr-scale is not supported by this command: the gate rows as a "
            "parameter of their own are tested under FSDP2 only through torch's fully_shard (see docs/training.md)"
        )
    if args.deepspeed and not Path(args.deepspeed).is_file() and not args.deepspeed.lstrip().startswith("{"):
        raise TrainingError(f"--deepspeed {args.deepspeed} is not a file; give a DeepSpeed JSON config")
    for value, flag in (
        (args.gradient_accumulation_steps, "--gradient-accumulation-steps"),
        (args.data_shards, "--data-shards"),
    ):
        if value is not None and value < 1:
            raise TrainingError(f"{flag} must be at least 1, got {value}")
    # an Arrow data set is one shard by default (the rows of every step do not depend on the process count); a stream
    # one shard per process, so that each process reads only its own files
    shards = args.data_shards or (num_processes if args.streaming else 1)
    if args.streaming and shards % num_processes:
        raise TrainingError(
            f"{num_processes} processes cannot share {shards} streamed data shards evenly; pass --data-shards a "
            f"multiple of {num_processes}"
        )
    return shards


def describe_scale(args: TrainRunArguments, num_processes: int, data_shards: int) -> str:
    """The line a run starts with: its process count, global batch and data shards.

    >>> describe_scale(TrainRunArguments(train_file="t.jsonl", output_dir="o", max_steps=1, batch_size=4), 2, 1)
    'training on 2 processes, global batch 8 rows (per process 4 x accumulation 1 x 2 processes), 1 data shard'
    """
    plural = "process" if num_processes == 1 else "processes"
    shards = "data shard" if data_shards == 1 else "data shards"
    return (
        f"training on {num_processes} {plural}, global batch {args.rows_per_step(num_processes)} rows (per process "
        f"{args.batch_size} x accumulation {args.gradient_accumulation_steps} x {num_processes} {plural}), "
        f"{data_shards} {shards}"
    )


def _hf_arguments(args: TrainRunArguments, total_steps: int, num_processes: int):
    from transformers import TrainingArguments as HFTrainingArguments

    # transformers after 5.19 calls it activation_checkpointing (gradient_checkpointing stays a deprecated alias until
    # v6); 5.19 knows only gradient_checkpointing (docs/compatibility.md).
    checkpointing = (
        "activation_checkpointing"
        if any(field.name == "activation_checkpointing" for field in dataclasses.fields(HFTrainingArguments))
        else "gradient_checkpointing"
    )
    fsdp_config = None
    if args.fsdp_config:
        fsdp_config = (
            json.loads(Path(args.fsdp_config).read_text())
            if Path(args.fsdp_config).is_file()
            else json.loads(args.fsdp_config)
        )
    return HFTrainingArguments(
        **{
            k: v
            for k, v in dict(
                # the options TrainRunArguments passes as they are (metadata trainer=True), then those it translates
                **{f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.metadata.get("trainer")},
                per_device_train_batch_size=args.batch_size,
                max_steps=total_steps,
                adam_beta1=args.adam_betas[0],
                adam_beta2=args.adam_betas[1],
                lr_scheduler_type="cosine_with_min_lr",
                lr_scheduler_kwargs={"min_lr_rate": args.min_lr_rate},
                warmup_steps=min(args.warmup_steps, total_steps),
                logging_strategy="steps",
                logging_steps=1,
                save_strategy="steps",
                save_steps=args.save_every or total_steps,
                bf16=_precision(args),
                **{checkpointing: args.gradient_checkpointing},
                fsdp=args.fsdp or "",
                fsdp_config=fsdp_config,
                disable_tqdm=not args.progress,
                remove_unused_columns=False,
                # Every process's rows are packed, their labelled tokens equal in number, so the mean loss of each,
                # averaged by DDP, is the global mean: Trainer need not rescale by the process count, which would
                # rescale an MoE's auxiliary term too (GatedTrainer.compute_loss)
                average_tokens_across_devices=False,
                ddp_find_unused_parameters=False,
                dataloader_num_workers=0,
                # several processes on a machine without CUDA: without use_cpu, transformers sees no distributed mode
                # (each process would believe it is alone); with it, accelerate runs them as MULTI_CPU over gloo
                use_cpu=True if num_processes > 1 and not torch.cuda.is_available() else None,
            ).items()
            if v is not None
        }
    )


def _make_tokenizer(args: TrainRunArguments, documents, is_main: bool, num_processes: int):
    """A BPE trained on the training text by the main process only, shared with the others as its JSON."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from .data import EOS_TOKEN, PAD_TOKEN

    text = [None]
    if is_main:
        text = [
            train_tokenizer(iter_texts(documents), args.vocab_size or DEFAULT_VOCAB_SIZE).backend_tokenizer.to_str()
        ]
    if num_processes > 1:
        torch.distributed.broadcast_object_list(text, src=0)
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(text[0]), eos_token=EOS_TOKEN, pad_token=PAD_TOKEN
    )


@dataclasses.dataclass
class _Run:
    """What :func:`train` settles before reading any data: processes, shards, the checkpoint resumed, the budget."""

    num_processes: int
    data_shards: int
    checkpoint: Path | None
    state: dict | None
    total_steps: int
    hf_args: object  # transformers' TrainRunArguments
    output: OutputFolder
    out: Path

    @property
    def step(self) -> int:
        return self.state["step"] if self.state else 0

    @property
    def is_main(self) -> bool:
        return self.hf_args.process_index == 0


def _resolve_run(args: TrainRunArguments, resume: str | Path | None) -> _Run:
    """Every check on the options and the resumed checkpoint, made before any data or weight is read."""
    if args.threads:
        torch.set_num_threads(args.threads)
    num_processes = int(os.environ.get("WORLD_SIZE", "1"))
    check_arguments(args)
    data_shards = check_scaling_options(args, num_processes)
    checkpoint = ckpt.latest_checkpoint(resume) if resume is not None else None
    state = ckpt.read_checkpoint(checkpoint) if checkpoint is not None else None
    if state is not None:
        ckpt.check_resume_matches(args, state, num_processes, data_shards)
    check_model_options(args)  # before any weight is read
    total_steps = args.total_steps(num_processes)
    hf_args = _hf_arguments(args, total_steps, num_processes)
    if hf_args.world_size != num_processes:  # sets up the process group
        raise TrainingError(
            f"WORLD_SIZE says {num_processes} processes but {hf_args.world_size} joined; launch with torchrun or accelerate launch"
        )
    # --out is checked now (by every process) and written only once every input has been read and checked.
    output = ckpt.output_folder(args, checkpoint)
    run = _Run(num_processes, data_shards, checkpoint, state, total_steps, hf_args, output, Path(args.output_dir))
    if run.step > total_steps:
        raise TrainingError(f"{checkpoint} is at step {run.step}, past this run's {total_steps} steps")
    return run


def _load_run_tokenizer(args: TrainRunArguments, run: _Run):
    """The resumed checkpoint's tokenizer, ``--tokenizer``, ``--init-from``'s, or a BPE trained on the text."""
    from transformers import AutoTokenizer

    from ..generation import load_tokenizer

    if args.tokenizer or run.checkpoint is not None:
        source = args.tokenizer or run.checkpoint
        try:
            return AutoTokenizer.from_pretrained(str(source))
        except Exception as error:  # a damaged tokenizer.json raises the tokenizers library's own errors
            raise TrainingError(
                f"cannot load the tokenizer in {source} ({ckpt._first_sentence(error)}); it is damaged or not a tokenizer folder"
            ) from error
    if args.init_from:
        # --init-from keeps the model's own tokenizer: there is no "elsewhere" to point to
        return load_tokenizer(args.init_from, args.init_from_subfolder, args.init_from_revision, elsewhere=None)
    return _make_tokenizer(args, load_documents(args, streaming=True), run.is_main, run.num_processes)


def _read_rows(args: TrainRunArguments, run: _Run, documents, tokenizer):
    """The training rows of this process (checked by reading the first ones) and the held-out rows."""
    from .data import reading_error

    rank = run.hf_args.process_index
    rows = PackedRows(
        documents, tokenizer, args.seq_len, run.data_shards, rank, run.num_processes, args.seed, args.shuffle_buffer
    )
    try:
        rows.check()
        heldout = read_heldout_rows(args, tokenizer)
    except TrainingError:
        raise
    except Exception as error:  # datasets' and pyarrow's parse errors, met while streaming the first rows
        raise reading_error(args, error) from error
    return rows, heldout


def _initial_model(args: TrainRunArguments, tokenizer):
    """The ``--init-from`` model (checked against its tokenizer), or None to build one from a config."""
    if not args.init_from:
        return None
    model = load_initial_model(args)
    if len(tokenizer) > model.config.vocab_size:
        raise TrainingError(
            f"the tokenizer of {args.init_from} has {len(tokenizer)} tokens but its model's vocab_size is "
            f"{model.config.vocab_size}: it is not this model's tokenizer"
        )
    return model


def _build_model(args: TrainRunArguments, tokenizer, initial_model):
    """The model to train: ``initial_model``, or a new one from the config (seeded)."""
    from ...models.auto import causal_lm_class

    if initial_model is None:
        config = build_config(args, tokenizer)
        torch.manual_seed(args.seed)
        return causal_lm_class({"model_type": config.model_type})(config)  # Qwen3Gated or Qwen3MoeGated
    config = initial_model.config
    if args.seq_len > config.max_position_embeddings:
        logger.warning(
            f"--seq-len {args.seq_len} is longer than {args.init_from}'s max_position_embeddings "
            f"({config.max_position_embeddings}): the model trains on positions it has not seen"
        )
    return initial_model


def _finished_summary(run: _Run) -> dict | None:
    """The summary of a run that already finished its steps (nothing to train, its results stay), else None."""
    summary_path = run.out / "summary.json"
    if run.checkpoint is None or run.step != run.total_steps or not summary_path.is_file():
        return None
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(summary, dict) and summary.get("steps") == run.step):
        return None
    logger.warning(
        f"{run.out} already finished its {run.total_steps} steps; nothing to do (its results: {summary_path})"
    )
    return summary


def _start_writing(args: TrainRunArguments, run: _Run, tokenizer) -> None:
    """Every input has been read and checked: the tokenizer and train_args.json go into --out, log.csv is cut."""
    run.hf_args.distributed_state.wait_for_everyone()  # every process has checked --out before it is written
    if run.is_main:
        with run.output as staging:
            tokenizer.save_pretrained(staging / "tokenizer")
            (staging / "train_args.json").write_text(json.dumps(dataclasses.asdict(args), indent=2) + "\n")
        truncate_log(run.out / "log.csv", run.step)
    run.hf_args.distributed_state.wait_for_everyone()
    if run.is_main:
        print(describe_scale(args, run.num_processes, run.data_shards), file=sys.stderr, flush=True)


def _named_groups(groups: list[dict], model) -> list[dict]:
    """``groups`` with their parameters named (``"names"``), for :class:`GatedTrainer`."""
    names = {id(p): _plain_name(name) for name, p in model.named_parameters()}
    return [
        {**{k: v for k, v in g.items() if k != "params"}, "names": [names[id(p)] for p in g["params"]]} for g in groups
    ]


def _load_weights(trainer: GatedTrainer, checkpoint: Path) -> None:
    """The model weights of ``checkpoint`` (one file or shards, checked by ``read_checkpoint``) into
    ``trainer.model``, as Trainer's resume loads them (not strict: tied weights are saved once), through public
    readers. Trainer writes them for a plain run, for FSDP with ``FULL_STATE_DICT`` and for DeepSpeed."""
    from safetensors.torch import load_file
    from transformers.trainer_utils import load_sharded_checkpoint

    weights = checkpoint / "model.safetensors"
    if weights.is_file():
        trainer.model.load_state_dict(load_file(weights, device="cpu"), strict=False)
    else:
        load_sharded_checkpoint(trainer.model, str(checkpoint), strict=False)


def _run_trainer(run: _Run, trainer: GatedTrainer) -> int:
    """Train to the end (or, killed after its last checkpoint, only load it); the step reached."""
    if run.checkpoint is not None and run.step == run.total_steps:
        # killed after its last checkpoint: nothing left to train. Trainer's own resume is not used here: resumed at
        # its max_steps, Trainer (5.19 to 5.25) trains one step more (tests/tools/test_training.py, a finished run)
        _load_weights(trainer, Path(run.checkpoint))
        return run.step
    trainer.train(resume_from_checkpoint=str(run.checkpoint) if run.checkpoint is not None else None)
    return trainer.state.global_step


def _final_state(trainer: GatedTrainer, out: Path):
    """The model to save as final/ and its state dict (None: the model's own)."""
    if trainer.is_fsdp_enabled:
        # FSDP leaves each process its shard of every tensor (saving trainer.model as it is fails: "invalid python
        # storage", seen on a GPU): gather the whole state dict as Trainer.save_model does (a collective, so on every
        # process; the main one receives it) and save it through the unwrapped model. --fsdp never separates the gate
        # rows (model_init refuses --trainable gate and --gate-lr-scale with it), so there is nothing to merge.
        state_dict_type = str(trainer.accelerator.state.fsdp_plugin.state_dict_type)
        if "FULL_STATE_DICT" not in state_dict_type:
            raise TrainingError(
                f"final/ needs the whole model, which FSDP gathers only with state_dict_type FULL_STATE_DICT (the "
                f"--fsdp-config says {state_dict_type}); the checkpoints in {out} hold the trained weights"
            )
        return trainer.accelerator.unwrap_model(trainer.model), trainer.accelerator.get_state_dict(trainer.model)
    merge_gate_rows(trainer.model)  # final/ holds the plain q_proj a checkpoint has
    return trainer.model, None


def _save_final(args: TrainRunArguments, trainer: GatedTrainer, tokenizer, out: Path, is_main: bool) -> Path:
    """``final/``: the trained model, its tokenizer and (trained from scratch) our generation config."""
    from transformers import GenerationConfig

    final = out / "final"
    model, state_dict = _final_state(trainer, out)
    if is_main:
        with OutputFolder(final, overwrite=True) as staging:
            model.save_pretrained(staging, safe_serialization=True, state_dict=state_dict)
            tokenizer.save_pretrained(staging)
            # A model continued from a checkpoint keeps the generation config it was loaded with (save_pretrained
            # wrote it); one trained from scratch has only the defaults derived from its config: give it ours.
            if not args.init_from:
                GenerationConfig(
                    eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.pad_token_id,
                    do_sample=True,
                    temperature=0.8,
                    top_k=50,
                    max_new_tokens=64,
                ).save_pretrained(staging)
    return final


def _write_summary(summary: dict, out: Path, is_main: bool) -> None:
    if is_main:
        write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
        try:
            plot_losses(out / "log.csv", out / "loss.png")
        except GatedQwenError as error:
            logger.warning(f"{error}; the losses are in {out / 'log.csv'}")


def trainer_for_rows(args: TrainRunArguments, model, rows, callbacks=()) -> GatedTrainer:
    """A :class:`GatedTrainer` for ``model`` on rows already made, with the options :func:`train` takes from ``args``.

    For a task generated in memory (:mod:`gated_qwen.tools.sink_task`): ``rows`` is any torch Dataset of
    ``{"input_ids", "labels"}`` rows, read in order, ``args.batch_size`` a step; the optimizer groups, the schedule
    (warmup, cosine to ``min_lr_rate``), the clipping, the seed and the precision are :func:`train`'s. One process;
    nothing is saved (``args.output_dir`` is only Trainer's working folder) and nothing is printed per step.

    >>> import tempfile
    >>> from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM
    >>> model = Qwen3GatedForCausalLM(Qwen3GatedConfig(vocab_size=16, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8, gate_type="headwise"))
    >>> rows = [{"input_ids": torch.arange(8) % 16, "labels": torch.arange(8) % 16}] * 4
    >>> folder = tempfile.TemporaryDirectory()
    >>> args = TrainRunArguments(train_file="(in memory)", output_dir=folder.name, max_steps=2, batch_size=2,
    ...                          warmup_steps=1, progress=False)
    >>> trainer_for_rows(args, model, rows).train().global_step
    2
    >>> folder.cleanup()
    """
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    hf_args = _hf_arguments(args, args.total_steps(1), 1)
    hf_args.save_strategy = "no"
    groups = _named_groups(parameter_groups(model, args), model)
    trainer = GatedTrainer(
        model=model,
        args=hf_args,
        train_dataset=rows,
        parameter_groups=groups,
        adam_betas=args.adam_betas,
        callbacks=list(callbacks),
    )
    trainer.remove_callback(PrinterCallback)
    if not args.progress:
        trainer.remove_callback(ProgressCallback)
    return trainer


def train(args: TrainRunArguments, resume: str | Path | None = None) -> dict:
    """Train (or, with ``resume``, continue) a model as ``args`` says on transformers' Trainer; returns a summary dict.

    The model is new (``args.config``, a tokenizer trained on the text or ``args.tokenizer``) or, with
    ``args.init_from``, a checkpoint's, with its tokenizer (:func:`.model_init.load_initial_model`); which of
    its parameters train, and at which rate, says :func:`.groups.parameter_groups`. Launched under
    ``torchrun`` or ``accelerate launch``, every process trains its share of each global batch
    (``batch_size`` rows per process). Every check on the options, the data and the checkpoint comes
    before the output folder is touched.

    ``resume`` is a checkpoint folder or an output folder (its latest finished checkpoint is taken); the
    run continues at the saved step with the saved optimizer, scheduler and RNG state, at the same data
    position, so the losses equal those of an uninterrupted run. The summary counts the loss spikes
    (:class:`.reporting.LossSpikes`: ``loss_spikes``, ``loss_spike_steps``).

    >>> import json, tempfile
    >>> from gated_qwen.default_models import default_model_path
    >>> folder = tempfile.TemporaryDirectory()
    >>> corpus = Path(folder.name) / "train.jsonl"
    >>> _ = corpus.write_text("".join(json.dumps({"text": f"def f{i}(x): return x + {i}"}) + "\\n" for i in range(40)))
    >>> summary = train(TrainRunArguments(train_file=str(corpus), output_dir=f"{folder.name}/run", max_steps=2,
    ...                                   init_from=str(default_model_path("headwise")), seq_len=32, batch_size=2,
    ...                                   warmup_steps=1, progress=False))  # two steps of 2 rows of 32 tokens
    >>> summary["steps"], summary["tokens"], summary["gate"], Path(summary["model"]).name
    (2, 128, 'headwise', 'final')
    >>> folder.cleanup()
    """
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    run = _resolve_run(args, resume)
    with run.hf_args.main_process_first(desc="reading the training data"):  # the Arrow cache is built once
        documents = load_documents(args)
    tokenizer = _load_run_tokenizer(args, run)
    initial_model = _initial_model(args, tokenizer)
    rows, heldout = _read_rows(args, run, documents, tokenizer)
    model = _build_model(args, tokenizer, initial_model)
    groups = parameter_groups(model, args)  # before Trainer loads a checkpoint into the model: the gate rows apart
    parameters = sum(p.numel() for p in model.parameters())
    trainable_parameters = sum(p.numel() for group in groups for p in group["params"])
    finished = _finished_summary(run)
    if finished is not None:
        return finished

    _start_writing(args, run, tokenizer)
    if args.init_from or args.trainable != "all":
        logger.info(f"training {trainable_parameters:,} of {parameters:,} parameters")
    callback = RunCallback(args, heldout, run.out, run.num_processes, run.data_shards, run.is_main, run.state)
    trainer = GatedTrainer(
        model=model,
        args=run.hf_args,
        train_dataset=rows,
        processing_class=tokenizer,
        parameter_groups=_named_groups(groups, model),
        adam_betas=args.adam_betas,
        callbacks=[callback],
    )
    trainer.remove_callback(PrinterCallback)
    if not args.progress:
        trainer.remove_callback(ProgressCallback)
    step = _run_trainer(run, trainer)
    final = _save_final(args, trainer, tokenizer, run.out, run.is_main)
    summary = {
        "steps": step,
        "tokens": callback.tokens(step),
        "parameters": parameters,
        "trainable_parameters": trainable_parameters,
        "init_from": args.init_from,
        "gate": model.config.gate_type,
        "num_processes": run.num_processes,
        "rows_per_step": args.rows_per_step(run.num_processes),
        "elapsed_s": round(callback.elapsed, 1),
        "final_train_loss": callback.train_loss,
        "heldout": callback.last_eval,
        **callback.spikes.summary(),
        "model": str(final),
    }
    _write_summary(summary, run.out, run.is_main)
    run.hf_args.distributed_state.wait_for_everyone()
    return summary


__all__ = ["GatedTrainer", "check_scaling_options", "describe_scale", "train", "trainer_for_rows"]
