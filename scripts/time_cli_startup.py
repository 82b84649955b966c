"""Wall time of CLI commands that should start at once: median (and range) over repeated runs.

    python scripts/time_cli_startup.py                     # gated-qwen --version and generate --help, 11 runs each
    python scripts/time_cli_startup.py --runs 21 -- gated-qwen analyze --help

Each run is a fresh process (``subprocess.run``), timed with ``time.perf_counter`` around it; the first
run of each command is a warm-up and not counted (it fills the OS file cache).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import time

DEFAULT_COMMANDS = (["gated-qwen", "--version"], ["gated-qwen", "generate", "--help"])


def time_command(command: list[str], runs: int) -> list[float]:
    """Seconds of ``runs`` runs of ``command`` after one warm-up run; raises if it fails."""
    seconds = []
    for run in range(runs + 1):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if run:
            seconds.append(time.perf_counter() - start)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11, help="timed runs per command (default 11)")
    parser.add_argument("command", nargs="*", help="one command to time instead of the defaults")
    args = parser.parse_args(argv)
    for command in [args.command] if args.command else DEFAULT_COMMANDS:
        seconds = time_command(command, args.runs)
        print(
            f"{shlex.join(command)}: median {statistics.median(seconds):.3f} s "
            f"(min {min(seconds):.3f}, max {max(seconds):.3f}, {len(seconds)} runs)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
