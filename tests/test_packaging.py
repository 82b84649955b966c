"""The built wheel works without the repository beside it.

The wheel is built from this checkout and unpacked into a folder of its own; every command then runs in a
fresh Python whose only gated_qwen is that folder, from a working directory outside the repository. What
the package needs at run time (the embedded default model, the released-architecture configs, the
benchmark's child module) must be in the wheel, or these fail.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from this checkout."""
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
    (built,) = wheels.glob("gated_qwen-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A folder holding only the unpacked wheel (a pure-Python wheel is its site-packages layout)."""
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


# The startup hook (gated_qwen_startup.py; setup.py ships its .pth): installed from the wheel into an environment
# of its own, a venv whose site-packages reaches the test environment's packages (torch, transformers) through a
# path line, so that its own site-packages, where pip installs the wheel, is the only one whose .pth files run.
def startup_line() -> str:
    """The .pth line setup.py writes (its STARTUP_LINE)."""
    tree = ast.parse((REPO / "setup.py").read_text())
    (value,) = [
        node.value for node in tree.body if isinstance(node, ast.Assign) and node.targets[0].id == "STARTUP_LINE"
    ]
    return ast.literal_eval(value)


def test_the_wheel_carries_the_startup_hook_and_its_record(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert {"gated_qwen_startup.pth", "gated_qwen_startup.py"} <= names  # at the top of site-packages
        assert archive.read("gated_qwen_startup.pth").decode() == startup_line()
        (record,) = [name for name in names if name.endswith(".dist-info/RECORD")]
        recorded = {line.split(",")[0] for line in archive.read(record).decode().splitlines()}
    assert {"gated_qwen_startup.pth", "gated_qwen_startup.py"} <= recorded  # so pip uninstall removes them


def venv_installing(venv: Path, *pip_install: str) -> tuple[Path, Path]:
    """A venv at ``venv`` into which pip installs ``pip_install`` (``--no-deps``: the test environment's packages
    are reached through a path line); returns (its python, its site-packages)."""
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    # the test environment's packages, after the venv's own ('~' sorts after gated_qwen_startup.pth)
    (site / "~test_environment.pth").write_text(sysconfig.get_path("purelib") + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "-q", "install", "--no-deps"]
    installed = subprocess.run([*pip, *pip_install], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return python, site


@pytest.fixture
def venv_with_wheel(wheel, tmp_path) -> tuple[Path, Path]:
    """A venv with the wheel installed by pip; returns (its python, its site-packages)."""
    return venv_installing(tmp_path / "venv", str(wheel))


def run_in(python: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(python), "-c", code], cwd=cwd, env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True
    )


LOAD_BOTH = """
import sys
from transformers import AutoConfig, AutoModelForCausalLM
for model_type in ("qwen3_gated", "qwen3_moe_gated"):
    config = AutoConfig.for_model(model_type, num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                                  moe_intermediate_size=16, num_experts=2, num_experts_per_tok=1, num_attention_heads=2,
                                  num_key_value_heads=1, head_dim=16, vocab_size=64)
    AutoModelForCausalLM.from_config(config).save_pretrained(model_type)
    print(type(AutoModelForCausalLM.from_pretrained(model_type)).__name__)
print(sys.modules["gated_qwen"].__file__)
"""


@pytest.mark.slow
def test_the_installed_wheel_registers_in_every_process_and_leaves_with_pip_uninstall(venv_with_wheel, tmp_path):
    python, site = venv_with_wheel
    assert (site / "gated_qwen_startup.pth").read_text() == startup_line()
    loaded = run_in(python, LOAD_BOTH, tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    first, second, package = loaded.stdout.split()
    assert (first, second) == ("Qwen3GatedForCausalLM", "Qwen3MoeGatedForCausalLM")
    assert Path(package).is_relative_to(site)  # the wheel's gated_qwen, not the checkout's

    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "uninstall", "-y", "-q", "gated-qwen"],
        check=True,
        capture_output=True,
    )
    assert not (site / "gated_qwen_startup.pth").exists() and not (site / "gated_qwen_startup.py").exists()
    assert not (site / "gated_qwen").exists()
    after = run_in(python, "import sys, transformers; print('gated_qwen_startup' in sys.modules)", tmp_path)
    assert after.returncode == 0 and after.stdout.split() == ["False"], after.stderr


@pytest.mark.slow
def test_a_half_uninstalled_or_broken_gated_qwen_never_breaks_a_process(venv_with_wheel, tmp_path):
    python, site = venv_with_wheel
    shutil.rmtree(site / "gated_qwen")  # the package gone, the hook left: silent
    for code in ("pass", "import transformers"):
        result = run_in(python, code, tmp_path)
        assert result.returncode == 0 and "gated" not in result.stderr, result.stderr
    (site / "gated_qwen_startup.py").unlink()  # the .pth alone: silent too
    result = run_in(python, "import transformers", tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr

    (site / "gated_qwen_startup.py").write_text((REPO / "gated_qwen_startup.py").read_text())
    (site / "gated_qwen").mkdir()
    (site / "gated_qwen" / "__init__.py").write_text("raise RuntimeError('a broken install')\n")
    broken = run_in(python, "import transformers; print(transformers.__version__)", tmp_path)
    assert broken.returncode == 0 and broken.stdout.strip(), broken.stderr  # transformers still imports
    assert "gated-qwen is installed but could not register" in broken.stderr
    assert "RuntimeError: a broken install" in broken.stderr and "pip install --force-reinstall" in broken.stderr


@pytest.mark.slow
def test_an_editable_install_whose_checkout_is_deleted_leaves_every_start_quiet(tmp_path):
    # pip install -e . from a checkout registers in a fresh process; the checkout deleted (the hook's module with
    # it, setuptools' editable finder pointing at nothing), every start stays quiet.
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "gated_qwen_startup.py"):
        shutil.copy(REPO / name, checkout / name)
    shutil.copytree(REPO / "gated_qwen", checkout / "gated_qwen", ignore=shutil.ignore_patterns("__pycache__"))
    python, site = venv_installing(tmp_path / "venv", "--no-build-isolation", "-e", str(checkout))
    assert (site / "gated_qwen_startup.pth").read_text() == startup_line()
    registered = run_in(
        python, "from transformers import AutoConfig; print(AutoConfig.for_model('qwen3_gated'))", tmp_path
    )
    assert registered.returncode == 0 and "Qwen3GatedConfig" in registered.stdout, registered.stderr[-3000:]

    shutil.rmtree(checkout)
    for code in ("pass", "import transformers"):
        result = run_in(python, code, tmp_path)
        assert result.returncode == 0 and result.stderr == "", result.stderr
