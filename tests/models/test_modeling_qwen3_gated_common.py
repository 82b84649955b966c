"""transformers' own common model tests, from the sdist of the installed release, run against Qwen3Gated.

The harness (fetching the sdist, the tiny tester, the mixins, the roles in transformers' name tables) is
``gated_common_tests.py``, shared with the MoE family's ``test_modeling_qwen3_moe_gated_common.py``.
"""

from __future__ import annotations

import unittest

import pytest
from gated_common_tests import GatedCommonTests, GatedModelTester, OwnGateProjection, roles_known_to_the_harness

from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM, Qwen3GatedForSequenceClassification, Qwen3GatedModel


pytestmark = pytest.mark.slow

MODEL_CLASSES = (Qwen3GatedModel, Qwen3GatedForCausalLM, Qwen3GatedForSequenceClassification)
harness_knows_the_roles = roles_known_to_the_harness(MODEL_CLASSES)


class Qwen3GatedModelTester(GatedModelTester):
    config_class = Qwen3GatedConfig
    base_model_class, causal_lm_class, sequence_classification_class = MODEL_CLASSES


class _Qwen3GatedCommonTests(GatedCommonTests):
    model_tester_class = Qwen3GatedModelTester
    all_model_classes = MODEL_CLASSES
    generation_tests = "test_modeling_qwen3_gated.py"


class TestHeadwise(_Qwen3GatedCommonTests, unittest.TestCase):
    gate = "headwise"


class TestElementwise(_Qwen3GatedCommonTests, unittest.TestCase):
    gate = "elementwise"


class TestValueGateAdditiveSilu(OwnGateProjection, _Qwen3GatedCommonTests, unittest.TestCase):
    """A representative of the design space: elementwise, on the value projection, SiLU, added."""

    gate = "elementwise"
    variant = {"gate_position": "value", "gate_activation": "silu", "gate_combination": "additive"}
