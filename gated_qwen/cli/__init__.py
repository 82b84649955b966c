"""The ``gated-qwen`` command.

Each subcommand is a module of this package (found by name, so adding one needs no edit here) with
``add_parser(subparsers)``, which registers its arguments and sets ``run``; the library work lives
in the package's other modules, and a subcommand module imports them only when it runs: ``--help``,
``--version`` and every subcommand's ``--help`` import neither torch nor transformers. A user-facing
error, a wrong argument included, prints as one line on stderr and exits 2; ``GATED_QWEN_DEBUG=1`` shows
the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are one line (what is wrong, where to look) and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> ArgumentParser:
    """The ``gated-qwen`` parser with every subcommand; imports only the subcommand modules (light).

    >>> build_parser().parse_args(["inspect", "some/folder"]).command
    'inspect'
    """
    from .. import __version__

    parser = ArgumentParser(
        prog="gated-qwen",
        description="Gated-attention Qwen3 models (arXiv 2505.06708) on current transformers.",
    )
    parser.add_argument("--version", action="version", version=f"gated-qwen {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}").add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``gated-qwen`` with ``argv`` (default: the process arguments); returns the exit status.

    >>> from gated_qwen.default_models import default_model_path
    >>> main(["inspect", str(default_model_path("headwise"))])  # doctest: +ELLIPSIS
    source                .../headwise
    model_type            qwen3_gated (gated-qwen checkpoint)
    gate type             headwise
    ...
    0
    >>> main(["inspect", "./missing_dir"])  # the one-line error goes to stderr
    2
    """
    from ..errors import GatedQwenError

    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except (GatedQwenError, OSError, ValueError) as error:
        if os.environ.get("GATED_QWEN_DEBUG"):
            raise
        message = str(error).strip() or type(error).__name__
        print(f"gated-qwen {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gated-qwen {args.command}: interrupted", file=sys.stderr)
        return 130
