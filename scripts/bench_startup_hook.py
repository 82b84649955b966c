"""What gated-qwen's startup hook costs a Python that never imports transformers: ``python -c pass`` with and without.

    python scripts/bench_startup_hook.py                 # 1000 rounds
    python scripts/bench_startup_hook.py --rounds 200 --print-only

Five venvs of this interpreter, made for the measurement (``--without-pip``, in a temporary folder), each holding
one .pth file of another project (a comment line, as environments where pip installed anything hold one):

- two bare, in folders of their own: the noise floor is the difference between these two arms, which run the
  same thing;
- one with the hook as an installation leaves it at the top of site-packages (``gated_qwen_startup.pth``, the line
  setup.py writes, and ``gated_qwen_startup.py`` from this checkout, byte-compiled as pip does);
- two floors: a .pth whose line is ``import sys`` (what any .pth line that runs code costs: site compiles and runs
  it) and a .pth that imports an empty module, byte-compiled (the cheapest hook that runs code of its own from a
  file). A hook written in Python has to compile or import its finder: the second is the least a hook that
  imports it from a module of its own can cost; gated-qwen's line defines it itself, and pays for compiling it.

Each round runs ``python -c pass`` in each, in an order shuffled per round, each a fresh process timed with
``time.perf_counter`` around ``subprocess.run`` (the first round is a warm-up, not counted). Differences of medians
come with a 95% interval from resampling the rounds (bootstrap, 2000 resamples).

Writes ``results.json`` (every run's seconds, the machine and versions) and ``results.md`` into ``--results-dir``
(default ``results/startup_hook``); ``--print-only`` writes nothing.
"""

from __future__ import annotations

import argparse
import ast
import random
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from _results import ROOT, describe, new_report, write_results


BARE, NOISE, HOOK, IMPORT_SYS, EMPTY_MODULE = ARMS = (
    "bare",
    "bare, another venv",
    "with the hook",
    "a .pth line `import sys`",
    "a .pth importing an empty module",
)
OTHER_PTH = "# another project's .pth\n"  # in every venv: another project's .pth file, a comment line
EMPTY_MODULE_NAME = "empty_startup_module"


def startup_line() -> str:
    """The .pth line setup.py installs (its STARTUP_LINE, read without running setup.py)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    return next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "STARTUP_LINE" for t in node.targets)
    )


def make_venv(folder: Path, arm: str) -> Path:
    """A venv without pip, with another project's .pth and what ``arm`` adds at the top of its site-packages.
    Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(folder), "platbase": str(folder)}))
    (site / "another_project.pth").write_text(OTHER_PTH)
    if arm == HOOK:
        (site / "gated_qwen_startup.pth").write_text(startup_line())
        (site / "gated_qwen_startup.py").write_text((ROOT / "gated_qwen_startup.py").read_text())
    elif arm == IMPORT_SYS:
        (site / "floor.pth").write_text("import sys\n")
    elif arm == EMPTY_MODULE:
        (site / "floor.pth").write_text(f"import {EMPTY_MODULE_NAME}\n")
        (site / f"{EMPTY_MODULE_NAME}.py").write_text("")
    # byte-compiled, as pip leaves an installed wheel's modules (PYTHONDONTWRITEBYTECODE would keep it from being
    # written at the first run)
    subprocess.run([str(folder / "bin" / "python"), "-m", "compileall", "-q", str(site)], check=True)
    return folder / "bin" / "python"


def time_once(python: Path) -> float:
    start = time.perf_counter()
    subprocess.run([str(python), "-c", "pass"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def median_difference(a: list[float], b: list[float], resamples: int = 2000) -> dict:
    """median(b) - median(a) in milliseconds, with a 95% bootstrap interval over rounds (paired: same rounds)."""
    rng = random.Random(0)
    rounds = range(len(a))
    estimates = []
    for _ in range(resamples):
        picked = [rng.choice(rounds) for _ in rounds]
        estimates.append(statistics.median(b[i] for i in picked) - statistics.median(a[i] for i in picked))
    estimates.sort()
    return {
        "ms": 1000 * (statistics.median(b) - statistics.median(a)),
        "ci95_ms": [1000 * estimates[int(0.025 * resamples)], 1000 * estimates[int(0.975 * resamples) - 1]],
    }


def markdown_table(report: dict) -> str:
    lines = ["| `python -c pass` | median ms | 10th percentile ms | min ms | runs |", "|---|---|---|---|---|"]
    for arm in ARMS:
        seconds = sorted(report["seconds"][arm])
        lines.append(
            f"| {arm} | {1000 * statistics.median(seconds):.2f} | {1000 * seconds[len(seconds) // 10]:.2f} "
            f"| {1000 * seconds[0]:.2f} | {len(seconds)} |"
        )
    lines.append("")
    lines.append("| difference of medians | ms | 95% interval (ms) |")
    lines.append("|---|---|---|")
    for name, difference in report["differences"].items():
        low, high = difference["ci95_ms"]
        lines.append(f"| {name} | {difference['ms']:+.2f} | {low:+.2f} to {high:+.2f} |")
    return "\n".join(lines) + "\n\nRounds in shuffled order, each run a fresh process. " + describe(report) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000, help="timed rounds, each arm once (default 1000)")
    parser.add_argument("--results-dir", default="results/startup_hook", help="where results.json/.md go")
    parser.add_argument("--print-only", action="store_true", help="print the tables, write no results")
    args = parser.parse_args(argv)
    report = new_report("startup_hook", rounds=args.rounds)  # the machine's load before the runs
    with tempfile.TemporaryDirectory() as folder:
        pythons = {arm: make_venv(Path(folder, f"venv{index}"), arm) for index, arm in enumerate(ARMS)}
        seconds = {arm: [] for arm in ARMS}
        order = list(ARMS)
        for round_index in range(args.rounds + 1):
            random.Random(round_index).shuffle(order)
            timed = {arm: time_once(pythons[arm]) for arm in order}
            if round_index:
                for arm in ARMS:
                    seconds[arm].append(timed[arm])
    report.update(
        seconds=seconds,
        differences={
            f"{NOISE} - {BARE} (noise floor)": median_difference(seconds[BARE], seconds[NOISE]),
            f"{HOOK} - {BARE}": median_difference(seconds[BARE], seconds[HOOK]),
            f"{IMPORT_SYS} - {BARE}": median_difference(seconds[BARE], seconds[IMPORT_SYS]),
            f"{EMPTY_MODULE} - {BARE}": median_difference(seconds[BARE], seconds[EMPTY_MODULE]),
            f"{HOOK} - {EMPTY_MODULE}": median_difference(seconds[EMPTY_MODULE], seconds[HOOK]),
        },
    )
    table = markdown_table(report)
    print(table)
    if not args.print_only:
        print(f"wrote {write_results(args.results_dir, report, table)}/results.json and results.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
