"""The model a run starts from: new from a config, or a Qwen3 / Qwen3Gated checkpoint converted on the fly;
and the checks on the options that decide it, made before anything is read or written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ...errors import GatedQwenError
from ...models.qwen3_gated.configuration_qwen3_gated import Qwen3GatedConfig
from ..training_args import TRAINABLE, TrainingArguments, TrainingError


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
        from ...models.layout import GATE_TYPES

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


def check_arguments(args: TrainingArguments) -> None:
    """Refuse option combinations that cannot mean anything, before anything is read or written.

    >>> check_arguments(TrainingArguments(train_file="t.jsonl", output_dir="o", max_steps=1, gate_init="random"))
    Traceback (most recent call last):
    ...
    gated_qwen.tools.training_args.TrainingError: --init says how --gate converts the --init-from checkpoint; give --init-from and --gate with it, or leave --init out
    """
    from ...utils.names import CONVERSION_INITS as INITS

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
    from ..generation import local_checkpoint_folder

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
    from ...models.qwen3_gated.modeling_qwen3_gated import Qwen3GatedForCausalLM
    from ...transforms.conversion import convert_qwen3_to_gated

    model = Qwen3GatedForCausalLM.from_pretrained(
        args.init_from, subfolder=args.init_from_subfolder, revision=args.init_from_revision, dtype=torch.float32
    )
    if args.gate is not None:
        torch.manual_seed(args.seed)
        model = convert_qwen3_to_gated(model, gate=args.gate, init=args.gate_init or "identity")
    return model




__all__ = ["build_config", "check_arguments", "load_initial_model", "read_init_config"]
