"""A Qwen3-MoE's two expert storages (``gated_qwen.transforms.experts``): split and fuse against what transformers
really saves."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_moe_config_dict
from safetensors.torch import load_file
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from gated_qwen.transforms.experts import fuse_experts, is_fused_experts, saved_shapes, split_fused_experts


@pytest.fixture(scope="module")
def saved_moe(tmp_path_factory):
    """A tiny stock Qwen3-MoE and the tensors its save_pretrained wrote."""
    torch.manual_seed(0)
    config = {k: v for k, v in tiny_moe_config_dict().items() if k not in ("architectures", "model_type")}
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**config))
    folder = tmp_path_factory.mktemp("saved_moe")
    model.save_pretrained(folder)
    return model, load_file(folder / "model.safetensors")


def test_split_gives_the_tensors_save_pretrained_writes(saved_moe):
    model, saved = saved_moe
    assert saved_shapes(model) == {name: tuple(tensor.shape) for name, tensor in saved.items()}
    for name, tensor in model.state_dict().items():
        if is_fused_experts(name):
            for piece, value in split_fused_experts(name, tensor):
                assert torch.equal(value, saved[piece]), piece


def test_fuse_rebuilds_the_model_tensors_from_what_save_pretrained_writes(saved_moe):
    model, saved = saved_moe
    fused = [(name, tensor) for name, tensor in model.state_dict().items() if is_fused_experts(name)]
    assert len(fused) == 2 * model.config.num_hidden_layers
    for name, tensor in fused:
        pieces = [(piece, saved[piece]) for piece, _ in split_fused_experts(name, tensor)]
        assert torch.equal(fuse_experts(name, pieces), tensor), name


def test_fuse_refuses_pieces_out_of_order_or_missing(saved_moe):
    model, _ = saved_moe
    name = "model.layers.0.mlp.experts.gate_up_proj"
    pieces = split_fused_experts(name, model.state_dict()[name])
    with pytest.raises(ValueError, match="the pieces of model.layers.0.mlp.experts.gate_up_proj are"):
        fuse_experts(name, [pieces[1], pieces[0], *pieces[2:]])
    with pytest.raises(ValueError, match="the pieces of"):
        fuse_experts(name, pieces[:-1])
    with pytest.raises(ValueError, match="the pieces of"):
        fuse_experts(name, [])
