"""The built wheel works without the repository beside it.

The wheel is built from this checkout and unpacked into a folder of its own; every command then runs in a
fresh Python whose only gated_qwen is that folder, from a working directory outside the repository. What
the package needs at run time (the embedded default model, the released-architecture configs, the
benchmark's child module) must be in the wheel, or these fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A folder holding only the unpacked wheel (a pure-Python wheel is its site-packages layout)."""
    wheels = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("gated_qwen-*.whl")
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def run(installed: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(installed), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "gated_qwen", *args], cwd=cwd, env=env, capture_output=True, text=True
    )


@pytest.mark.slow
def test_the_wheel_ships_what_the_package_reads(installed):
    package = installed / "gated_qwen"
    assert (package / "py.typed").is_file()
    assert (package / "configs" / "1B_gate_headwise.json").is_file()
    assert (package / "default_models" / "headwise" / "model.safetensors").is_file()
    assert (package / "tools" / "benchmark" / "child.py").is_file()


@pytest.mark.slow
def test_commands_run_from_the_installed_wheel(installed, tmp_path):
    probe = subprocess.run(
        [sys.executable, "-c", "import gated_qwen; print(gated_qwen.__file__)"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(probe.stdout.strip()).is_relative_to(installed)  # not the checkout's package

    generated = run(installed, tmp_path, "generate", "--max-new-tokens", "4", "--greedy", "def read(path):")
    assert generated.returncode == 0, generated.stderr
    assert generated.stdout.strip()

    embedded = installed / "gated_qwen" / "default_models" / "headwise"
    inspected = run(installed, tmp_path, "inspect", str(embedded), "--json")
    assert inspected.returncode == 0, inspected.stderr
    assert '"gate_type": "headwise"' in inspected.stdout

    converted = run(installed, tmp_path, "convert", str(embedded), "resaved", "--gate", "keep", "--quiet")
    assert converted.returncode == 0, converted.stderr
    assert (tmp_path / "resaved" / "config.json").is_file()

    exported = run(installed, tmp_path, "export", "resaved", "qwen3_5", "--to", "qwen3_5", "--quiet")
    assert exported.returncode == 0, exported.stderr
    assert '"model_type": "qwen3_5_text"' in (tmp_path / "qwen3_5" / "config.json").read_text()

    bench = run(
        installed,
        tmp_path,
        "bench",
        "--size",
        "1b",
        "--skip",
        "models",
        "--skip",
        "loading",
        "--skip",
        "conversion",
        "--output-dir",
        "bench",
    )
    assert bench.returncode == 0, bench.stderr
    assert "Qwen3Gated elementwise | 1838.28M" in (tmp_path / "bench" / "benchmark.md").read_text()


def test_ci_runs_the_fast_tier_first_then_exactly_readmes_test_command_on_newest_and_floor():
    """.ci/run's contract: README's test command as it is (the whole suite), after the fast tier of docs/development.md."""
    readme = (REPO / "README.md").read_text()
    first_block = readme.split("```", 2)[1]
    (readme_command,) = [line.split("#")[0].strip() for line in first_block.splitlines() if "pytest" in line]
    assert readme_command == "python -m pytest -q"  # the whole suite: no -m, no path
    fast_command = 'python -m pytest -q -m "not slow"'
    assert fast_command in (REPO / "docs" / "development.md").read_text()
    ci = [
        line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines() if not line.lstrip().startswith("#")
    ]
    pytest_lines = [line for line in ci if "python -m pytest" in line and "vllm" not in line]
    fast, newest, floor = pytest_lines
    assert fast == fast_command
    for line in (newest, floor):
        assert line.startswith("PYTEST_ADDOPTS=")  # the JUnit report, without touching the command
        command = line.split(" ", 1)[1].split(" 2>&1")[0]
        assert command == readme_command
    assert ci.index(fast) < ci.index(newest) < ci.index(floor)
