"""Wall time of CLI commands that should start at once: median (and range) over repeated runs.

    python scripts/time_cli_startup.py                     # the interpreter alone, --version, generate --help; 11 runs each
    python scripts/time_cli_startup.py --runs 21 -- gated-qwen analyze --help

Each run is a fresh process (``subprocess.run``), timed with ``time.perf_counter`` around it; the first
run of each command is a warm-up and not counted (it fills the OS file cache). The default commands run
``python -m gated_qwen`` with this interpreter, so a checkout on ``PYTHONPATH`` is timed as it is.

Writes ``results.json`` (every run's seconds, the machine and package versions) and ``results.md`` (the
table) into ``--results-dir`` (default ``results/cli_startup``); ``--print-only`` writes nothing.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import time

from _results import describe, new_report, write_results


DEFAULT_COMMANDS = (
    [sys.executable, "-c", "pass"],
    [sys.executable, "-m", "gated_qwen", "--version"],
    [sys.executable, "-m", "gated_qwen", "generate", "--help"],
)


def time_command(command: list[str], runs: int) -> list[float]:
    """Seconds of ``runs`` runs of ``command`` after one warm-up run; raises if it fails."""
    seconds = []
    for run in range(runs + 1):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if run:
            seconds.append(time.perf_counter() - start)
    return seconds


def shown(command: list[str]) -> str:
    """The command as a reader would type it: ``python`` for this interpreter."""
    return shlex.join(["python" if part == sys.executable else part for part in command])


def markdown_table(report: dict) -> str:
    lines = ["| command | median seconds | min | max | runs |", "|---|---|---|---|---|"]
    for row in report["commands"]:
        lines.append(
            f"| `{row['command']}` | {row['median_seconds']:.3f} | {row['min_seconds']:.3f} "
            f"| {row['max_seconds']:.3f} | {row['runs']} |"
        )
    return "\n".join(lines) + "\n\nEach run a fresh process, after one warm-up run. " + describe(report) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11, help="timed runs per command (default 11)")
    parser.add_argument("--results-dir", default="results/cli_startup", help="where results.json/.md go")
    parser.add_argument("--print-only", action="store_true", help="print the table, write no results")
    parser.add_argument("command", nargs="*", help="one command to time instead of the defaults")
    args = parser.parse_args(argv)
    report = new_report("cli_startup", runs_per_command=args.runs, commands=[])
    for command in [args.command] if args.command else DEFAULT_COMMANDS:
        seconds = time_command(command, args.runs)
        report["commands"].append(
            {
                "command": shown(command),
                "median_seconds": statistics.median(seconds),
                "min_seconds": min(seconds),
                "max_seconds": max(seconds),
                "runs": len(seconds),
                "seconds": seconds,
            }
        )
    table = markdown_table(report)
    print(table)
    if not args.print_only:
        print(f"wrote {write_results(args.results_dir, report, table)}/results.json and results.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
