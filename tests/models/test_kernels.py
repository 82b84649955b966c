"""Hub kernels (transformers' ``use_kernels``, the ``kernels`` package): what they touch in Qwen3Gated.

transformers' kernel mapping (5.25) has kernels for RMSNorm (CUDA/ROCm), RoPE (CUDA/XPU/ROCm) and activations,
none for CPU, and none that replaces an attention module. These tests check that the gated model offers
kernelize exactly what Qwen3 offers, minus any swap of its attention forward, and that loading with
``use_kernels=True`` on a CPU gives the logits of loading without.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3 import modeling_qwen3
from transformers.utils import is_kernels_available

from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM
from gated_qwen.models.qwen3_gated.modeling_qwen3_gated import Qwen3GatedAttention


# transformers uses `kernels` only in the versions it supports (5.25: 0.19.x; 5.19: 0.17.x): else use_kernels refuses
needs_kernels = pytest.mark.skipif(
    not is_kernels_available(), reason="no `kernels` release this transformers supports"
)
SIZES = {
    "vocab_size": 99,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
}


def kernel_points(model: torch.nn.Module) -> dict[str, set[str]]:
    """What kernelize would look at, by module class: its kernel layer name, or the kernel functions it routes."""
    points: dict[str, set[str]] = {}
    for module in model.modules():
        name = type(module).__name__.replace("Qwen3Gated", "Qwen3")
        layer = getattr(type(module), "kernel_layer_name", None)
        condition = getattr(type(module), "kernel_condition", None)
        if layer and (condition is None or condition(module)):
            points.setdefault(name, set()).add(f"layer {layer}")
        for function in getattr(module, "_kernel_funcs", {}):
            points.setdefault(name, set()).add(f"function {function}")
    return points


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_kernelize_sees_in_the_gated_model_what_it_sees_in_qwen3(gate):
    gated = Qwen3GatedForCausalLM(Qwen3GatedConfig(**SIZES, **{f"{gate}_attn_output_gate": True}))
    stock = Qwen3ForCausalLM(Qwen3Config(**SIZES))
    assert kernel_points(gated) == kernel_points(stock)
    if is_kernels_available():  # (without it transformers' kernel decorators leave the classes as they are)
        # the attention offers its RoPE function, as Qwen3's does, and no forward to replace
        assert kernel_points(gated)["Qwen3Attention"] == {"function rotary_pos_emb"}


@needs_kernels
def test_a_kernel_for_qwen3s_attention_would_not_replace_the_gated_attention(monkeypatch):
    """Should Qwen3Attention name a kernel layer one day, the gated attention (which inherits it) is skipped."""
    import kernels

    monkeypatch.setattr(modeling_qwen3.Qwen3Attention, "kernel_layer_name", "Qwen3Attention", raising=False)
    model = Qwen3GatedForCausalLM(Qwen3GatedConfig(**SIZES, headwise_attn_output_gate=True)).eval()
    forwards = [layer.self_attn.forward for layer in model.model.layers]
    # A kernel for it on CPU, from a repository that does not exist: trying to load it would fail.
    mapping = {
        "Qwen3Attention": {
            "cpu": kernels.LayerRepository(
                repo_id="kernels-community/no-such-kernel", layer_name="Qwen3Attention", version=1
            )
        }
    }
    with kernels.use_kernel_mapping(mapping, inherit_mapping=False):
        kernels.kernelize(model, device="cpu", mode=kernels.Mode.INFERENCE)
    assert [layer.self_attn.forward for layer in model.model.layers] == forwards
    assert not Qwen3GatedAttention.kernel_condition(model.model.layers[0].self_attn)


@needs_kernels
@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_use_kernels_on_cpu_gives_the_same_logits(tmp_path, gate):
    torch.manual_seed(0)
    Qwen3GatedForCausalLM(Qwen3GatedConfig(**SIZES, **{f"{gate}_attn_output_gate": True})).save_pretrained(tmp_path)
    with_kernels = Qwen3GatedForCausalLM.from_pretrained(tmp_path, use_kernels=True).eval()
    without = Qwen3GatedForCausalLM.from_pretrained(tmp_path, use_kernels=False).eval()
    assert with_kernels.use_kernels and not without.use_kernels
    ids = torch.randint(3, 99, (2, 9))
    with torch.no_grad():
        assert torch.equal(with_kernels(ids).logits, without(ids).logits)
