"""transformers' own common model tests (its 5.24.0 sdist), run against Qwen3Gated headwise and elementwise.

The test files come from the ``transformers==5.24.0`` source distribution on the package registry,
fetched once with pip and kept under pytest's cache folder; nothing of them is copied into this
repository. The sdist lacks a few files they import; the small stand-ins written below replace them.
Without network (and without a cached copy) these tests skip, saying why.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest
import warnings
from pathlib import Path

import pytest
import torch

from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM, Qwen3GatedForSequenceClassification, Qwen3GatedModel

TRANSFORMERS_VERSION = "5.24.0"
HARNESS_FILES = (
    "test_modeling_common.py",
    "test_configuration_common.py",
    "test_tensor_parallel_mixin.py",
    "test_training_mixin.py",
)
PACKAGE = "transformers_sdist_tests"
RUN_ALL = os.environ.get("GATED_QWEN_ALL_COMMON_TESTS") == "1"

# Stand-ins for the files the sdist's test modules import but the sdist does not carry.
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


def _cache_root() -> Path:
    """pytest's cache folder of this repository (``.pytest_cache/d/``), or $GATED_QWEN_TRANSFORMERS_TESTS."""
    override = os.environ.get("GATED_QWEN_TRANSFORMERS_TESTS")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / ".pytest_cache" / "d" / f"transformers-{TRANSFORMERS_VERSION}-tests"


def _download_sdist(into: Path) -> Path:
    """``pip download`` the transformers sdist into ``into``; raises RuntimeError saying why it failed."""
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--retries", "1",
            "--timeout", "30", "--disable-pip-version-check", "-q", "-d", str(into), f"transformers=={TRANSFORMERS_VERSION}"]
    errors = []
    # pip prepares the sdist's metadata; without build isolation it reuses this environment's setuptools (fast).
    for extra in (["--no-build-isolation"], []):
        result = subprocess.run(base + extra, capture_output=True, text=True, timeout=900)
        archives = sorted(into.glob(f"transformers-{TRANSFORMERS_VERSION}.tar.gz"))
        if result.returncode == 0 and archives:
            return archives[0]
        errors.append((result.stderr.strip().splitlines() or ["no output"])[-1])
    raise RuntimeError(f"pip could not download the transformers {TRANSFORMERS_VERSION} sdist: {errors[-1]}")


def fetch_harness() -> Path:
    """The folder holding the ``transformers_sdist_tests`` package; downloads and unpacks it on first use."""
    root = _cache_root()
    if (root / PACKAGE / "__init__.py").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as scratch:
        archive = _download_sdist(Path(scratch))
        staging = Path(scratch) / "staging"
        package = staging / PACKAGE
        package.mkdir(parents=True)
        with tarfile.open(archive) as tar:
            for name in HARNESS_FILES:
                member = tar.getmember(f"transformers-{TRANSFORMERS_VERSION}/tests/{name}")
                (package / name).write_bytes(tar.extractfile(member).read())
        for relative, text in STUBS.items():
            path = package / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            (path.parent / "__init__.py").touch()
            path.write_text(text)
        (package / "__init__.py").write_text(f'"""transformers {TRANSFORMERS_VERSION} sdist tests, with stand-ins."""\n')
        if root.exists():
            shutil.rmtree(root)
        os.replace(staging, root)
    return root


import transformers  # noqa: E402

# The sdist's tests import the testing utilities of their own release; an older transformers (the
# project's lower bound, or what vLLM installs) lacks some of them.
if transformers.__version__ != TRANSFORMERS_VERSION:
    pytest.skip(
        f"transformers' common tests are those of {TRANSFORMERS_VERSION}; transformers {transformers.__version__} is installed",
        allow_module_level=True,
    )
try:
    sys.path.insert(0, str(fetch_harness()))
except (RuntimeError, OSError, subprocess.SubprocessError) as error:
    pytest.skip(f"transformers' common tests are unavailable: {error}", allow_module_level=True)

with warnings.catch_warnings():  # transformers registers its own pytest marks in its conftest, not shipped
    warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
    common = importlib.import_module(f"{PACKAGE}.test_modeling_common")
    configuration_common = importlib.import_module(f"{PACKAGE}.test_configuration_common")
    tensor_parallel = importlib.import_module(f"{PACKAGE}.test_tensor_parallel_mixin")
    training = importlib.import_module(f"{PACKAGE}.test_training_mixin")
auto_names = importlib.import_module("transformers.models.auto.modeling_auto")

# The harness finds a class's role (base model, causal LM, classifier) by class name in transformers'
# own name tables, which Auto-class registration does not extend; these entries are added for the tests.
ROLES = {
    "MODEL_MAPPING_NAMES": "Qwen3GatedModel",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES": "Qwen3GatedForCausalLM",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": "Qwen3GatedForSequenceClassification",
}


@pytest.fixture(autouse=True, scope="module")
def harness_knows_the_roles():
    for table in ROLES:
        getattr(auto_names, table)[Qwen3GatedConfig.model_type] = ROLES[table]
    # transformers runs its multi-process tensor-parallel tests for a few model types only; add this one.
    tensor_parallel.TP_DISTRIBUTED_TEST_MODEL_TYPES.add(Qwen3GatedConfig.model_type)
    yield
    tensor_parallel.TP_DISTRIBUTED_TEST_MODEL_TYPES.discard(Qwen3GatedConfig.model_type)
    for table in ROLES:
        getattr(auto_names, table).pop(Qwen3GatedConfig.model_type, None)


class Qwen3GatedModelTester:
    """Tiny configs and inputs for the mixins (what transformers' CausalLMModelTester provides in its repo)."""

    config_class = Qwen3GatedConfig
    base_model_class = Qwen3GatedModel
    causal_lm_class = Qwen3GatedForCausalLM
    sequence_classification_class = Qwen3GatedForSequenceClassification

    def __init__(self, parent, gate: str, batch_size: int = 13, seq_length: int = 7):
        self.parent = parent
        self.gate = gate
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = True
        self.vocab_size = 99
        self.hidden_size = 32
        self.num_hidden_layers = 2
        self.num_attention_heads = 4
        self.num_key_value_heads = 2
        self.head_dim = 8
        self.type_sequence_label_size = 2
        self.num_labels = 3

    def get_config(self) -> Qwen3GatedConfig:
        return Qwen3GatedConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=37,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim, max_position_embeddings=512,
            pad_token_id=0, bos_token_id=1, eos_token_id=2,
            headwise_attn_output_gate=self.gate == "headwise", elementwise_attn_output_gate=self.gate == "elementwise",
        )

    def prepare_config_and_inputs_for_common(self):
        input_ids = common.ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        attention_mask = torch.tril(torch.ones_like(input_ids))
        return self.get_config(), {"input_ids": input_ids, "attention_mask": attention_mask}


class _Qwen3GatedCommonTests(
    common.ModelTesterMixin, tensor_parallel.TensorParallelTesterMixin, training.TrainingTesterMixin
):
    gate = "none"
    all_model_classes = (Qwen3GatedModel, Qwen3GatedForCausalLM, Qwen3GatedForSequenceClassification)

    def setUp(self):
        self.model_tester = Qwen3GatedModelTester(self, self.gate)
        self.config_tester = configuration_common.ConfigTester(
            self, config_class=Qwen3GatedConfig, hidden_size=32, num_attention_heads=4, num_key_value_heads=2
        )

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_generation_tester_mixin_inheritance(self):
        self.skipTest("GenerationTesterMixin is not in the transformers sdist; generation is tested in test_modeling_qwen3_gated.py")

    # Each multi-process tensor-parallel test takes 7-35 s on 2 CPU cores. The untied forward (test_tp_forward_0:
    # q_proj sharded colwise with its gate rows, outputs equal to the unsharded model's) runs always; the rest
    # with GATED_QWEN_ALL_COMMON_TESTS=1.
    def _only_when_all(self, name):
        if not RUN_ALL:
            self.skipTest(f"{name} runs with GATED_QWEN_ALL_COMMON_TESTS=1 (multi-process, up to 35 s)")
        getattr(super(), name)()

    def test_tp_forward_1(self):
        self._only_when_all("test_tp_forward_1")

    def test_tp_backward(self):
        self._only_when_all("test_tp_backward")

    def test_tp_generation(self):
        self._only_when_all("test_tp_generation")


class TestHeadwise(_Qwen3GatedCommonTests, unittest.TestCase):
    gate = "headwise"


class TestElementwise(_Qwen3GatedCommonTests, unittest.TestCase):
    gate = "elementwise"
