"""Record which versions a CI test run used and what it counted: ``results/ci/versions.{json,md}``.

``.ci/run`` runs the test command twice in one environment, first with the newest transformers, then with
the floor the project declares (pyproject's ``transformers>=...``), and calls this script after each run
with the run's JUnit XML (``pytest --junitxml``) and its console output. Each call records that run: the
versions installed at that moment (through ``scripts/_results.py``), pytest's own summary line, and the
counts of transformers' common model tests and of the tensor-parallel tests, which must have run (not
skipped) on both ends of the range. ``--fresh`` starts a new record (the first run of a CI).

    PYTEST_ADDOPTS=--junitxml=newest.xml python -m pytest -q | tee newest.log
    python scripts/record_ci_versions.py --fresh --run newest --junit newest.xml --log newest.log
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import ROOT, describe, new_report, package_versions, write_results


FOLDER = ROOT / "results" / "ci"
# file of the tests -> the name the record gives their counts
TRACKED = {
    "tests/models/test_modeling_qwen3_gated_common.py": "common_tests",
    "tests/models/test_tensor_parallel.py": "tensor_parallel_tests",
}
OUTCOMES = ("passed", "skipped", "failed")


def count_outcomes(junit: Path) -> dict[str, dict[str, int]]:
    """Outcome counts per test file from a JUnit XML; a test reported several times (subtests) counts once.

    A test counts as failed if any of its reports failed or errored, as skipped if all were skipped.
    """
    reports: dict[tuple[str, str], list[str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        reports.setdefault((case.get("classname", ""), case.get("name", "")), []).append(outcome)
    counts: dict[str, dict[str, int]] = {}
    for (classname, _), outcomes in reports.items():
        # classname "tests.models.test_x.TestClass" or "tests.models.test_x": the file is the first test_* part
        parts = classname.split(".")
        module = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
        path = "/".join(parts[: module + 1]) + ".py"
        outcome = "failed" if "failed" in outcomes else "skipped" if set(outcomes) == {"skipped"} else "passed"
        counts.setdefault(path, dict.fromkeys(OUTCOMES, 0))[outcome] += 1
    return counts


def pytest_summary(log: Path) -> str:
    """pytest's last line (``703 passed, 215 skipped, ... in 612.3s``), without the ``=`` around it."""
    lines = [line.strip("= \n") for line in log.read_text(errors="replace").splitlines() if line.strip()]
    finals = [line for line in lines if re.search(r"\b(passed|failed|skipped|error)\b.* in [\d.]+s", line)]
    return finals[-1] if finals else "(no pytest summary found)"


def record_run(name: str, junit: Path, log: Path) -> dict:
    per_file = count_outcomes(junit)
    totals = {outcome: sum(counts[outcome] for counts in per_file.values()) for outcome in OUTCOMES}
    return {
        "name": name,
        "versions": package_versions(),
        "pytest_summary": pytest_summary(log),
        "totals": totals,
        **{label: per_file.get(path, dict.fromkeys(OUTCOMES, 0)) for path, label in TRACKED.items()},
    }


def markdown(report: dict) -> str:
    rows = [
        "| run | transformers | torch | tests passed | skipped | failed | common tests passed / skipped | TP tests passed / skipped |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in report["runs"]:
        versions, totals = run["versions"], run["totals"]
        common, tp = run["common_tests"], run["tensor_parallel_tests"]
        rows.append(
            f"| {run['name']} | {versions['transformers']} | {versions['torch']} | {totals['passed']} | "
            f"{totals['skipped']} | {totals['failed']} | {common['passed']} / {common['skipped']} | "
            f"{tp['passed']} / {tp['skipped']} |"
        )
    summaries = "\n".join(f"- {run['name']}: `{run['pytest_summary']}`" for run in report["runs"])
    return (
        "The test command (`python -m pytest -q`) on both ends of the transformers range, in the last run that "
        "recorded them. The table counts the test cases of pytest's JUnit report (`tests/models/"
        "test_modeling_qwen3_gated_common.py`: transformers' common tests; `tests/models/test_tensor_parallel.py`: "
        "the 2-rank tests), a test with subtests once; pytest's own summary line, which also counts some "
        "subtests' reports, follows it.\n\n"
        + "\n".join(rows)
        + f"\n\npytest's summary lines:\n\n{summaries}\n\n{describe(report)}\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="the run's name in the record, e.g. newest or floor")
    parser.add_argument("--junit", required=True, type=Path, help="the run's pytest --junitxml file")
    parser.add_argument("--log", required=True, type=Path, help="the run's console output (for pytest's summary line)")
    parser.add_argument("--fresh", action="store_true", help="start a new record instead of adding to the last one")
    parser.add_argument("--out", type=Path, default=FOLDER, help="folder of versions.json / versions.md")
    args = parser.parse_args(argv)

    previous = args.out / "versions.json"
    runs = [] if args.fresh or not previous.is_file() else json.loads(previous.read_text())["runs"]
    runs = [run for run in runs if run["name"] != args.run] + [record_run(args.run, args.junit, args.log)]
    report = new_report("ci", runs=runs)
    write_results(args.out, report, markdown(report), name="versions")
    for run in runs:
        print(
            f"{run['name']}: transformers {run['versions']['transformers']}: {run['pytest_summary']}; common tests "
            f"{run['common_tests']['passed']} passed / {run['common_tests']['skipped']} skipped"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
