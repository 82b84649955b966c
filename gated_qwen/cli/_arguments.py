"""The options the commands share, declared once: numeric bounds, the model source (MODEL, ``--subfolder``,
``--revision``), where it runs (``--device``, ``--dtype``), and SRC/DST of the commands that write a
checkpoint from another (``convert``, ``export``). Every choice is checked by argparse, so a wrong value is
one usage line before anything loads.

Not a subcommand (its name starts with ``_``, so the CLI does not register it); torch-free like every
``add_parser``.
"""

from __future__ import annotations

import argparse

from ..utils.names import DEVICES, DTYPES, GATE_VARIANT_CHOICES, GATE_VARIANT_DEFAULTS, GATE_VARIANT_HELP


def number(kind, low, high=None, low_open=False):
    """An argparse type: ``kind`` (int/float) within [low, high] (``low_open``: above low).

    >>> number(int, 1)("3")
    3
    >>> number(float, 0, 1, low_open=True)("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: 0 is out of range: it must be above 0 and at most 1
    """

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if kind is int else 'a number'}"
            ) from error
        if value < low or (low_open and value == low) or (high is not None and value > high):
            bound = f"{'above' if low_open else 'at least'} {low}" + (
                f" and at most {high}" if high is not None else ""
            )
            raise argparse.ArgumentTypeError(f"{text} is out of range: it must be {bound}")
        return value

    return parse


def add_model_source(parser, *, several: bool = False, what: str = "the checkpoint") -> None:
    """``--subfolder`` and ``--revision`` of the model(s) a command reads (MODEL itself is the command's own).

    ``several``: the command reads MODEL and ``--compare`` models; ``--subfolder`` then takes one folder for
    all or one per model (:func:`subfolders_per_model`), ``--revision`` applies to all.

    >>> parser = argparse.ArgumentParser()
    >>> add_model_source(parser)
    >>> parser.parse_args(["--subfolder", "1B_baseline"]).subfolder
    '1B_baseline'
    """
    if several:
        parser.add_argument(
            "--subfolder",
            nargs="+",
            default=[""],
            metavar="S",
            help="folder inside the repo or path: one for all models, or one per model in order (MODEL, then --compare)",
        )
        parser.add_argument("--revision", default=None, help="hub branch, tag or commit (all models)")
    else:
        parser.add_argument(
            "--subfolder", default="", help=f"folder inside the repo or path of {what}, e.g. 1B_gate_headwise"
        )
        parser.add_argument("--revision", default=None, help=f"hub branch, tag or commit of {what}")


def add_device_and_dtype(
    parser, *, dtype_default: str = "auto", dtype_help: str = "auto: the checkpoint's dtype"
) -> None:
    """``--device`` (auto: cuda, then mps, then cpu) and ``--dtype``, both checked against their choices.

    >>> parser = argparse.ArgumentParser()
    >>> add_device_and_dtype(parser, dtype_default="float32")
    >>> vars(parser.parse_args([]))
    {'device': 'auto', 'dtype': 'float32'}
    """
    parser.add_argument("--device", default="auto", choices=DEVICES, help="auto: cuda, then mps, then cpu")
    parser.add_argument("--dtype", default=dtype_default, choices=DTYPES, help=dtype_help)


def subfolders_per_model(subfolders: list[str], models: list[str]) -> list[str]:
    """One ``--subfolder`` per model: the one given for all, or those given one per model.

    >>> subfolders_per_model(["arm"], ["a", "b"])
    ['arm', 'arm']
    """
    from ..errors import GatedQwenError

    if len(subfolders) not in (1, len(models)):
        raise GatedQwenError(
            f"--subfolder takes one folder for all models or one per model ({len(models)}), not {len(subfolders)}"
        )
    return subfolders * len(models) if len(subfolders) == 1 else list(subfolders)


def add_checkpoint_arguments(parser, src_help: str, verify_help: str) -> None:
    """SRC, DST and the options of reading SRC and writing DST, added to ``parser``.

    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_checkpoint_arguments(parser, "a checkpoint", "compare logits")
    >>> parser.parse_args(["src", "dst", "--max-shard-size", "500MB"]).max_shard_size
    '500MB'
    """
    parser.add_argument("src", metavar="SRC", help=src_help)
    parser.add_argument(
        "dst", metavar="DST", help="the folder to write (must not exist or be empty, unless --overwrite)"
    )
    parser.add_argument("--dtype", choices=DTYPES, default="auto", help="weight dtype (default: auto, as stored)")
    parser.add_argument(
        "--max-shard-size", default="5GB", help="largest safetensors shard, e.g. 5GB or 500MB (default: 5GB)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace DST if it exists and is not empty")
    add_model_source(parser, what="SRC")
    parser.add_argument("--verify", action="store_true", help=verify_help)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def checkpoint_options(args) -> dict:
    """The keyword arguments of ``convert_checkpoint`` / ``export_checkpoint`` that the options above set.

    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_checkpoint_arguments(parser, "a checkpoint", "compare logits")
    >>> checkpoint_options(parser.parse_args(["src", "dst", "--quiet"]))["progress"]
    False
    """
    keys = ("dtype", "max_shard_size", "overwrite", "revision", "subfolder", "verify")
    return {**{key: getattr(args, key) for key in keys}, "progress": not args.quiet}


def written(result) -> str:
    """Where a conversion or export wrote, and how much: ``"DST: 635.2 MB in 2 files"``.

    >>> from types import SimpleNamespace
    >>> written(SimpleNamespace(path="out", total_size=2_000_000, files=["model.safetensors"]))
    'out: 2.0 MB in 1 file'
    """
    count = len(result.files)
    return f"{result.path}: {result.total_size / 1e6:,.1f} MB in {count} file{'s' if count > 1 else ''}"


def add_gate_variant_arguments(parser) -> None:
    """The gate variant beside ``--gate`` (docs/design-space.md): position, sharing, activation, combination,
    input, and the SDPA-output transform and sandwich norm.

    Defaults are the released point (a head-specific sigmoid gate multiplying the SDPA output).

    >>> parser = argparse.ArgumentParser()
    >>> add_gate_variant_arguments(parser)
    >>> options = gate_variant_options(parser.parse_args(["--gate-position", "value", "--sandwich-norm"]))
    >>> options["gate_position"], options["gate_activation"], options["sandwich_norm"]
    ('value', 'sigmoid', True)
    """
    for key, default in GATE_VARIANT_DEFAULTS.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true", help=GATE_VARIANT_HELP[key])
        else:
            parser.add_argument(
                flag,
                choices=GATE_VARIANT_CHOICES[key],
                default=default,
                help=GATE_VARIANT_HELP[key] + " (default %(default)s)",
            )


def gate_variant_options(args) -> dict:
    """The config keys that :func:`add_gate_variant_arguments` set, for ``Qwen3GatedConfig(**...)``."""
    return {key: getattr(args, key) for key in GATE_VARIANT_DEFAULTS}
