"""Fetching transformers' own test mixins from the sdist of a release, with stand-ins for what it lacks.

Used by ``test_modeling_qwen3_gated_common.py``; tested without network in ``test_sdist_harness.py``.
"""

from __future__ import annotations

import ast
import os
import posixpath
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path


# The mixins run here; what they import from tests/ follows (from the sdist, or a stand-in below).
HARNESS_FILES = (
    "test_modeling_common.py",
    "test_configuration_common.py",
    "test_tensor_parallel_mixin.py",
    "test_training_mixin.py",
)
PACKAGE = "transformers_sdist_tests"
# Stand-ins for files the sdist's test modules import but the sdist does not carry (its tests/ has no sub-folders).
# A stand-in is used whether or not the sdist has the file; every other imported file comes from the sdist.
STUBS = {
    # The export and generation mixins are not in the sdist: their tests do not run here (generation is
    # tested by this project's own tests); test_generation_tester_mixin_inheritance is skipped below.
    "exporters/test_export.py": "class ExportTesterMixin:\n    pass\n",
    "generation/test_utils.py": "class GenerationTesterMixin:\n    pass\n",
    # Values that differ from PreTrainedConfig's defaults, for ConfigTester.check_config_arguments_init.
    "utils/test_configuration_utils.py": (
        "config_common_kwargs = {\n"
        "    'return_dict': False, 'output_hidden_states': True, 'dtype': 'float16', 'chunk_size_feed_forward': 5,\n"
        "    'architectures': ['BertModel'], 'id2label': {0: 'label'}, 'label2id': {'label': '0'},\n"
        "    'problem_type': 'regression', 'tokenizer_class': 'BertTokenizerFast',\n"
        "    'bos_token_id': 6, 'pad_token_id': 7, 'eos_token_id': 8,\n"
        "}\n"
    ),
    # One process per rank on CPU (gloo), each calling ``func(rank, *args)`` in its process group.
    "distributed_testing_utils.py": (
        "import os\n"
        "import socket\n\n"
        "import torch\n"
        "import torch.distributed as dist\n"
        "import torch.multiprocessing as mp\n\n\n"
        "def _rank_main(rank, world_size, port, func, args):\n"
        "    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),\n"
        "                      WORLD_SIZE=str(world_size))\n"
        "    torch.set_num_threads(1)\n"
        "    dist.init_process_group('gloo', rank=rank, world_size=world_size)\n"
        "    try:\n"
        "        func(rank, *args)\n"
        "    finally:\n"
        "        dist.destroy_process_group()\n\n\n"
        "def run_distributed(world_size):\n"
        "    def decorate(func):\n"
        "        def run(*args):\n"
        "            with socket.socket() as probe:\n"
        "                probe.bind(('127.0.0.1', 0))\n"
        "                port = probe.getsockname()[1]\n"
        "            mp.start_processes(_rank_main, args=(world_size, port, func, args), nprocs=world_size,\n"
        "                               join=True, start_method='spawn')\n"
        "        return run\n"
        "    return decorate\n"
    ),
}


class HarnessFileMissing(RuntimeError):
    """The common tests import a file of transformers' tests/ that neither the sdist nor a stand-in provides."""


def cache_root(version: str) -> Path:
    """``~/.cache/gated-qwen/transformers-<version>-sdist-tests`` (``$XDG_CACHE_HOME`` honoured), or $GATED_QWEN_TRANSFORMERS_TESTS."""
    override = os.environ.get("GATED_QWEN_TRANSFORMERS_TESTS")
    if override:
        return Path(override)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "gated-qwen" / f"transformers-{version}-sdist-tests"


def download_sdist(version: str, into: Path) -> Path:
    """``pip download`` the transformers sdist into ``into``; raises RuntimeError saying why it failed."""
    base = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--retries",
        "1",
        "--timeout",
        "30",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(into),
        f"transformers=={version}",
    ]
    errors = []
    # pip prepares the sdist's metadata; without build isolation it reuses this environment's setuptools (fast).
    for extra in (["--no-build-isolation"], []):
        result = subprocess.run(base + extra, capture_output=True, text=True, timeout=900)
        archives = sorted(into.glob(f"transformers-{version}.tar.gz"))
        if result.returncode == 0 and archives:
            return archives[0]
        errors.append((result.stderr.strip().splitlines() or ["no output"])[-1])
    raise RuntimeError(f"pip could not download the transformers {version} sdist: {errors[-1]}")


def _relative_imports(source: str, path: str) -> set[str]:
    """The files under tests/ that the module at ``path`` (relative to tests/) imports relatively."""
    folder = posixpath.dirname(path)
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = folder
            for _ in range(node.level - 1):
                base = posixpath.dirname(base)
            if node.module:
                found.add(posixpath.join(base, *node.module.split(".")) + ".py")
            else:  # from . import name
                found.update(posixpath.join(base, alias.name) + ".py" for alias in node.names)
    return found


def extract_harness(version: str, archive: Path, package: Path) -> None:
    """Write HARNESS_FILES and every tests/ file they import (transitively) from ``archive``, or its stand-in."""
    prefix = f"transformers-{version}/tests/"
    with tarfile.open(archive) as tar:
        members = {member.name[len(prefix) :]: member for member in tar.getmembers() if member.name.startswith(prefix)}
        pending, written = [(path, "the common tests") for path in HARNESS_FILES], set()
        while pending:
            path, importer = pending.pop()
            if path in written:
                continue
            written.add(path)
            target = package / path
            target.parent.mkdir(parents=True, exist_ok=True)
            for parent in Path(path).parents:
                (package / parent / "__init__.py").touch()
            if path in STUBS:
                target.write_text(STUBS[path])
                continue
            if path not in members:
                raise HarnessFileMissing(
                    f"transformers {version}'s {importer} import tests/{path}, which its sdist does not carry "
                    f"and no stand-in covers: add a stand-in for it to STUBS in {Path(__file__).name}"
                )
            source = tar.extractfile(members[path]).read().decode()
            target.write_text(source)
            pending.extend((imported, f"tests/{path}") for imported in _relative_imports(source, path) - written)


def fetch_harness(version: str) -> Path:
    """The folder holding the ``transformers_sdist_tests`` package; downloads and unpacks it on first use."""
    root = cache_root(version)
    if (root / PACKAGE / "__init__.py").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as scratch:
        archive = download_sdist(version, Path(scratch))
        staging = Path(scratch) / "staging"
        package = staging / PACKAGE
        package.mkdir(parents=True)
        extract_harness(version, archive, package)
        (package / "__init__.py").write_text(f'"""transformers {version} sdist tests, with stand-ins."""\n')
        if root.exists():
            shutil.rmtree(root)
        os.replace(staging, root)
    return root
