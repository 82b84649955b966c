"""Exporting a gated Qwen3-MoE to transformers' stock Qwen3.5-MoE (issue 23)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import LOAD_WITHOUT_GATED_QWEN, tensors_of, write_stock_moe_checkpoint
from transformers.models.qwen3 import modeling_qwen3
from transformers.models.qwen3_moe import modeling_qwen3_moe

from gated_qwen import Qwen3MoeGatedForCausalLM, convert_checkpoint
from gated_qwen.cli import main
from gated_qwen.errors import CheckpointError
from gated_qwen.transforms.export import export_checkpoint, parameter_counts, zero_shared_expert_size


NEW_TOKENS = 8


@pytest.fixture(scope="module")
def exports(tmp_path_factory, stock_moe):
    """Gated MoEs (random gate rows, so the gates are not all 1/2) and their exports, in float32 and bfloat16,
    loaded once in a subprocess that never imports gated_qwen."""
    root = tmp_path_factory.mktemp("moe_exports")
    ids = torch.randint(320, (2, 12), generator=torch.Generator().manual_seed(1))
    cases, jobs = {}, []
    for gate in ("headwise", "elementwise"):
        for dtype in ("float32", "bfloat16"):
            name = f"{gate}-{dtype}"
            source, target = root / f"{name}-gated", root / f"{name}-qwen3_5"
            torch.manual_seed(0)
            convert_checkpoint(stock_moe, source, gate=gate, init="random", dtype=dtype, progress=False)
            result = export_checkpoint(source, target, verify=dtype == "float32", progress=False)
            cases[name] = {"source": source, "target": target, "result": result}
            jobs.append({"name": name, "path": str(target), "ids": ids.tolist(), "new_tokens": NEW_TOKENS})
    output = root / "results.pt"
    subprocess.run(
        [sys.executable, "-c", LOAD_WITHOUT_GATED_QWEN, json.dumps(jobs), str(output)],
        check=True,
        timeout=600,
        # an installed gated-qwen would register itself in that process through its startup hook (docs/clients.md)
        env={**os.environ, "GATED_QWEN_NO_STARTUP_HOOK": "1"},
    )
    loaded = torch.load(output, weights_only=True)
    for name, case in cases.items():
        case["loaded"], case["ids"] = loaded[name], ids
    return cases


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_float32_export_computes_the_gated_moe(exports, gate):
    case = exports[f"{gate}-float32"]
    loaded = case["loaded"]
    assert loaded["class"] == "Qwen3_5MoeForCausalLM"
    source = Qwen3MoeGatedForCausalLM.from_pretrained(case["source"]).eval()
    with torch.no_grad():
        logits = source(case["ids"]).logits
        tokens = source.generate(
            case["ids"],
            attention_mask=torch.ones_like(case["ids"]),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
    difference = (logits - loaded["logits"]).abs().max().item()
    assert difference <= 1e-5, difference
    assert case["result"].max_difference <= 1e-5
    assert torch.equal(tokens, loaded["tokens"])


def qwen3_5_rms_norm_forward(self, hidden_states):
    """Qwen3(-MoE)'s RMSNorm computed as Qwen3.5's: the weight multiplies in float32, then one rounding."""
    normed = hidden_states.float() * torch.rsqrt(
        hidden_states.float().pow(2).mean(-1, keepdim=True) + self.variance_epsilon
    )
    return (normed * self.weight.float()).to(hidden_states.dtype)


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_bfloat16_export_computes_the_gated_moe_with_qwen3_5s_norm_rounding(exports, gate, monkeypatch):
    """In bfloat16 the two norms round differently (Qwen3 rounds the normed input before the weight multiplies,
    Qwen3.5 after); with Qwen3.5's rounding the gated MoE computes what the export does."""
    case = exports[f"{gate}-bfloat16"]
    assert case["loaded"]["dtype"] == "torch.bfloat16"
    source = Qwen3MoeGatedForCausalLM.from_pretrained(case["source"]).eval()
    monkeypatch.setattr(modeling_qwen3.Qwen3RMSNorm, "forward", qwen3_5_rms_norm_forward)
    monkeypatch.setattr(modeling_qwen3_moe.Qwen3MoeRMSNorm, "forward", qwen3_5_rms_norm_forward)
    with torch.no_grad():
        logits = source(case["ids"]).logits
        tokens = source.generate(
            case["ids"],
            attention_mask=torch.ones_like(case["ids"]),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
    assert torch.equal(logits, case["loaded"]["logits"])
    assert torch.equal(tokens, case["loaded"]["tokens"])


def test_router_and_experts_are_copied_and_the_shared_expert_is_zero(exports):
    case = exports["headwise-float32"]
    source, exported = tensors_of(case["source"]), tensors_of(case["target"])
    moe = [name for name in source if ".mlp.gate." in name or ".mlp.experts." in name]
    assert len(moe) == 2 * (1 + 4 * 3)
    assert all(torch.equal(source[name], exported[name]) for name in moe)
    shared = [name for name in exported if "shared_expert" in name]
    assert len(shared) == 2 * 4 and all(not exported[name].any() for name in shared)
    assert exported["model.layers.0.mlp.shared_expert.down_proj.weight"].shape == (32, zero_shared_expert_size(16))
    config = json.loads((case["target"] / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_moe_text" and config["architectures"] == ["Qwen3_5MoeForCausalLM"]
    assert config["layer_types"] == ["full_attention"] * 2
    assert (config["num_experts"], config["num_experts_per_tok"], config["moe_intermediate_size"]) == (4, 2, 16)


def test_cli_export_and_parameter_counts(exports, tmp_path, capsys):
    source = exports["elementwise-float32"]["source"]
    assert main(["export", str(source), str(tmp_path / "out"), "--to", "qwen3_5", "--quiet"]) == 0
    # the growth is the zero shared experts: an elementwise gate is stored as it is (issue 37)
    out = capsys.readouterr().out
    assert "Qwen3.5-MoE's shared experts, zero here" in out and "(the headwise gate is stored" not in out
    gated, exported = parameter_counts(json.loads((source / "config.json").read_text()))
    assert (
        exported == gated + 2 * 3 * 32 * zero_shared_expert_size(16) + 2 * 32
    )  # the zero shared experts, their gates


@pytest.mark.parametrize(
    "edit, reason",
    [
        ({"mlp_only_layers": [1]}, "dense layers among the sparse ones \\(layer 1"),
        ({"norm_topk_prob": False}, "norm_topk_prob false"),
    ],
)
def test_layouts_qwen3_5_moe_cannot_express_are_refused(tmp_path, edit, reason):
    stock = write_stock_moe_checkpoint(tmp_path / "stock", tokenizer=False, **edit)
    convert_checkpoint(stock, tmp_path / "gated", gate="headwise", progress=False)
    with pytest.raises(CheckpointError, match=reason):
        export_checkpoint(tmp_path / "gated", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    assert main(["export", str(tmp_path / "gated"), str(tmp_path / "out"), "--to", "qwen3_5", "--quiet"]) != 0


def test_a_stock_moe_without_a_gate_is_refused(stock_moe, tmp_path):
    with pytest.raises(CheckpointError, match="has no gate"):
        export_checkpoint(stock_moe, tmp_path / "out", progress=False)
