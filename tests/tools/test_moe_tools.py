"""The tools on mixture-of-experts models (issue 23): inspect, generate, analyze (with the router's load)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3MoeForCausalLM

from gated_qwen import Qwen3MoeGatedConfig, convert_checkpoint
from gated_qwen.cli import main
from gated_qwen.cli.inspect import describe
from gated_qwen.tools.analysis.routing import router_load
from gated_qwen.tools.analysis.sinks import massive_activations
from gated_qwen.tools.generation import load_model


REPO_CONFIGS = __import__("pathlib").Path(__file__).resolve().parents[2] / "gated_qwen" / "configs"


def expert_slices(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The fused expert tensors of the built model (one slice per expert along dim 0), by name."""
    return {name: p for name, p in model.named_parameters() if ".mlp.experts." in name}


def parameters_one_token_uses(model: torch.nn.Module, token: int = 5) -> int:
    """What one token's forward pass reads, measured: every parameter outside the experts, and of each fused
    expert tensor the slices of the experts the router picked (those that receive a gradient)."""
    model.zero_grad()
    model(torch.tensor([[token]])).logits.sum().backward()
    used = 0
    for name, p in model.named_parameters():
        if name in expert_slices(model):
            picked = [bool(p.grad[e].abs().sum() > 0) for e in range(p.shape[0])]
            used += sum(picked) * p[0].numel()
        else:
            used += p.numel()
    model.zero_grad()
    return used


def q_proj_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if name.endswith("q_proj.weight"))


@pytest.fixture(scope="module")
def gated_moe(stock_moe_dense_layer, tmp_path_factory):
    """The stock MoE with a dense layer, converted headwise with random gate rows."""
    folder = tmp_path_factory.mktemp("moe_tools") / "gated"
    torch.manual_seed(0)
    convert_checkpoint(stock_moe_dense_layer, folder, gate="headwise", init="random", progress=False)
    return folder


def test_inspect_counts_total_and_active_parameters(stock_moe_dense_layer, gated_moe, capsys):
    facts = describe(str(stock_moe_dense_layer))
    stock = Qwen3MoeForCausalLM.from_pretrained(stock_moe_dense_layer)
    assert facts["parameters"] == stock.num_parameters() and facts["kind"] == "stock Qwen3-MoE"
    # active: what a token's forward pass really reads, measured on the built model by the router's choice
    assert facts["active_parameters"] == parameters_one_token_uses(stock) < facts["parameters"]
    config = stock.config
    sparse = sum(1 for layer in stock.model.layers if hasattr(layer.mlp, "experts"))
    assert (facts["num_experts"], facts["num_experts_per_tok"], facts["sparse_layers"]) == (
        config.num_experts,
        config.num_experts_per_tok,
        sparse,
    )
    gated = describe(str(gated_moe))
    gated_model = load_model(str(gated_moe), device="cpu")
    assert gated["gate_type"] == "headwise" and gated["parameters"] == gated_model.num_parameters()
    # the gate's rows are the only parameters the conversion adds, all in q_proj
    assert gated["parameters"] - facts["parameters"] == q_proj_parameters(gated_model) - q_proj_parameters(stock) > 0
    assert gated["active_parameters"] == parameters_one_token_uses(gated_model.float())
    assert main(["inspect", str(gated_moe)]) == 0
    out = capsys.readouterr().out
    assert "4 of width 16, 2 per token, in 2 of 3 layers" in out and f"{gated['active_parameters']:,}" in out


def test_the_papers_moe_config_has_its_stated_size():
    config = Qwen3MoeGatedConfig.from_json_file(REPO_CONFIGS / "moe_15B_A2B_headwise.json")
    assert (config.num_experts, config.num_experts_per_tok, config.gate_type) == (128, 8, "headwise")
    assert (config.num_attention_heads, config.num_key_value_heads) == (32, 4)
    from gated_qwen import Qwen3MoeGatedForCausalLM

    with torch.device("meta"):
        total = Qwen3MoeGatedForCausalLM(config).num_parameters()
        experts = expert_slices(Qwen3MoeGatedForCausalLM(config))
    assert 15.0e9 <= total < 16.0e9  # "15B total parameters"
    # the idle experts' parameters, from the built (meta) model's expert tensors: all but top-k slices of each
    idle = sum((p.shape[0] - config.num_experts_per_tok) * p[0].numel() for p in experts.values())
    assert config.idle_expert_parameters() == idle
    assert 1.9e9 < total - idle < 2.1e9  # "A2B" (README says why not 2.54B)


def test_generate_runs_a_moe_checkpoint(gated_moe, capsys):
    assert (
        main(
            [
                "generate",
                "--model",
                str(gated_moe),
                "Hello world",
                "--max-new-tokens",
                "4",
                "--device",
                "cpu",
                "--json",
                "--no-stream",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out.splitlines()[0])
    assert result["new_tokens"] == 4
    model = load_model(str(gated_moe), device="cpu")
    assert type(model).__name__ == "Qwen3MoeGatedForCausalLM" and not model.training


def test_router_load_beside_the_gates(gated_moe, stock_moe_dense_layer, tmp_path):
    model = load_model(str(gated_moe), device="cpu")
    ids = torch.randint(320, (1, 40), generator=torch.Generator().manual_seed(0))
    # the experts each sparse layer really dispatched the tokens to, seen at the experts' own input
    dispatched = {}

    def record(layer):
        def hook(module, args):  # args: hidden states, top_k_index, top_k_weights
            dispatched[layer] = torch.bincount(args[1].flatten(), minlength=4)

        return hook

    hooks = [
        layer.mlp.experts.register_forward_pre_hook(record(i))
        for i, layer in enumerate(model.model.layers)
        if hasattr(layer.mlp, "experts")
    ]
    try:
        rows = router_load(model, ids)
    finally:
        for hook in hooks:
            hook.remove()
    assert [row["layer"] for row in rows] == sorted(dispatched) == [0, 2]  # the sparse layers; layer 1 is dense
    for row in rows:
        counts = dispatched[row["layer"]].float()
        assert row["load"] == pytest.approx((counts / counts.sum()).tolist())
        assert row["unused"] == int((counts == 0).sum())
        # the busiest expert's tokens over what an even spread would give it
        assert row["max_over_even"] == pytest.approx(counts.max().item() / (counts.sum().item() / 4))
        assert sum(row["mean_probability"]) == pytest.approx(1.0, abs=1e-5)
    # an identity conversion computes the stock model, routers included; the random gates route differently
    convert_checkpoint(stock_moe_dense_layer, tmp_path / "identity", gate="elementwise", progress=False)
    identity = router_load(load_model(str(tmp_path / "identity"), device="cpu"), ids)
    stock = router_load(load_model(str(stock_moe_dense_layer), device="cpu"), ids)
    assert identity == stock and stock != rows
    # massive activations cover every decoder layer, sparse or dense
    assert [row["layer"] for row in massive_activations(model, ids)] == [0, 1, 2]


def test_analyze_reports_router_load_and_gates(gated_moe, tmp_path, capsys):
    out = tmp_path / "analysis"
    assert (
        main(
            [
                "analyze",
                str(gated_moe),
                "--prompt",
                "The gate scales each head. Hello world, hello gates.",
                "--out",
                str(out),
                "--no-plots",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    report = json.loads((out / "analysis.json").read_text())["models"]["gated"]
    assert report["gates"] is not None and [row["layer"] for row in report["router_load"]] == [0, 2]
    assert "router max/even" in capsys.readouterr().out


def test_bench_has_moe_sizes_with_the_gates_cost_beside_the_experts():
    from gated_qwen.tools.benchmark.measure import BenchmarkOptions, build_arms, parameter_counts, run_benchmark
    from gated_qwen.tools.benchmark.report import format_markdown

    counts = parameter_counts(BenchmarkOptions(size="moe-tiny"))
    parameters, active = counts["parameters"], counts["active_parameters"]
    arms = build_arms(BenchmarkOptions(size="moe-tiny"))
    torch.manual_seed(0)
    for name, arm in arms.items():  # the counts are those of the arms the benchmark builds and runs
        assert parameters[name] == arm.num_parameters()
        assert active[name] == parameters_one_token_uses(arm.float()) < parameters[name]
    # the gate adds the same parameters (its q_proj rows) to total and active: a larger share of what a token uses
    gate_rows = q_proj_parameters(arms["headwise"]) - q_proj_parameters(arms["none"])
    assert parameters["headwise"] - parameters["none"] == active["headwise"] - active["none"] == gate_rows > 0
    assert active["headwise"] / active["none"] > parameters["headwise"] / parameters["none"]
    assert [type(arm).__name__ for arm in arms.values()] == [
        "Qwen3MoeForCausalLM",
        "Qwen3MoeGatedForCausalLM",
        "Qwen3MoeGatedForCausalLM",
        "Qwen3MoeGatedForCausalLM",
    ]
    ids = torch.randint(256, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(arms["qwen3"](ids).logits, arms["none"](ids).logits)
    result = run_benchmark(
        BenchmarkOptions(
            size="moe-tiny",
            repeats=1,
            prompt_length=8,
            new_tokens=4,
            batch_sizes=(1,),
            loading=False,
            conversion=False,
        )
    )
    assert "| Qwen3MoeGated headwise |" in format_markdown(result) and "active params" in format_markdown(result)


def test_eval_harness_loglikelihoods_of_a_moe_equal_its_own(gated_moe, tmp_path):
    """lm-evaluation-harness on a gated MoE loaded by gated-qwen: its log-likelihoods are the model's own."""
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install 'gated-qwen[eval]')")
    from test_evaluation import ITEMS, TASK, loglikelihood_by_hand, write_task_folder

    from gated_qwen.tools.evaluation import evaluate
    from gated_qwen.tools.generation import load_model_and_tokenizer

    task_folder = write_task_folder(tmp_path)
    model, tokenizer = load_model_and_tokenizer(str(gated_moe), device="cpu", dtype="float32")
    assert type(model).__name__ == "Qwen3MoeGatedForCausalLM"
    result = evaluate(
        model, tokenizer, [TASK], include_path=task_folder, log_samples=True, bootstrap_iters=0, batch_size=2
    )
    samples = sorted(result["samples"][TASK], key=lambda sample: sample["doc_id"])
    assert len(samples) == len(ITEMS)
    for item, sample in zip(ITEMS, samples):
        expected = [
            loglikelihood_by_hand(model, tokenizer, item["question"], " " + choice) for choice in item["choices"]
        ]
        assert [float(loglikelihood) for loglikelihood, _ in sample["filtered_resps"]] == pytest.approx(
            expected, abs=1e-4
        )
