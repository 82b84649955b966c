"""transformers' own common model tests, from the sdist of the installed release, run against Qwen3MoeGated.

The MoE family's counterpart of ``test_modeling_qwen3_gated_common.py`` (whose docstring explains the harness:
``transformers_sdist_harness.py`` fetches the common mixins from the sdist of the installed transformers, cached
under ``~/.cache/gated-qwen/``; without network and cache the module skips, and fails with ``CI=true``).
transformers' ``tests/models/qwen3_moe/test_modeling_qwen3_moe.py`` is not in the sdist (it carries ``tests/*.py``
only), so the tester below restates what that file configures: a tiny Qwen3-MoE (4 experts, 2 per token, every
layer sparse) and the same mixins (``ModelTesterMixin``, tensor parallel, training).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import unittest
import warnings

import pytest
import torch
import transformers
from transformers_sdist_harness import PACKAGE, HarnessFileMissing, fetch_harness

from gated_qwen import (
    Qwen3MoeGatedConfig,
    Qwen3MoeGatedForCausalLM,
    Qwen3MoeGatedForSequenceClassification,
    Qwen3MoeGatedModel,
)


pytestmark = pytest.mark.slow


TRANSFORMERS_VERSION = transformers.__version__
RUN_ALL = os.environ.get("GATED_QWEN_ALL_COMMON_TESTS") == "1"
IN_CI = os.environ.get("CI", "").lower() == "true"

try:
    sys.path.insert(0, str(fetch_harness(TRANSFORMERS_VERSION)))
except HarnessFileMissing as error:
    pytest.fail(str(error), pytrace=False)
except (RuntimeError, OSError, subprocess.SubprocessError) as error:
    if IN_CI:  # CI must not pass with transformers' common tests off
        pytest.fail(f"transformers' common tests could not be fetched and CI=true: {error}", pytrace=False)
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
    "MODEL_MAPPING_NAMES": "Qwen3MoeGatedModel",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES": "Qwen3MoeGatedForCausalLM",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": "Qwen3MoeGatedForSequenceClassification",
}


@pytest.fixture(autouse=True, scope="module")
def harness_knows_the_roles():
    for table in ROLES:
        getattr(auto_names, table)[Qwen3MoeGatedConfig.model_type] = ROLES[table]
    # transformers runs its multi-process tensor-parallel tests for a few model types only; add this one.
    tensor_parallel.TP_DISTRIBUTED_TEST_MODEL_TYPES.add(Qwen3MoeGatedConfig.model_type)
    yield
    tensor_parallel.TP_DISTRIBUTED_TEST_MODEL_TYPES.discard(Qwen3MoeGatedConfig.model_type)
    for table in ROLES:
        getattr(auto_names, table).pop(Qwen3MoeGatedConfig.model_type, None)


class Qwen3MoeGatedModelTester:
    """Tiny configs and inputs for the mixins (what transformers' CausalLMModelTester provides in its repo)."""

    config_class = Qwen3MoeGatedConfig
    base_model_class = Qwen3MoeGatedModel
    causal_lm_class = Qwen3MoeGatedForCausalLM
    sequence_classification_class = Qwen3MoeGatedForSequenceClassification

    def __init__(self, parent, gate: str, batch_size: int = 13, seq_length: int = 7, variant: dict | None = None):
        self.parent = parent
        self.gate = gate
        self.variant = variant or {}  # the design-space keys beside the gate type (docs/design-space.md)
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

    def get_config(self) -> Qwen3MoeGatedConfig:
        return Qwen3MoeGatedConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=37,
            moe_intermediate_size=16,  # grouped_mm needs 16-byte strides: 16 fp16 values
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            max_position_embeddings=512,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            gate_type=self.gate,
            **self.variant,
        )

    def prepare_config_and_inputs_for_common(self):
        input_ids = common.ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        attention_mask = torch.tril(torch.ones_like(input_ids))
        return self.get_config(), {"input_ids": input_ids, "attention_mask": attention_mask}


class _Qwen3MoeGatedCommonTests(
    common.ModelTesterMixin, tensor_parallel.TensorParallelTesterMixin, training.TrainingTesterMixin
):
    gate = "none"
    variant: dict = {}
    all_model_classes = (Qwen3MoeGatedModel, Qwen3MoeGatedForCausalLM, Qwen3MoeGatedForSequenceClassification)

    def setUp(self):
        self.model_tester = Qwen3MoeGatedModelTester(self, self.gate, variant=self.variant)
        self.config_tester = configuration_common.ConfigTester(
            self, config_class=Qwen3MoeGatedConfig, hidden_size=32, num_attention_heads=4, num_key_value_heads=2
        )

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_generation_tester_mixin_inheritance(self):
        self.skipTest(
            "GenerationTesterMixin is not in the transformers sdist; generation is tested in test_modeling_qwen3_moe_gated.py"
        )

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


class TestHeadwise(_Qwen3MoeGatedCommonTests, unittest.TestCase):
    gate = "headwise"


class TestElementwise(_Qwen3MoeGatedCommonTests, unittest.TestCase):
    gate = "elementwise"


class _OwnGateProjection:
    """A gate outside q_proj has no tensor-parallel plan: from_pretrained refuses it (tests/models/test_tensor_parallel.py)."""

    def setUp(self):
        # Expert parallelism (transformers 5.19's test_ep_*) shards the attention by the same plan.
        if self._testMethodName.startswith(("test_tp_", "test_ep_")):
            self.skipTest("tensor parallelism is refused for a gate with its own projection (g_proj), by design")
        super().setUp()


class TestKeyGateHeadwiseShared(_OwnGateProjection, _Qwen3MoeGatedCommonTests, unittest.TestCase):
    """A representative of the design space on the MoE: headwise, on the keys, shared across heads (g_proj)."""

    gate = "headwise"
    variant = {"gate_position": "key", "gate_shared_across_heads": True}
