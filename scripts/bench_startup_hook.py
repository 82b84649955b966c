"""What gated-qwen's startup hook costs a Python that never imports transformers: ``python -c pass`` with and without.

    python scripts/bench_startup_hook.py                 # 500 rounds
    python scripts/bench_startup_hook.py --rounds 1000 --print-only

Four venvs of this interpreter, made for the measurement (``--without-pip``, in a temporary folder): two bare, in
folders of their own, holding one .pth file of another project (as environments do, see OTHER_PTH), one like them
with the hook, and one without any .pth file (what the first .pth file of an environment costs). The hook is there
as an installation leaves it at the top of site-packages (``gated_qwen_startup.pth``, the line setup.py writes, and ``gated_qwen_startup.py`` from this checkout,
byte-compiled as pip does). Each round runs ``python -c pass`` in each, in an order shuffled per round, each a fresh
process timed with ``time.perf_counter`` around ``subprocess.run`` (the first round is a warm-up, not counted). The
two bare venvs give the noise floor: the difference between two arms that run the same thing. Differences of
medians come with a 95% interval from resampling the rounds (bootstrap, 2000 resamples). Then, inside fresh
processes, the hook's own cost: compiling and running its line as ``site`` does, once per process, in microseconds.

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


ARMS = ("bare", "bare, another venv", "with the hook", "bare, no .pth file at all")
# Every venv but the last holds one .pth file of another project (a comment line), as an environment where pip
# installed anything does (setuptools' distutils-precedence.pth, an editable install's __editable__ .pth): the
# hook's arm then measures its own line, the last one what the first .pth file of an environment costs.
OTHER_PTH = "# another project's .pth\n"


def startup_line() -> str:
    """The .pth line setup.py installs (its STARTUP_LINE, read without running setup.py)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    return next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "STARTUP_LINE" for t in node.targets)
    )


def make_venv(folder: Path, hooked: bool, other_pth: bool = True) -> Path:
    """A venv without pip; with the hook at the top of its site-packages if ``hooked``, and another project's .pth
    if ``other_pth``. Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(folder), "platbase": str(folder)}))
    if other_pth:
        (site / "another_project.pth").write_text(OTHER_PTH)
    if hooked:
        (site / "gated_qwen_startup.pth").write_text(startup_line())
        (site / "gated_qwen_startup.py").write_text((ROOT / "gated_qwen_startup.py").read_text())
        # byte-compiled, as pip leaves an installed wheel's modules (PYTHONDONTWRITEBYTECODE would keep it from
        # being written at the first run)
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


EXEC_LINE = """
import sys, time
line = open(sys.argv[1]).read()
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "GatedQwenStartupFinder"]
start = time.perf_counter()
exec(line, {})
print(1e6 * (time.perf_counter() - start))
"""


def exec_line_microseconds(python: Path, processes: int = 41) -> list[float]:
    """What site does with the hook's line (compile and run it), timed inside fresh processes of the hooked venv,
    once each (the first compilation of a process, as at a start): microseconds, one per process."""
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], capture_output=True, text=True
    ).stdout.strip()
    command = [str(python), "-c", EXEC_LINE, str(Path(site, "gated_qwen_startup.pth"))]
    return [
        float(subprocess.run(command, capture_output=True, text=True, check=True).stdout) for _ in range(processes)
    ]


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
    return (
        "\n".join(lines)
        + "\n\nWhat the hook's line costs inside a process (compiled and run as `site` does, once in each of "
        + f"{len(report['exec_line_microseconds'])} fresh processes, median): "
        + f"{statistics.median(report['exec_line_microseconds']):.0f} µs. "
        + "Rounds in shuffled order, each run a fresh process. "
        + describe(report)
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500, help="timed rounds, each arm once (default 500)")
    parser.add_argument("--results-dir", default="results/startup_hook", help="where results.json/.md go")
    parser.add_argument("--print-only", action="store_true", help="print the tables, write no results")
    args = parser.parse_args(argv)
    report = new_report("startup_hook", rounds=args.rounds)  # the machine's load before the runs
    with tempfile.TemporaryDirectory() as folder:
        pythons = {
            "bare": make_venv(Path(folder, "bare"), hooked=False),
            "bare, another venv": make_venv(Path(folder, "bare2"), hooked=False),
            "with the hook": make_venv(Path(folder, "hooked"), hooked=True),
            "bare, no .pth file at all": make_venv(Path(folder, "empty"), hooked=False, other_pth=False),
        }
        seconds = {arm: [] for arm in ARMS}
        order = list(ARMS)
        for round_index in range(args.rounds + 1):
            random.Random(round_index).shuffle(order)
            timed = {arm: time_once(pythons[arm]) for arm in order}
            if round_index:
                for arm in ARMS:
                    seconds[arm].append(timed[arm])
        line_microseconds = exec_line_microseconds(pythons["with the hook"])
    report.update(
        seconds=seconds,
        differences={
            "bare, another venv - bare (noise floor)": median_difference(
                seconds["bare"], seconds["bare, another venv"]
            ),
            "with the hook - bare": median_difference(seconds["bare"], seconds["with the hook"]),
            "bare - no .pth file at all": median_difference(seconds["bare, no .pth file at all"], seconds["bare"]),
        },
        exec_line_microseconds=line_microseconds,
    )
    table = markdown_table(report)
    print(table)
    if not args.print_only:
        print(f"wrote {write_results(args.results_dir, report, table)}/results.json and results.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
