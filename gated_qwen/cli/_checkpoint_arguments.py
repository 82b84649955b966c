"""The arguments every command that writes a checkpoint from another takes (``convert``, ``export``).

Not a subcommand (its name starts with ``_``, so the CLI does not register it); torch-free like every
``add_parser``.
"""

from __future__ import annotations


def add_checkpoint_arguments(parser, src_help: str, verify_help: str) -> None:
    """SRC, DST and the options of reading SRC and writing DST, added to ``parser``.

    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_checkpoint_arguments(parser, "a checkpoint", "compare logits")
    >>> parser.parse_args(["src", "dst", "--max-shard-size", "500MB"]).max_shard_size
    '500MB'
    """
    from ..utils.names import DTYPES

    parser.add_argument("src", metavar="SRC", help=src_help)
    parser.add_argument("dst", metavar="DST", help="the folder to write (must not exist or be empty, unless --overwrite)")
    parser.add_argument("--dtype", choices=list(DTYPES), default="auto", help="weight dtype (default: auto, as stored)")
    parser.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard, e.g. 5GB or 500MB (default: 5GB)")
    parser.add_argument("--overwrite", action="store_true", help="replace DST if it exists and is not empty")
    parser.add_argument("--revision", default=None, help="hub branch, tag or commit of SRC")
    parser.add_argument("--subfolder", default="", help="folder inside SRC holding the checkpoint, e.g. 1B_gate_headwise")
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
