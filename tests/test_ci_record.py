"""scripts/record_ci_versions.py: what CI records of each test run (results/ci/versions.{json,md})."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import load_script


record_ci_versions = load_script("record_ci_versions")

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.models.test_modeling_qwen3_gated_common.TestHeadwise" name="test_config"/>
<testcase classname="tests.models.test_modeling_qwen3_gated_common.TestHeadwise" name="test_tp_backward"><skipped/></testcase>
<testcase classname="tests.models.test_modeling_qwen3_gated_common.TestElementwise" name="test_load"><failure/></testcase>
<testcase classname="tests.models.test_modeling_qwen3_gated_common.TestElementwise" name="test_load"/>
<testcase classname="tests.models.test_tensor_parallel" name="test_two_ranks[colwise]"/>
<testcase classname="tests.cli.test_inspect" name="test_one"><error/></testcase>
</testsuite></testsuites>"""
LOG = "....s.F\n==== 1 failed, 3 passed, 1 skipped, 1 error in 12.50s ====\n"


def test_counts_per_file_with_a_test_reported_twice_counted_once_as_failed(tmp_path):
    (tmp_path / "run.xml").write_text(JUNIT)
    counts = record_ci_versions.count_outcomes(tmp_path / "run.xml")
    assert counts == {
        "tests/models/test_modeling_qwen3_gated_common.py": {"passed": 1, "skipped": 1, "failed": 1},
        "tests/models/test_tensor_parallel.py": {"passed": 1, "skipped": 0, "failed": 0},
        "tests/cli/test_inspect.py": {"passed": 0, "skipped": 0, "failed": 1},
    }


def test_each_run_is_recorded_with_its_versions_and_a_fresh_record_drops_the_old_runs(tmp_path):
    (tmp_path / "run.xml").write_text(JUNIT)
    (tmp_path / "run.log").write_text(LOG)
    out = tmp_path / "ci"
    common = ["--junit", str(tmp_path / "run.xml"), "--log", str(tmp_path / "run.log"), "--out", str(out)]
    record_ci_versions.main(["--fresh", "--run", "old", *common])
    record_ci_versions.main(["--fresh", "--run", "newest", *common])
    record_ci_versions.main(["--run", "floor", *common])
    report = json.loads((out / "versions.json").read_text())
    assert [run["name"] for run in report["runs"]] == ["newest", "floor"]
    floor = report["runs"][1]
    assert floor["pytest_summary"] == "1 failed, 3 passed, 1 skipped, 1 error in 12.50s"
    assert floor["totals"] == {"passed": 2, "skipped": 1, "failed": 2}
    assert floor["common_tests"] == {"passed": 1, "skipped": 1, "failed": 1}
    assert floor["versions"]["transformers"]  # the versions installed when the run was recorded
    table = (out / "versions.md").read_text()
    assert f"| floor | {floor['versions']['transformers']} |" in table and "| 2 | 1 | 2 | 1 / 1 | 1 / 0 |" in table


def test_records_in_results_carry_no_paths_of_the_machine_that_measured():
    import re

    import _results  # record_ci_versions put scripts/ on sys.path

    assert _results.portable("x --junit /tmp/tmp.O76cFEYdPm/floor.xml --out /root/out/gpu") == (
        "x --junit $SCRATCH/floor.xml --out $SCRATCH/gpu"
    )
    assert _results.portable(f"--out {_results.ROOT}/runs/a") == "--out runs/a"
    results = Path(__file__).resolve().parents[1] / "results"
    machine_path = re.compile(r"(?<![\w.~$-])/(?:tmp|home|root|work|Users)/")
    for record in sorted(results.rglob("*")):
        if record.suffix in (".json", ".md"):
            assert not machine_path.search(record.read_text()), record
