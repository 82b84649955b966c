"""The model a run starts from: new from a config, or a checkpoint converted on the fly; and the checks on the
options that decide it, made before anything is read or written.

Both families train: dense (Qwen3 / Qwen3Gated, the released arms) and mixture of experts (Qwen3-MoE /
Qwen3MoeGated). Which one a config or checkpoint is says its ``model_type``, read by
:func:`gated_qwen.models.auto.causal_lm_class`, the one place that chooses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ...errors import GatedQwenError
from ...models.auto import causal_lm_class
from ...models.qwen3_gated.configuration_qwen3_gated import Qwen3GatedConfig
from ...models.qwen3_moe_gated.configuration_qwen3_moe_gated import Qwen3MoeGatedConfig
from ...utils.names import GATE_VARIANT_DEFAULTS
from .arguments import TRAINABLE, TrainingError, TrainRunArguments


def _config_values(args: TrainRunArguments) -> dict:
    """The keys of ``args.config`` (or none: the defaults) with the gate of ``args.gate``; ``model_type`` is kept,
    to say the family (:func:`_make_config` takes it out)."""
    values = {}
    if args.config:
        path = Path(args.config)
        if not path.is_file():
            raise TrainingError(f"config {path} does not exist; pass a config.json such as configs/small_4M.json")
        try:
            values = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise TrainingError(f"config {path} is not valid JSON: {error}") from error
    values.pop("architectures", None)
    if args.gate is not None:
        from ...models.layout import GATE_TYPES

        if args.gate not in GATE_TYPES:
            raise TrainingError(f"unknown gate {args.gate!r}; expected one of {', '.join(GATE_TYPES)}")
        # --gate says the gate type whatever the config's released flags say; the variant options override the
        # config's keys only where given (their defaults would otherwise undo a config.json's gate_position, say).
        values.pop("headwise_attn_output_gate", None)
        values.pop("elementwise_attn_output_gate", None)
        values["gate_type"] = args.gate
        values.update({key: value for key, value in gate_variant(args).items() if value != GATE_VARIANT_DEFAULTS[key]})
    return values


def gate_variant(args: TrainRunArguments) -> dict:
    """The config keys of the gate variant (``--gate-position`` and the rest), passed with ``--gate``'s type."""
    return {key: getattr(args, key) for key in GATE_VARIANT_DEFAULTS}


def build_config(args: TrainRunArguments, tokenizer) -> Qwen3GatedConfig | Qwen3MoeGatedConfig:
    """The model config: ``args.config`` (or defaults), the gate of ``args.gate``, the tokenizer's vocabulary
    and special tokens, and room for ``seq_len`` positions. A config whose ``model_type`` is ``qwen3_moe`` or
    ``qwen3_moe_gated`` gives a :class:`Qwen3MoeGatedConfig`, any other a :class:`Qwen3GatedConfig`."""
    values = _config_values(args)
    values.update(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_position_embeddings=max(values.get("max_position_embeddings", 0), args.seq_len),
    )
    return _make_config(args, values)


def _make_config(args: TrainRunArguments, values: dict) -> Qwen3GatedConfig | Qwen3MoeGatedConfig:
    values = dict(values)
    config_class = causal_lm_class(values).config_class  # the family its model_type says
    values.pop("model_type", None)
    try:
        return config_class(**values)
    except (TypeError, ValueError) as error:
        family = "Qwen3MoeGated" if config_class is Qwen3MoeGatedConfig else "Qwen3Gated"
        reason = " ".join(str(error).split())
        raise TrainingError(
            f"config {args.config or '(defaults)'} is not a valid {family} config: {reason}"
        ) from error


def check_arguments(args: TrainRunArguments) -> None:
    """Refuse option combinations that cannot mean anything, before anything is read or written.

    >>> check_arguments(TrainRunArguments(train_file="t.jsonl", output_dir="o", max_steps=1, gate_init="random"))
    Traceback (most recent call last):
    ...
    gated_qwen.tools.training.arguments.TrainingError: --init says how --gate converts the --init-from checkpoint; give --init-from and --gate with it, or leave --init out
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
    if args.gate is None and gate_variant(args) != GATE_VARIANT_DEFAULTS:
        raise TrainingError(
            "the gate variant options (--gate-position, --gate-activation, ..., --sandwich-norm) apply to the model "
            "of --gate; give --gate with them (--gate none: the SDPA-output transform or sandwich norm without a gate)"
        )
    if args.init_from is None:
        for value, flag in ((args.init_from_subfolder, "--subfolder"), (args.init_from_revision, "--revision")):
            if value:
                raise TrainingError(
                    f"{flag} applies to the --init-from checkpoint; give --init-from, or leave {flag} out"
                )
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


def read_init_config(args: TrainRunArguments) -> Qwen3GatedConfig | Qwen3MoeGatedConfig:
    """The config of the model training will start from: ``args.init_from``'s, converted to ``args.gate``.

    A Qwen3-MoE or Qwen3MoeGated checkpoint gives a :class:`Qwen3MoeGatedConfig`, any other a
    :class:`Qwen3GatedConfig` (which refuses a model type it cannot read, naming it). Only config.json is read
    (for a hub id, only it is downloaded). Refuses a gate conversion of a checkpoint that has a gate, and
    ``trainable="gate"`` or a ``gate_lr_scale`` for a model without one.

    >>> from gated_qwen.default_models import default_model_path
    >>> baseline = str(default_model_path("baseline"))  # a checkpoint without a gate
    >>> read_init_config(TrainRunArguments(train_file="t.jsonl", output_dir="o", max_steps=1,
    ...                                    init_from=baseline, gate="headwise")).gate_type
    'headwise'
    """
    source = args.init_from + (f" (subfolder {args.init_from_subfolder})" if args.init_from_subfolder else "")
    config_class = _init_model_class(args).config_class
    try:
        config = config_class.from_pretrained(
            args.init_from, subfolder=args.init_from_subfolder, revision=args.init_from_revision
        )
    except (OSError, ValueError) as error:
        if isinstance(error, GatedQwenError):
            raise
        reason = " ".join(str(error).split())
        raise TrainingError(f"cannot read the config of {source}: {reason}") from error
    if args.gate is not None:
        if config.gate_type != "none":
            raise TrainingError(
                f"{source} already has a {config.gate_type} gate; --gate converts a checkpoint without one. "
                "Leave --gate out to continue training it as it is"
            )
        try:
            config.gate_type = args.gate
            for key, value in gate_variant(args).items():
                setattr(config, key, value)
            config.validate()
        except ValueError as error:
            raise TrainingError(f"--gate {args.gate}: {' '.join(str(error).split())}") from error
        from ...transforms.conversion import check_identity_init

        check_identity_init(config, args.gate_init or "identity")  # before any weight is read
    _check_gate_options(args, config.gate_type, f"{source} has no gate")
    return config


def check_model_options(args: TrainRunArguments) -> None:
    """Check the options against the model the run starts from, reading only configs: ``--init-from``'s config.json
    converted to ``--gate`` (:func:`read_init_config`), else ``--config`` with ``--gate``; the gate options need a
    model with a gate.

    >>> check_model_options(TrainRunArguments(train_file="t.jsonl", output_dir="o", max_steps=1, gate="none", gate_lr_scale=10))
    Traceback (most recent call last):
    ...
    gated_qwen.tools.training.arguments.TrainingError: the model has no gate, so --gate-lr-scale has nothing to scale; choose a gate with --gate, or leave --gate-lr-scale out
    """
    if args.init_from:
        read_init_config(args)
    else:
        _check_gate_options(args, _make_config(args, _config_values(args)).gate_type, "the model has no gate")


def _check_gate_options(args: TrainRunArguments, gate_type: str, no_gate: str) -> None:
    if gate_type != "none":
        return
    hint = "add --gate headwise or --gate elementwise to convert it" if args.init_from else "choose a gate with --gate"
    if args.trainable == "gate":
        raise TrainingError(f"{no_gate}, so --trainable gate would train nothing; {hint}")
    if args.gate_lr_scale != 1.0:
        raise TrainingError(
            f"{no_gate}, so --gate-lr-scale has nothing to scale; {hint}, or leave --gate-lr-scale out"
        )


def _init_model_class(args: TrainRunArguments) -> type:
    """The causal-LM class that reads ``args.init_from`` (its config.json's ``model_type`` says the family)."""
    from ...checkpoint.sources import read_config_json
    from ..generation import local_checkpoint_folder

    # one clear error for a missing folder, an unknown or unreachable hub repository
    local_checkpoint_folder(args.init_from, args.init_from_subfolder, args.init_from_revision)
    return causal_lm_class(read_config_json(args.init_from, args.init_from_subfolder, args.init_from_revision))


def load_initial_model(args: TrainRunArguments):
    """The model of ``args.init_from`` in float32, converted to ``args.gate`` when that is given.

    Any Qwen3 or Qwen3Gated checkpoint loads (a released arm, a stock Qwen3, one saved here) through
    :meth:`Qwen3GatedForCausalLM.from_pretrained`, any Qwen3-MoE or Qwen3MoeGated one through
    :meth:`Qwen3MoeGatedForCausalLM.from_pretrained` (:func:`gated_qwen.models.auto.causal_lm_class` chooses);
    neither runs code from the checkpoint. The
    weights train in float32 whatever dtype the checkpoint stores. The conversion
    (:func:`gated_qwen.transforms.conversion.convert_qwen3_to_gated`) draws a random gate init right after
    ``torch.manual_seed(args.seed)``, so the same seed gives the same model again.

    >>> from gated_qwen.default_models import default_model_path
    >>> baseline = str(default_model_path("baseline"))  # a checkpoint without a gate
    >>> model = load_initial_model(TrainRunArguments(train_file="t.jsonl", output_dir="o", max_steps=1,
    ...                                              init_from=baseline, gate="headwise"))
    >>> model.config.gate_type, next(model.parameters()).dtype
    ('headwise', torch.float32)
    """
    from ...transforms.conversion import convert_qwen3_to_gated

    model = _init_model_class(args).from_pretrained(
        args.init_from, subfolder=args.init_from_subfolder, revision=args.init_from_revision, dtype=torch.float32
    )
    if args.gate is not None:
        torch.manual_seed(args.seed)
        model = convert_qwen3_to_gated(model, gate=args.gate, init=args.gate_init or "identity", **gate_variant(args))
    return model


__all__ = ["build_config", "check_arguments", "check_model_options", "load_initial_model", "read_init_config"]
