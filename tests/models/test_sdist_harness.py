"""The harness that fetches transformers' common tests: what it extracts, what it refuses, and CI's rule.

The extraction is checked on small archives laid out as a transformers sdist, without network; the last
test runs the common-test module in a fresh pytest with the package index unreachable.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from transformers_sdist_harness import HARNESS_FILES, STUBS, HarnessFileMissing, extract_harness


COMMON_TESTS = Path(__file__).with_name("test_modeling_qwen3_gated_common.py")


def fake_sdist(path: Path, version: str, files: dict[str, str]) -> Path:
    """A ``transformers-<version>.tar.gz`` holding ``tests/<name>`` for each of ``files``."""
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            member = tarfile.TarInfo(f"transformers-{version}/tests/{name}")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return path


def mixins(**extra: str) -> dict[str, str]:
    files = dict.fromkeys(HARNESS_FILES, "")
    files.update(extra)
    return files


def test_imported_files_come_from_the_sdist_and_the_stand_ins_replace_what_it_lacks(tmp_path):
    files = mixins(
        **{
            "test_modeling_common.py": "from .generation.test_utils import GenerationTesterMixin\n",
            "test_tensor_parallel_mixin.py": "from .test_fsdp_mixin import _set_rank_device\n",
            "test_fsdp_mixin.py": "def _set_rank_device(rank):\n    from .fsdp_helpers import device\n",
            "fsdp_helpers.py": "device = 'cpu'\n",
            "test_unrelated.py": "raise RuntimeError('not imported by the mixins')\n",
        }
    )
    package = tmp_path / "package"
    extract_harness("9.9.9", fake_sdist(tmp_path / "sdist.tar.gz", "9.9.9", files), package)
    assert (package / "generation" / "test_utils.py").read_text() == STUBS["generation/test_utils.py"]
    assert (package / "generation" / "__init__.py").is_file()
    # followed transitively, from a function body too
    assert (package / "fsdp_helpers.py").read_text() == "device = 'cpu'\n"
    assert not (package / "test_unrelated.py").exists()


def test_a_file_neither_the_sdist_nor_a_stand_in_provides_is_named(tmp_path):
    files = mixins(**{"test_training_mixin.py": "from .training.new_helpers import Monitor\n"})
    with pytest.raises(HarnessFileMissing) as missing:
        extract_harness("9.9.9", fake_sdist(tmp_path / "sdist.tar.gz", "9.9.9", files), tmp_path / "package")
    assert str(missing.value) == (
        "transformers 9.9.9's tests/test_training_mixin.py import tests/training/new_helpers.py, which its sdist does "
        "not carry and no stand-in covers: add a stand-in for it to STUBS in transformers_sdist_harness.py"
    )


@pytest.mark.parametrize("ci, outcome", [("", "skipped"), ("true", "error")])
@pytest.mark.slow
def test_without_network_the_common_tests_skip_but_fail_in_ci(tmp_path, ci, outcome):
    env = dict(
        os.environ,
        CI=ci,
        GATED_QWEN_TRANSFORMERS_TESTS=str(tmp_path / "empty"),
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL="http://127.0.0.1:9/simple",
        PIP_FIND_LINKS="",
        PIP_NO_INDEX="",
    )
    env.pop("PYTEST_ADDOPTS", None)  # CI's (a JUnit report for the outer run) is not this inner run's
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra", str(COMMON_TESTS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    summary = run.stdout.strip().splitlines()[-1]
    assert outcome in summary, run.stdout[-3000:]
    if ci:  # 2: interrupted by a collection error (5, "no tests collected", is what a module-level skip gives)
        assert run.returncode in (1, 2) and "could not be fetched and CI=true" in run.stdout, run.stdout[-3000:]
    else:
        assert run.returncode == 5 and "transformers' common tests are unavailable" in run.stdout, run.stdout[-3000:]
