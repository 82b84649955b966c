"""Checkpoints of a run: Trainer's ``checkpoint-STEP/`` folders, checked before a run resumes from one.

Trainer writes model, optimizer, scheduler, RNG states and ``trainer_state.json``; the run adds
``run_state.json`` (its arguments, the process count and global batch, tokens, held-out result) last,
so a folder without it is a checkpoint a killed run did not finish. Resuming continues at the same
data position with the same global batch; another global batch is refused (see :func:`check_resume_matches`).
"""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

from ...checkpoint.outputs import OutputError, OutputFolder, resolve_destination
from .arguments import RUN_DATA_KEYS, TrainingError, TrainRunArguments


RUN_STATE = "run_state.json"  # ours, written after Trainer's files: a checkpoint without it is unfinished
RUN_FILES = ("tokenizer", "train_args.json")  # what a run writes into --out before its first step
CHECKPOINT_FILES = (RUN_STATE, "trainer_state.json", "optimizer.pt", "scheduler.pt")
# The model's weights: one file, or shards with their index (save_pretrained shards a model above 50 GB)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def latest_checkpoint(folder: str | Path) -> Path:
    """``folder`` itself if it is a checkpoint, else its finished ``checkpoint-STEP`` with the highest step.

    >>> import tempfile
    >>> folder = tempfile.TemporaryDirectory()
    >>> run = Path(folder.name)
    >>> for step in (400, 1200, 1600):
    ...     (run / f"checkpoint-{step}").mkdir()
    >>> for step in (400, 1200):  # checkpoint-1600 is unfinished: it has no run_state.json
    ...     _ = (run / f"checkpoint-{step}" / RUN_STATE).write_text("{}")
    >>> latest_checkpoint(run) == run / "checkpoint-1200"
    True
    >>> folder.cleanup()
    """
    folder = Path(folder)
    if (folder / "trainer_state.json").is_file() or (folder / RUN_STATE).is_file():
        return folder
    found = finished_checkpoints(folder)
    if not found:
        raise TrainingError(
            f"{folder} holds no checkpoint (a checkpoint-STEP folder with {RUN_STATE}); nothing to resume"
        )
    return found[-1]


def finished_checkpoints(folder: Path) -> list[Path]:
    """``folder``'s ``checkpoint-STEP`` folders that hold ``run_state.json``, by step: transformers' own order
    (``trainer_utils.sort_checkpoints``; its ``get_last_checkpoint`` takes the newest, finished or not)."""
    from transformers.trainer_utils import sort_checkpoints

    return [Path(path) for path in sort_checkpoints(str(folder)) if (Path(path) / RUN_STATE).is_file()]


def _first_sentence(error: Exception) -> str:
    """A library's error message on one line, up to its first full stop (torch's go on for several sentences)."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text.split(". ")[0].rstrip(".")[:200]


def read_checkpoint(checkpoint: str | Path) -> dict:
    """Check every file of a training checkpoint, without loading it into a model; returns its run state.

    Each file must be whole, and the torch pickles Trainer loads (``optimizer.pt``, ``scheduler.pt``,
    ``rng_state*.pth``, ``scaler.pt``) plain data, opened with ``torch.load(weights_only=True)`` (memory-mapped;
    numpy's RNG state allowed, as by Trainer), which never runs code a pickle names; ``training_args.bin``,
    which Trainer never reads, is not opened. Else a :class:`TrainingError` names the file and what to do.

    >>> import tempfile, torch
    >>> from safetensors.torch import save_file
    >>> folder = tempfile.TemporaryDirectory()
    >>> (checkpoint := Path(folder.name) / "checkpoint-400").mkdir()
    >>> save_file({"lm_head.weight": torch.zeros(4, 2)}, checkpoint / "model.safetensors")
    >>> for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
    ...     torch.save({"state": torch.zeros(2)}, checkpoint / name)
    >>> _ = (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 400}))
    >>> state = {"step": 400, "tokens": 409600, "elapsed_s": 12.5, "args": {}, "num_processes": 1}
    >>> _ = (checkpoint / RUN_STATE).write_text(json.dumps(state))
    >>> read_checkpoint(checkpoint)["step"]
    400
    >>> (checkpoint / "scheduler.pt").unlink()
    >>> read_checkpoint(checkpoint)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    gated_qwen.tools.training.arguments.TrainingError: ...checkpoint-400 has no scheduler.pt; it is not a whole ...
    >>> folder.cleanup()
    """
    import torch
    from safetensors import safe_open
    from transformers.trainer_pt_utils import safe_globals

    checkpoint = Path(checkpoint)
    earlier = [path for path in finished_checkpoints(checkpoint.parent) if path.resolve() != checkpoint.resolve()]
    advice = f"resume from {earlier[-1]} instead" if earlier else "start again with --overwrite"
    for name in CHECKPOINT_FILES:
        if not (checkpoint / name).is_file():
            raise TrainingError(f"{checkpoint} has no {name}; it is not a whole checkpoint of this package: {advice}")
    if not any((checkpoint / name).is_file() for name in WEIGHT_FILES):
        raise TrainingError(
            f"{checkpoint} has no model.safetensors (nor its index); it is not a whole checkpoint of this package "
            f"(FSDP writes the whole model only with state_dict_type FULL_STATE_DICT): {advice}"
        )
    if not any(checkpoint.glob("rng_state*.pth")):
        raise TrainingError(
            f"{checkpoint} has no rng_state.pth; it is not a whole checkpoint of this package: {advice}"
        )
    for name in (RUN_STATE, "trainer_state.json"):
        try:
            json.loads((checkpoint / name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise TrainingError(
                f"{checkpoint / name} is not readable JSON ({error}); it is damaged: {advice}"
            ) from error
    state = json.loads((checkpoint / RUN_STATE).read_text(encoding="utf-8"))
    if not isinstance(state, dict) or not {"step", "tokens", "elapsed_s", "args", "num_processes"} <= state.keys():
        raise TrainingError(
            f"{checkpoint / RUN_STATE} lacks step, tokens, elapsed_s, args or num_processes; it is not this package's: {advice}"
        )
    for path in sorted(checkpoint.iterdir()):
        try:
            if path.suffix == ".safetensors":
                with safe_open(str(path), framework="pt") as handle:
                    handle.keys()
            elif path.suffix in (".pt", ".pth"):
                with safe_globals():
                    torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except pickle.UnpicklingError as error:
            if "weights only" not in str(error).lower():
                raise TrainingError(f"{path} is damaged or truncated ({type(error).__name__}); {advice}") from error
            raise TrainingError(
                f"{path} holds more than plain tensors (a pickle that would run code or build arbitrary objects); "
                f"it was not loaded. Use checkpoints this package wrote: {advice}"
            ) from error
        except Exception as error:  # safetensors, zip and pickle readers raise several types
            raise TrainingError(f"{path} is damaged or truncated ({_first_sentence(error)}); {advice}") from error
    return state


def check_resume_matches(args: TrainRunArguments, state: dict, num_processes: int, data_shards: int) -> None:
    """A resumed run must read the same rows in the same order, start from the same model with the same
    parameters training, and take the same global batch, or its losses mean nothing.

    The process count may change when the global batch (processes x ``batch_size`` x gradient accumulation)
    and the data shards stay: the rows of every step are then the same (see :mod:`.data`). Another global
    batch would change the rows of every step and the token budget; it is refused, saying what to pass.
    """
    saved = state["args"]
    defaults = {field.name: field.default for field in dataclasses.fields(TrainRunArguments)}
    for key in RUN_DATA_KEYS:
        used = saved.get(key, defaults.get(key))  # a key added since the run was saved had its default then
        if used != getattr(args, key):
            raise TrainingError(
                f"{key} is {getattr(args, key)!r} but the resumed run used {used!r}; pass the same value"
            )
    saved_processes = state["num_processes"]
    saved_rows = state.get(
        "rows_per_step", saved["batch_size"] * saved.get("gradient_accumulation_steps", 1) * saved_processes
    )
    rows = args.rows_per_step(num_processes)
    if rows != saved_rows:
        per_process = saved_rows // num_processes if saved_rows % num_processes == 0 else None
        hint = (
            f"with {num_processes} processes pass --batch-size {per_process} (or split it with --gradient-accumulation-steps)"
            if per_process
            else f"launch {saved_processes} processes with --batch-size {saved['batch_size']}"
        )
        raise TrainingError(
            f"the checkpoint was trained with a global batch of {saved_rows} rows per step ({saved_processes} processes x "
            f"--batch-size {saved['batch_size']} x --gradient-accumulation-steps {saved.get('gradient_accumulation_steps', 1)}); "
            f"this run would take {rows} ({num_processes} x {args.batch_size} x {args.gradient_accumulation_steps}), "
            f"changing the rows of every step and the token budget. Resume with the same global batch: {hint}"
        )
    if state.get("data_shards", data_shards) != data_shards:
        raise TrainingError(
            f"the checkpoint read its data as {state['data_shards']} shards, this run as {data_shards}; "
            f"pass --data-shards {state['data_shards']}"
        )
    if saved_processes != num_processes:
        from transformers.utils import logging

        logging.get_logger(__name__).warning(
            f"resuming a run of {saved_processes} processes on {num_processes}: the global batch ({rows} rows) and the "
            f"{data_shards} data shards are the same, so every step takes the same rows; only the per-process RNG "
            "states (dropout) cannot carry over"
        )


def load_experts_as_saved(model) -> None:
    """Let ``model.load_state_dict`` take a Qwen3-MoE's experts as ``save_pretrained`` writes them, one tensor per
    expert, fusing them into the tensors the model holds (:func:`~gated_qwen.transforms.experts.fuse_experts`).

    Trainer resumes (and loads its best model) with a plain ``load_state_dict(strict=False)`` of the checkpoint's
    file, which would leave the fused experts as they were, with only a warning (transformers issue #48805). With
    this ``load_state_dict`` pre-hook, checkpoints keep the layout of Qwen's published Qwen3-MoE checkpoints
    (which ``from_pretrained`` and vLLM read) and resume exactly. Shards are loaded one ``load_state_dict`` call
    each: an expert tensor whose pieces span two shards is fused once the last piece has come. A state dict that
    already holds the fused tensors passes unchanged; a model without fused experts gets no hook.

    >>> import torch
    >>> from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    >>> from gated_qwen.transforms.experts import is_fused_experts, split_fused_experts
    >>> config = Qwen3MoeConfig(num_hidden_layers=1, num_experts=2, moe_intermediate_size=4, hidden_size=8,
    ...                         num_attention_heads=2, num_key_value_heads=1, vocab_size=16)
    >>> source, model = Qwen3MoeForCausalLM(config), Qwen3MoeForCausalLM(config)
    >>> as_saved = {}  # the experts as save_pretrained writes them
    >>> for name, tensor in source.state_dict().items():
    ...     as_saved.update(split_fused_experts(name, tensor) if is_fused_experts(name) else [(name, tensor)])
    >>> load_experts_as_saved(model)
    >>> model.load_state_dict(as_saved, strict=True)
    <All keys matched successfully>
    >>> torch.equal(model.model.layers[0].mlp.experts.down_proj, source.model.layers[0].mlp.experts.down_proj)
    True
    """
    from ...transforms.experts import fuse_experts, is_fused_experts, piece_names

    # fused tensor name -> the names of its per-expert pieces, in fuse_experts' order
    pieces = {
        name: piece_names(name, tensor.shape[0])
        for name, tensor in model.state_dict().items()
        if is_fused_experts(name)
    }
    if not pieces:
        return
    waiting = {}  # pieces of an expert tensor whose other pieces are in a shard still to come

    def fuse_saved_experts(module, state_dict, prefix, *args):
        for name, piece_names in pieces.items():
            if prefix + name in state_dict:
                continue
            waiting.update(
                (piece, state_dict.pop(prefix + piece)) for piece in piece_names if prefix + piece in state_dict
            )
            if all(piece in waiting for piece in piece_names):
                state_dict[prefix + name] = fuse_experts(name, [(piece, waiting.pop(piece)) for piece in piece_names])

    model.register_load_state_dict_pre_hook(fuse_saved_experts)


def output_folder(args: TrainRunArguments, checkpoint: Path | None) -> OutputFolder:
    """--out, checked before any work (nothing is written yet): the :class:`OutputFolder` of the run's first files.

    A new run needs an empty or missing --out (or --overwrite). A run resumed into the folder of the
    checkpoint it continues keeps that folder and replaces only its tokenizer and train_args.json.
    """
    try:
        out = resolve_destination(args.output_dir)
        if checkpoint is not None and out in (checkpoint.resolve(), checkpoint.resolve().parent):
            if args.overwrite:
                raise TrainingError(
                    f"--overwrite would delete {checkpoint}, which --resume continues from; drop --overwrite"
                )
            return OutputFolder(out, overwrite=True, merge=True, names=RUN_FILES)
        if list(out.glob(f"checkpoint-*/{RUN_STATE}")):
            advice = f"pass --resume {args.output_dir} to continue the run in it, or --overwrite to replace it"
        else:
            advice = "it holds no checkpoint to resume from: pass --overwrite to replace it, or choose another --out"
        return OutputFolder(out, overwrite=args.overwrite, advice=advice)
    except OutputError as error:
        raise TrainingError(str(error)) from error


__all__ = [
    "RUN_STATE",
    "check_resume_matches",
    "latest_checkpoint",
    "load_experts_as_saved",
    "output_folder",
    "read_checkpoint",
]
