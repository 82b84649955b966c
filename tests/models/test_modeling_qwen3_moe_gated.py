"""Qwen3MoeGated: transformers' Qwen3-MoE with the dense model's gated attention (issue 23)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import routed_experts
from safetensors import safe_open
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeMLP, Qwen3MoeSparseMoeBlock

from gated_qwen import Qwen3MoeGatedConfig, Qwen3MoeGatedForCausalLM, Qwen3MoeGatedModel
from gated_qwen.errors import CheckpointError
from gated_qwen.models.qwen3_gated.modeling_qwen3_gated import Qwen3GatedAttention
from gated_qwen.models.qwen3_moe_gated.modeling_qwen3_moe_gated import Qwen3MoeGatedForSequenceClassification


IDS = torch.tensor([[5, 17, 42, 99, 3, 250, 7, 64, 128, 9, 11, 300]])


def tiny_gated(gate="headwise", **kwargs) -> Qwen3MoeGatedForCausalLM:
    torch.manual_seed(0)
    config = Qwen3MoeGatedConfig(
        vocab_size=320,
        hidden_size=32,
        intermediate_size=96,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        headwise_attn_output_gate=gate == "headwise",
        elementwise_attn_output_gate=gate == "elementwise",
        **kwargs,
    )
    model = Qwen3MoeGatedForCausalLM(config)
    with torch.no_grad():  # routers that route and gates that are not all sigmoid(0)
        for name, parameter in model.named_parameters():
            if name.endswith(("mlp.gate.weight", "q_proj.weight")):
                parameter.normal_(0, 0.5)
    return model.eval()


def test_a_stock_moe_checkpoint_loads_as_the_gated_model_without_a_gate_and_computes_the_same(stock_moe):
    stock = Qwen3MoeForCausalLM.from_pretrained(stock_moe, dtype=torch.float32).eval()
    gated = Qwen3MoeGatedForCausalLM.from_pretrained(stock_moe, dtype=torch.float32).eval()
    assert gated.config.gate_type == "none" and gated.config.model_type == "qwen3_moe_gated"
    assert all(isinstance(layer.self_attn, Qwen3GatedAttention) for layer in gated.model.layers)
    assert len(set().union(*routed_experts(stock, IDS).values())) > 1
    with torch.no_grad():
        stock_out = stock(IDS, output_router_logits=True, labels=IDS)
        gated_out = gated(IDS, output_router_logits=True, labels=IDS)
    assert torch.equal(stock_out.logits, gated_out.logits)
    # the router, its logits and the auxiliary loss are Qwen3-MoE's own
    assert all(torch.equal(a, b) for a, b in zip(stock_out.router_logits, gated_out.router_logits))
    assert torch.equal(stock_out.aux_loss, gated_out.aux_loss) and torch.equal(stock_out.loss, gated_out.loss)


def test_a_dense_layer_among_sparse_ones_keeps_its_dense_mlp(stock_moe_dense_layer):
    gated = Qwen3MoeGatedForCausalLM.from_pretrained(stock_moe_dense_layer)
    kinds = [type(layer.mlp) for layer in gated.model.layers]
    assert kinds == [Qwen3MoeSparseMoeBlock, Qwen3MoeMLP, Qwen3MoeSparseMoeBlock]
    assert gated.model.layers[1].mlp.gate_proj.weight.shape == (96, 32)  # intermediate_size, not the experts'
    stock = Qwen3MoeForCausalLM.from_pretrained(stock_moe_dense_layer)
    with torch.no_grad():
        assert torch.equal(stock(IDS).logits, gated(IDS).logits)


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_the_gate_scales_each_heads_attention_output(gate):
    model = tiny_gated(gate)
    attention = model.model.layers[0].self_attn
    assert attention.q_proj.weight.shape[0] == 4 * (8 + (1 if gate == "headwise" else 8))
    seen = []
    with torch.no_grad():
        reference = model(IDS).logits
        attention.gate_override = lambda g: seen.append(g) or torch.ones_like(g)
        try:
            ungated = model(IDS).logits
        finally:
            attention.gate_override = None
    assert seen and seen[0].shape == (1, IDS.shape[1], 4, 1 if gate == "headwise" else 8)
    assert 0 < seen[0].min() and seen[0].max() < 1
    assert not torch.allclose(reference, ungated)  # the gate takes part in the computation


def test_save_writes_the_stock_expert_layout_and_auto_classes_load_it_back(tmp_path):
    model = tiny_gated("headwise")
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe_gated" and config["headwise_attn_output_gate"] is True
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        names = set(f.keys())
    # one tensor per expert and projection, the names stock Qwen3-MoE's save_pretrained writes
    assert "model.layers.0.mlp.experts.3.down_proj.weight" in names and "model.layers.1.mlp.gate.weight" in names
    assert not any(name.endswith("experts.gate_up_proj") for name in names)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is Qwen3MoeGatedForCausalLM
    with torch.no_grad():
        assert torch.equal(loaded(IDS).logits, model(IDS).logits)
    assert isinstance(AutoConfig.for_model("qwen3_moe_gated"), Qwen3MoeGatedConfig)
    assert (
        type(AutoModelForSequenceClassification.from_config(loaded.config)) is Qwen3MoeGatedForSequenceClassification
    )


def test_generation_with_the_cache_matches_the_full_forward():
    model = tiny_gated("elementwise")
    generated = model.generate(IDS, max_new_tokens=6, do_sample=False)
    tokens = IDS
    with torch.no_grad():
        for _ in range(6):
            next_token = model(tokens, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, next_token], dim=1)
    assert torch.equal(generated, tokens)


def test_attention_backends_agree():
    model = tiny_gated("headwise")
    with torch.no_grad():
        outputs = {}
        for implementation in ("eager", "sdpa"):
            model.set_attn_implementation(implementation)
            outputs[implementation] = model(IDS).logits
    torch.testing.assert_close(outputs["eager"], outputs["sdpa"], atol=1e-5, rtol=1e-5)


def test_config_rules_are_the_dense_models_and_the_moe_sizes_are_checked():
    with pytest.raises(ValueError, match="at most one gate type"):
        Qwen3MoeGatedConfig(headwise_attn_output_gate=True, elementwise_attn_output_gate=True)
    with pytest.raises(ValueError, match="num_experts_per_tok \\(9\\) is more than num_experts \\(8\\)"):
        Qwen3MoeGatedConfig(num_experts=8, num_experts_per_tok=9)
    with pytest.raises(CheckpointError, match="num_experts 0"):
        Qwen3MoeGatedConfig.from_dict({"model_type": "qwen3_moe", "num_experts": 0})
    with pytest.raises(CheckpointError, match="'llama' model, not Qwen3-MoE"):
        Qwen3MoeGatedConfig.from_dict({"model_type": "llama"})
    config = Qwen3MoeGatedConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    assert config.head_dim == 16  # as transformers' Qwen3-MoE attention computes it without the key
    # the tensor-parallel plan is Qwen3-MoE's: q_proj colwise keeps each kv group's gate rows with its queries
    assert Qwen3MoeGatedConfig.base_model_tp_plan == Qwen3MoeConfig.base_model_tp_plan
    assert Qwen3MoeGatedConfig.base_model_tp_plan["layers.*.self_attn.q_proj"] == "colwise"


def test_the_sliding_window_applies_to_every_layer_as_in_qwen3_moe():
    model = tiny_gated("headwise", use_sliding_window=True, sliding_window=4)
    assert [layer.self_attn.sliding_window for layer in model.model.layers] == [4, 4]
    assert tiny_gated("headwise").model.layers[0].self_attn.sliding_window is None


def test_strict_loading_refuses_experts_the_config_does_not_describe(stock_moe, tmp_path):
    folder = tmp_path / "edited"
    shutil.copytree(stock_moe, folder)
    config = json.loads((folder / "config.json").read_text())
    experts_key = "num_local_experts" if "num_local_experts" in config else "num_experts"  # transformers 5.25 / 5.19
    (folder / "config.json").write_text(json.dumps({**config, experts_key: 6}))
    with pytest.raises(CheckpointError, match="num_experts 6"):
        Qwen3MoeGatedForCausalLM.from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({**config, "mlp_only_layers": [0]}))
    with pytest.raises(CheckpointError, match="model.layers.0.mlp"):
        Qwen3MoeGatedForCausalLM.from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({**config, "headwise_attn_output_gate": True}))
    with pytest.raises(CheckpointError, match="'none' gate"):
        Qwen3MoeGatedForCausalLM.from_pretrained(folder)


def test_peft_lora_takes_the_stock_qwen3_defaults():
    peft = pytest.importorskip("peft")
    model = tiny_gated("headwise")
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2))
    targets = {name.rsplit(".", 2)[-2] for name, _ in lora.named_modules() if name.endswith("lora_A")}
    assert targets == {"q_proj", "v_proj"}


def test_the_bare_model_returns_hidden_states():
    model = Qwen3MoeGatedModel(tiny_gated("headwise").config)
    assert model(IDS).last_hidden_state.shape == (1, IDS.shape[1], 32)


def test_a_converted_moe_trains_with_the_routers_auxiliary_loss(stock_moe):
    """The model side of `train --init-from` a Qwen3-MoE with --gate: a loaded stock MoE converted in memory
    trains, the gradient reaching the gate rows, the router and the experts; the loss includes the aux loss."""
    from gated_qwen import convert_qwen3_to_gated

    model = convert_qwen3_to_gated(Qwen3MoeForCausalLM.from_pretrained(stock_moe), gate="headwise", init="random")
    model.config.output_router_logits = True
    model.train()
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        out = model(IDS, labels=IDS)
        assert out.aux_loss is not None
        without_aux = torch.nn.functional.cross_entropy(out.logits[0, :-1], IDS[0, 1:])
        torch.testing.assert_close(out.loss, without_aux + model.config.router_aux_loss_coef * out.aux_loss)
        optimizer.zero_grad()
        out.loss.backward()
        layer = model.model.layers[0]
        gate_rows = layer.self_attn.q_proj.weight.grad.view(2, -1, 32)[:, -2:]  # each kv group's 2 gate rows
        assert gate_rows.abs().sum() > 0 and layer.mlp.gate.weight.grad.abs().sum() > 0
        assert layer.mlp.experts.gate_up_proj.grad.abs().sum() > 0
        optimizer.step()
        losses.append(out.loss.item())
    assert losses[-1] < losses[0]


TENSOR_PARALLEL_CHILD = r"""
import sys, torch, torch.distributed as dist
from gated_qwen import Qwen3MoeGatedForCausalLM

torch.set_num_threads(1)
dist.init_process_group("gloo")
model = Qwen3MoeGatedForCausalLM.from_pretrained(sys.argv[1], tp_plan="auto")
ids = torch.randint(320, (2, 12), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    logits = model(ids).logits
q_proj = model.model.layers[0].self_attn.q_proj.weight
local_rows = (q_proj.to_local() if hasattr(q_proj, "to_local") else q_proj).shape[0]
if dist.get_rank() == 0:
    torch.save({"logits": logits, "local_q_rows": local_rows}, sys.argv[2])
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_transformers_tensor_parallel_keeps_each_kv_group_with_its_gate_rows(stock_moe_dense_layer, tmp_path):
    """transformers' own tensor parallelism (tp_plan="auto", 2 processes over gloo on CPU) shards q_proj by kv
    group, gate rows with their queries, and computes what one process computes."""
    import subprocess
    import sys

    from gated_qwen import convert_checkpoint

    torch.manual_seed(0)
    convert_checkpoint(stock_moe_dense_layer, tmp_path / "gated", gate="headwise", init="random", progress=False)
    (tmp_path / "child.py").write_text(TENSOR_PARALLEL_CHILD)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            str(tmp_path / "child.py"),
            str(tmp_path / "gated"),
            str(tmp_path / "out.pt"),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    result = torch.load(tmp_path / "out.pt", weights_only=True)
    assert result["local_q_rows"] == 4 * (8 + 1) // 2  # one kv group: 2 heads' queries and their 2 gate rows
    single = Qwen3MoeGatedForCausalLM.from_pretrained(tmp_path / "gated")
    ids = torch.randint(320, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(result["logits"], single(ids).logits, atol=1e-5, rtol=1e-5)


def _moe_tensor_parallel_report(rank: int, folder: str, tp_plan, result_folder: str) -> None:
    """On one rank: the MoE loaded with DistributedConfig(tp_size=2) against the unsharded one."""
    import os

    import torch.distributed as dist
    from transformers.distributed.configuration_utils import DistributedConfig

    try:
        model_tp = Qwen3MoeGatedForCausalLM.from_pretrained(
            folder, distributed_config=DistributedConfig(tp_size=dist.get_world_size(), tp_plan=tp_plan)
        ).eval()
    except ValueError as error:
        torch.save({"refused": str(error)}, os.path.join(result_folder, f"rank{rank}.pt"))
        return
    model = Qwen3MoeGatedForCausalLM.from_pretrained(folder).eval()
    q_proj = model_tp.model.layers[0].self_attn.q_proj.weight
    ids = torch.randint(3, 320, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out, out_tp = model(ids, labels=ids), model_tp(ids, labels=ids)
        greedy = {"max_new_tokens": 6, "do_sample": False}
        same_tokens = torch.equal(model.generate(ids[:1], **greedy), model_tp.generate(ids[:1], **greedy))
    torch.save(
        {
            "local_q_proj_rows": (q_proj.to_local() if hasattr(q_proj, "to_local") else q_proj).shape[0],
            "max_logit_diff": (out.logits - out_tp.logits).abs().max().item(),
            "loss_diff": (out.loss - out_tp.loss).abs().item(),
            "same_tokens": same_tokens,
        },
        os.path.join(result_folder, f"rank{rank}.pt"),
    )
    dist.barrier()


@pytest.mark.parametrize("plan, heads, kv_heads, gate", [("colwise", 4, 2, "elementwise"), ("unit", 2, 1, "headwise")])
@pytest.mark.slow
def test_distributed_config_shards_the_moe_by_kv_group_with_the_dense_models_plan_check(
    tmp_path, plan, heads, kv_heads, gate
):
    """from_pretrained(distributed_config=...) on 2 gloo ranks, as for the dense model (tests/models/test_tensor_parallel.py):
    Qwen3-MoE's colwise plan shards q_proj by kv group; under transformers 5.25's unit styles, one kv group over 2 ranks
    is replicated (transformers alone would count the 18 rows of a headwise q_proj as 2 heads and cut them apart)."""
    from conftest import write_stock_moe_checkpoint
    from test_tensor_parallel import HAS_UNIT_STYLES, UNIT_PLAN, run_on_two_ranks

    from gated_qwen import convert_checkpoint

    if plan == "unit" and not HAS_UNIT_STYLES:
        pytest.skip("unit styles are transformers >= 5.25")
    stock = write_stock_moe_checkpoint(
        tmp_path / "stock", tokenizer=False, num_attention_heads=heads, num_key_value_heads=kv_heads
    )
    torch.manual_seed(0)
    convert_checkpoint(stock, tmp_path / "gated", gate=gate, init="random", progress=False)
    (tmp_path / "results").mkdir()
    run_on_two_ranks(
        _moe_tensor_parallel_report,
        str(tmp_path / "gated"),
        UNIT_PLAN if plan == "unit" else None,
        str(tmp_path / "results"),
    )
    full_rows = heads * (8 + (1 if gate == "headwise" else 8))
    for rank in range(2):
        report = torch.load(tmp_path / "results" / f"rank{rank}.pt", weights_only=True)
        assert report["local_q_proj_rows"] == (full_rows // 2 if plan == "colwise" else full_rows), report
        assert report["max_logit_diff"] < 1e-5 and report["loss_diff"] < 1e-5 and report["same_tokens"], report


@pytest.mark.parametrize(
    "first",
    [
        "gated_qwen.models.qwen3_moe_gated.modeling_qwen3_moe_gated",
        "gated_qwen.models.qwen3_gated.modeling_qwen3_gated",
        "transformers",
    ],
)
@pytest.mark.slow
def test_both_families_register_whichever_module_is_imported_first(first):
    import subprocess
    import sys

    probe = (
        f"import {first}\n"
        "import gated_qwen\n"
        "from transformers import AutoConfig\n"
        "print(type(AutoConfig.for_model('qwen3_moe_gated')).__name__, type(AutoConfig.for_model('qwen3_gated')).__name__)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert result.stdout.split() == ["Qwen3MoeGatedConfig", "Qwen3GatedConfig"], result.stderr[-2000:]
