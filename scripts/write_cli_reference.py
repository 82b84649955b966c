"""Write docs/cli.md, the command-line reference, from the ``gated-qwen`` parsers themselves.

    python scripts/write_cli_reference.py            # rewrite docs/cli.md
    python scripts/write_cli_reference.py --check    # exit 1 if docs/cli.md differs from what it would write

Each subcommand's section is its ``--help`` as argparse prints it at 100 columns. Run it after changing a
command's options; ``tests/cli/test_cli_reference.py`` checks that every subcommand and option is in the page.
Imports neither torch nor transformers (the parsers do not).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "cli.md"

INTRO = """# Command-line reference

`gated-qwen COMMAND [options]`, or `python -m gated_qwen COMMAND [options]`. Every command prints its
options with `--help`; this page is that output, generated from the parsers by
`python scripts/write_cli_reference.py`. A wrong argument or a failed command prints one line on stderr
and exits with status 2 (`GATED_QWEN_DEBUG=1` shows the traceback instead). The pages under "Using it"
explain each command with examples.
"""


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommand parsers of ``parser``, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def render() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps help at the terminal's width
    sys.path.insert(0, str(ROOT))
    from gated_qwen.cli import build_parser

    parser = build_parser()
    sections = [INTRO, "## gated-qwen\n", "```text\n" + parser.format_help().rstrip() + "\n```\n"]
    for name, subparser in sorted(subcommands(parser).items()):
        sections += [f"## {name}\n", "```text\n" + subparser.format_help().rstrip() + "\n```\n"]
    return "\n".join(sections)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with docs/cli.md instead of writing it")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE} is out of date: run python scripts/write_cli_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
