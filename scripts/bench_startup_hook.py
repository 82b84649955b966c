"""What gated-qwen's startup hook costs a Python that never imports transformers: ``python -c pass`` with and without.

    python scripts/bench_startup_hook.py                 # 300 rounds
    python scripts/bench_startup_hook.py --rounds 1000 --print-only

Two venvs of this interpreter, made for the measurement (``--without-pip``, in a temporary folder): one bare, one
with the hook as an installation leaves it at the top of its site-packages (``gated_qwen_startup.pth``, the line
setup.py writes, and ``gated_qwen_startup.py`` from this checkout, byte-compiled as pip does). Each round runs ``python -c pass`` in the bare
venv twice and in the hooked one once, in an order shuffled per round, each a fresh process timed with
``time.perf_counter`` around ``subprocess.run`` (the first round is a warm-up, not counted). The two bare arms
give the noise floor: the difference between two arms that run the same thing. Differences of medians come with
a 95% interval from resampling the rounds (bootstrap, 2000 resamples). ``-X importtime`` gives ``site``'s own time
in each venv (it runs the .pth files), in microseconds, as Python counts it.

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


ARMS = ("bare", "bare again", "with the hook")


def startup_line() -> str:
    """The .pth line setup.py installs (its STARTUP_LINE, read without running setup.py)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    return next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "STARTUP_LINE" for t in node.targets)
    )


def make_venv(folder: Path, hooked: bool) -> Path:
    """A venv without pip; with the hook at the top of its site-packages if ``hooked``. Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(folder), "platbase": str(folder)}))
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


def site_microseconds(python: Path) -> int:
    """The time of ``site`` (cumulative, .pth files included) at a start, from ``-X importtime``, in microseconds."""
    result = subprocess.run(
        [str(python), "-X", "importtime", "-c", "pass"], capture_output=True, text=True, check=True
    )
    line = next(line for line in result.stderr.splitlines() if line.split("|")[-1].strip() == "site")
    return int(line.split("|")[1])


def markdown_table(report: dict) -> str:
    lines = ["| `python -c pass` | median ms | min ms | runs |", "|---|---|---|---|"]
    for arm in ARMS:
        seconds = report["seconds"][arm]
        lines.append(
            f"| {arm} | {1000 * statistics.median(seconds):.2f} | {1000 * min(seconds):.2f} | {len(seconds)} |"
        )
    lines.append("")
    lines.append("| difference of medians | ms | 95% interval (ms) |")
    lines.append("|---|---|---|")
    for name, difference in report["differences"].items():
        low, high = difference["ci95_ms"]
        lines.append(f"| {name} | {difference['ms']:+.2f} | {low:+.2f} to {high:+.2f} |")
    site = report["site_microseconds"]
    return (
        "\n".join(lines)
        + "\n\n`site`'s own time at a start (`-X importtime`, .pth files included, median of "
        + f"{len(site['bare'])}): {statistics.median(site['bare']):.0f} µs bare, "
        + f"{statistics.median(site['with the hook']):.0f} µs with the hook. "
        + "Rounds in shuffled order, each run a fresh process. "
        + describe(report)
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300, help="timed rounds, each arm once (default 300)")
    parser.add_argument("--results-dir", default="results/startup_hook", help="where results.json/.md go")
    parser.add_argument("--print-only", action="store_true", help="print the tables, write no results")
    args = parser.parse_args(argv)
    report = new_report("startup_hook", rounds=args.rounds)  # the machine's load before the runs
    with tempfile.TemporaryDirectory() as folder:
        bare = make_venv(Path(folder, "bare"), hooked=False)
        hooked = make_venv(Path(folder, "hooked"), hooked=True)
        pythons = {"bare": bare, "bare again": bare, "with the hook": hooked}
        seconds = {arm: [] for arm in ARMS}
        order = list(ARMS)
        for round_index in range(args.rounds + 1):
            random.Random(round_index).shuffle(order)
            timed = {arm: time_once(pythons[arm]) for arm in order}
            if round_index:
                for arm in ARMS:
                    seconds[arm].append(timed[arm])
        site = {arm: [site_microseconds(pythons[arm]) for _ in range(21)] for arm in ("bare", "with the hook")}
    report.update(
        seconds=seconds,
        differences={
            "bare again - bare (noise floor)": median_difference(seconds["bare"], seconds["bare again"]),
            "with the hook - bare": median_difference(seconds["bare"], seconds["with the hook"]),
        },
        site_microseconds=site,
    )
    table = markdown_table(report)
    print(table)
    if not args.print_only:
        print(f"wrote {write_results(args.results_dir, report, table)}/results.json and results.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
