"""The gated-qwen command line: starts without torch or transformers, and a wrong argument is one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gated_qwen.cli import build_parser, main


COMMANDS = ("analyze", "bench", "convert", "eval", "export", "generate", "inspect", "train")

# Runs in a fresh interpreter: every --help and --version, then reports which heavy modules got imported.
PROBE = """
import contextlib, io, json, sys
from gated_qwen.cli import main
for argv in {argvs!r}:
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main(argv)
        except SystemExit as exit:
            assert exit.code == 0, (argv, exit.code)
print(json.dumps({{name: name in sys.modules for name in ("torch", "transformers", "lm_eval", "peft")}}))
"""


def test_help_and_version_import_neither_torch_nor_transformers():
    argvs = [["--version"], ["--help"], *[[command, "--help"] for command in COMMANDS]]
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(argvs=argvs)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "torch": False,
        "transformers": False,
        "lm_eval": False,
        "peft": False,
    }


def test_every_command_module_is_listed():
    subcommands = build_parser()._subparsers._group_actions[0].choices
    assert sorted(subcommands) == list(COMMANDS)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["generate", "--top-p", "2", "Hi"], "argument --top-p: 2 is out of range: it must be above 0 and at most 1"),
        (["generate", "--batch-size", "0", "Hi"], "argument --batch-size: 0 is out of range: it must be at least 1"),
        (["eval", "m", "--tasks", "t", "--limit", "0"], "argument --limit: 0 is out of range"),
        (["convert", "a", "b", "--gate", "none"], "argument --gate: invalid choice: 'none'"),
        (["nonsense"], "argument COMMAND: invalid choice: 'nonsense'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_a_wrong_argument_is_one_line_and_exit_status_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("gated-qwen")
    assert "usage:" not in captured.err
