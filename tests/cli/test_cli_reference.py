"""docs/cli.md, the command-line reference, names every subcommand and every option the parsers have."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from gated_qwen.cli import build_parser


PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def sections() -> dict[str, str]:
    """The page's ``## name`` sections, by name."""
    parts = re.split(r"^## (\S+)\n", PAGE.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_subcommand_and_option_is_in_the_reference():
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    documented = sections()
    assert sorted(documented) == sorted(["gated-qwen", *subparsers.choices]), (
        "docs/cli.md is out of date: run python scripts/write_cli_reference.py"
    )
    for name, subparser in subparsers.choices.items():
        for action in subparser._actions:
            for option in action.option_strings:
                assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", documented[name]), (
                    f"gated-qwen {name} {option} is not in docs/cli.md: run python scripts/write_cli_reference.py"
                )
