"""transformers' own common model tests, from the sdist of the installed release, run against Qwen3MoeGated.

The harness is ``gated_common_tests.py``, shared with the dense ``test_modeling_qwen3_gated_common.py``.
transformers' ``tests/models/qwen3_moe/test_modeling_qwen3_moe.py`` is not in the sdist (it carries ``tests/*.py``
only), so the tester below restates what that file configures: a tiny Qwen3-MoE (4 experts, 2 per token, every
layer sparse) and the same mixins (``ModelTesterMixin``, tensor parallel, training).
"""

from __future__ import annotations

import unittest

import pytest
from gated_common_tests import GatedCommonTests, GatedModelTester, OwnGateProjection, roles_known_to_the_harness

from gated_qwen import (
    Qwen3MoeGatedConfig,
    Qwen3MoeGatedForCausalLM,
    Qwen3MoeGatedForSequenceClassification,
    Qwen3MoeGatedModel,
)


pytestmark = pytest.mark.slow

MODEL_CLASSES = (Qwen3MoeGatedModel, Qwen3MoeGatedForCausalLM, Qwen3MoeGatedForSequenceClassification)
harness_knows_the_roles = roles_known_to_the_harness(MODEL_CLASSES)


class Qwen3MoeGatedModelTester(GatedModelTester):
    config_class = Qwen3MoeGatedConfig
    base_model_class, causal_lm_class, sequence_classification_class = MODEL_CLASSES
    family_config = {
        "moe_intermediate_size": 16,  # grouped_mm needs 16-byte strides: 16 fp16 values
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }


class _Qwen3MoeGatedCommonTests(GatedCommonTests):
    model_tester_class = Qwen3MoeGatedModelTester
    all_model_classes = MODEL_CLASSES
    generation_tests = "test_modeling_qwen3_moe_gated.py"


class TestHeadwise(_Qwen3MoeGatedCommonTests, unittest.TestCase):
    gate = "headwise"


class TestElementwise(_Qwen3MoeGatedCommonTests, unittest.TestCase):
    gate = "elementwise"


class TestKeyGateHeadwiseShared(OwnGateProjection, _Qwen3MoeGatedCommonTests, unittest.TestCase):
    """A representative of the design space on the MoE: headwise, on the keys, shared across heads (g_proj)."""

    gate = "headwise"
    variant = {"gate_position": "key", "gate_shared_across_heads": True}
