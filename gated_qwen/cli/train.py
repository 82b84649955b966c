"""``gated-qwen train``: train a Qwen3Gated (or Qwen3MoeGated) model on plain text, from scratch or continuing a
checkpoint (see :mod:`gated_qwen.tools.training`).

Its options are the fields of :class:`~gated_qwen.tools.training.arguments.TrainRunArguments`, derived by
:func:`add_dataclass_arguments` as transformers' ``HfArgumentParser`` derives them (``--field-name``, the
``aliases``, ``help`` and ``choices`` of the field's metadata, ``--no-`` for a bool that is true by default).
``HfArgumentParser`` itself is not used: importing it imports transformers (about a second), and
``gated-qwen --help`` imports neither torch nor transformers.
"""

from __future__ import annotations

import json


GROUPS = ("data", "model", "optimisation", "run")


def _argument_type(hint) -> type:
    """The type of a field's value on the command line: ``int | None`` gives int."""
    import types
    import typing

    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    return hint


def add_dataclass_arguments(parser, cls) -> dict:
    """Add an option per field of the dataclass ``cls`` (but those whose metadata says ``cli=False``) to ``parser``,
    in help groups (metadata ``group``); returns the groups by name, to add other options to.

    >>> import argparse, dataclasses
    >>> @dataclasses.dataclass
    ... class Example:
    ...     learning_rate: float = dataclasses.field(default=0.1, metadata={"aliases": ["--lr"], "group": "run"})
    >>> parser = argparse.ArgumentParser()
    >>> _ = add_dataclass_arguments(parser, Example)
    >>> parser.parse_args(["--lr", "0.5"]).learning_rate
    0.5
    """
    import argparse
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    exclusive = {}
    # by help group, the members of a mutually exclusive group first and side by side (argparse's usage line shows them so)
    fields = sorted(
        dataclasses.fields(cls),
        key=lambda field: (
            GROUPS.index(field.metadata.get("group", "run")),
            "exclusive" not in field.metadata,
            field.metadata.get("exclusive", ""),
        ),
    )
    for field in fields:
        meta = field.metadata
        if not meta.get("cli", True):
            continue
        group = groups[meta.get("group", "run")]
        if "exclusive" in meta:
            key = meta["exclusive"]
            if key not in exclusive:
                exclusive[key] = group.add_mutually_exclusive_group(required=True)
            group = exclusive[key]
        default = None if field.default is dataclasses.MISSING else field.default
        kwargs = {"dest": field.name, "default": default, "help": meta.get("help")}
        kind = _argument_type(hints[field.name])
        if kind is bool:
            negatable = meta.get("negatable", default is True)
            kwargs["action"] = argparse.BooleanOptionalAction if negatable else "store_true"
        else:
            kwargs["type"] = kind
            for key in ("choices", "metavar", "required"):
                if key in meta:
                    kwargs[key] = meta[key]
        group.add_argument(f"--{field.name.replace('_', '-')}", *meta.get("aliases", ()), **kwargs)
    return groups


def add_parser(subparsers) -> None:
    from ..tools.training.arguments import TrainRunArguments

    parser = subparsers.add_parser(
        "train",
        help="train a gated (or baseline) model from scratch, or continue a Qwen3 / Qwen3Gated checkpoint, dense or MoE",
        description="Train a Qwen3Gated model from scratch (byte-level BPE tokenizer trained on the text; a --config "
        "whose model_type is qwen3_moe or qwen3_moe_gated gives a Qwen3MoeGated one), or continue a dense or "
        "Qwen3-MoE checkpoint with --init-from, converting a model without a gate with --gate. AdamW with warmup and cosine "
        "decay on transformers' Trainer, held-out loss every --eval-every steps, log.csv, loss.png, resumable checkpoints, "
        "the model in OUT/final. Data through Hugging Face datasets (Arrow cache, or --streaming), sharded across "
        "processes and packed into rows. Runs on CPU, one GPU, or several processes under `torchrun` (DDP; FSDP, DeepSpeed "
        "and `accelerate launch` on GPUs).",
    )
    groups = add_dataclass_arguments(parser, TrainRunArguments)
    groups["optimisation"].add_argument(
        "--bf16", action="store_true", help="bf16 autocast (the same as --precision bf16)"
    )
    groups["run"].add_argument(
        "--resume",
        metavar="DIR",
        help="continue from a checkpoint folder, or the latest one of an output folder, writing to --out (may be the same folder)",
    )
    parser.set_defaults(run=run_train)


def run_arguments(args):
    """The :class:`TrainRunArguments` of parsed ``gated-qwen train`` options (which check their bounds)."""
    import dataclasses

    from ..tools.training.arguments import TrainRunArguments

    fields = [field for field in dataclasses.fields(TrainRunArguments) if field.metadata.get("cli", True)]
    values = {field.name: getattr(args, field.name) for field in fields}
    if args.bf16:
        values["precision"] = "bf16"
    return TrainRunArguments(**values)


def run_train(args) -> int:
    training_args = run_arguments(args)  # bounds checked before torch is imported
    from ..tools.training import train

    summary = train(training_args, resume=args.resume)
    print(json.dumps(summary, indent=2))
    return 0
