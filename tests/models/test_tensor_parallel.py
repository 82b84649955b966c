"""Tensor parallelism of Qwen3Gated over 2 CPU ranks (gloo): every plan transformers offers, both gates.

Each multi-process test starts 2 ranks (``torch.multiprocessing``, spawn) that load the same saved model
with ``DistributedConfig(tp_size=2, tp_plan=...)`` and compare its logits, loss and greedy tokens with the
unsharded model's on the same rank. The plans: Qwen3's ``colwise`` (q_proj sharded in contiguous rows), and
transformers 5.25's ``unit_colwise``/``unit_rowwise``, once with more kv groups than ranks (sharded) and
once with fewer (replicated). Plans that would cut a kv group's query and gate rows apart are refused.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from transformers.distributed import tensor_parallel as transformers_tp

from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM, Qwen3MoeGatedConfig, Qwen3MoeGatedForCausalLM
from gated_qwen.models.tensor_parallel import GATED_UNIT_STYLES, check_and_adapt_tp_plan


pytestmark = pytest.mark.slow


HAS_UNIT_STYLES = hasattr(transformers_tp, "UnitColwiseParallel")  # transformers >= 5.25
ATTENTION = "model.layers.*.self_attn"
UNIT_PLAN = {
    f"{ATTENTION}.q_proj": "unit_colwise",
    f"{ATTENTION}.k_proj": "unit_colwise",
    f"{ATTENTION}.v_proj": "unit_colwise",
    f"{ATTENTION}.o_proj": "unit_rowwise",
}


def tiny_config(gate: str, num_attention_heads: int, num_key_value_heads: int, moe: bool = False):
    sizes = {
        "vocab_size": 96,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": 8,
        "max_position_embeddings": 128,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "headwise_attn_output_gate": gate == "headwise",
        "elementwise_attn_output_gate": gate == "elementwise",
    }
    if moe:  # the MoE model shares the dense model's gated attention (and its TP handling)
        return Qwen3MoeGatedConfig(**sizes, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2)
    return Qwen3GatedConfig(**sizes)


def model_class(config):
    return Qwen3MoeGatedForCausalLM if isinstance(config, Qwen3MoeGatedConfig) else Qwen3GatedForCausalLM


# ------------------------------------------------------------------------------------------------ ranks


def _compare_with_one_rank(rank: int, folder: str, tp_plan: dict | None, result_folder: str) -> None:
    """On one rank: the TP model's logits, loss and greedy tokens against the unsharded model's."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM  # the folder's config picks the dense or MoE class
    from transformers.distributed.configuration_utils import DistributedConfig

    model_tp = AutoModelForCausalLM.from_pretrained(
        folder, distributed_config=DistributedConfig(tp_size=dist.get_world_size(), tp_plan=tp_plan)
    ).eval()
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    q_proj = model_tp.model.layers[0].self_attn.q_proj.weight
    local_rows = (q_proj.to_local() if hasattr(q_proj, "to_local") else q_proj).shape[0]

    torch.manual_seed(0)
    input_ids = torch.randint(3, 96, (2, 12))  # 96: transformers 5.19 shards lm_head only evenly
    with torch.no_grad():
        out, out_tp = model(input_ids, labels=input_ids), model_tp(input_ids, labels=input_ids)
        greedy = {"max_new_tokens": 6, "do_sample": False, "use_cache": True}
        tokens, tokens_tp = model.generate(input_ids[:1], **greedy), model_tp.generate(input_ids[:1], **greedy)
    report = {
        "local_q_proj_rows": local_rows,
        "full_q_proj_rows": model.model.layers[0].self_attn.q_proj.weight.shape[0],
        "max_logit_diff": (out.logits - out_tp.logits).abs().max().item(),
        "loss_diff": (out.loss - out_tp.loss).abs().item(),
        "same_tokens": torch.equal(tokens, tokens_tp),
    }
    torch.save(report, os.path.join(result_folder, f"rank{rank}.pt"))
    dist.barrier()


def _rank_main(rank: int, world_size: int, port: int, func, args) -> None:
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        func(rank, *args)
    finally:
        dist.destroy_process_group()


def run_on_two_ranks(func, *args) -> None:
    """``func(rank, *args)`` in 2 spawned processes of one gloo group; raises if a rank fails."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.start_processes(_rank_main, args=(2, port, func, args), nprocs=2, join=True, start_method="spawn")


def sharded_vs_unsharded(
    tmp_path, gate: str, heads: int, kv_heads: int, tp_plan: dict | None, moe=False
) -> list[dict]:
    folder, results = tmp_path / "model", tmp_path / "results"
    results.mkdir()
    torch.manual_seed(42)
    config = tiny_config(gate, heads, kv_heads, moe)
    model_class(config)(config).save_pretrained(folder)
    run_on_two_ranks(_compare_with_one_rank, str(folder), tp_plan, str(results))
    return [torch.load(results / f"rank{rank}.pt", weights_only=True) for rank in range(2)]


# ------------------------------------------------------------------------------------------------ tests


needs_two_cpus = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="2 ranks need 2 CPUs")
needs_unit_styles = pytest.mark.skipif(not HAS_UNIT_STYLES, reason="unit styles are transformers >= 5.25")


@needs_two_cpus
@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
@pytest.mark.parametrize(
    "plan, heads, kv_heads, sharded",
    [
        pytest.param(None, 4, 2, True, id="colwise"),
        pytest.param(UNIT_PLAN, 4, 2, True, id="unit-sharded", marks=needs_unit_styles),
        pytest.param(UNIT_PLAN, 2, 1, False, id="unit-replicated", marks=needs_unit_styles),
    ],
)
def test_two_ranks_give_the_logits_of_one(tmp_path, gate, plan, heads, kv_heads, sharded):
    reports = sharded_vs_unsharded(tmp_path, gate, heads, kv_heads, plan)
    for rank, report in enumerate(reports):
        # Sharded: each rank holds half of q_proj's rows (one kv group with its gate rows); replicated: all of them.
        expected_rows = report["full_q_proj_rows"] // 2 if sharded else report["full_q_proj_rows"]
        assert report["local_q_proj_rows"] == expected_rows, (rank, report)
        assert report["max_logit_diff"] < 1e-5 and report["loss_diff"] < 1e-5, (rank, report)
        assert report["same_tokens"], (rank, report)


@needs_two_cpus
@pytest.mark.parametrize(
    "plan, kv_heads, sharded",
    [
        pytest.param(None, 2, True, id="colwise"),
        pytest.param(UNIT_PLAN, 1, False, id="unit-replicated", marks=needs_unit_styles),
    ],
)
def test_the_moe_model_shards_its_gated_attention_the_same_way(tmp_path, plan, kv_heads, sharded):
    reports = sharded_vs_unsharded(tmp_path, "elementwise", 2 * kv_heads, kv_heads, plan, moe=True)
    for rank, report in enumerate(reports):
        expected_rows = report["full_q_proj_rows"] // 2 if sharded else report["full_q_proj_rows"]
        assert report["local_q_proj_rows"] == expected_rows, (rank, report)
        assert report["max_logit_diff"] < 1e-5 and report["loss_diff"] < 1e-5 and report["same_tokens"], (rank, report)


def _load_expecting_refusal(rank: int, folder: str, tp_plan: dict | None, result_folder: str) -> None:
    from transformers.distributed.configuration_utils import DistributedConfig

    try:
        Qwen3GatedForCausalLM.from_pretrained(folder, distributed_config=DistributedConfig(tp_size=2, tp_plan=tp_plan))
    except ValueError as error:
        message = str(error)
    else:
        message = ""
    with open(os.path.join(result_folder, f"rank{rank}.txt"), "w") as file:
        file.write(message)


@needs_two_cpus
def test_colwise_over_more_ranks_than_kv_groups_is_refused_when_applied(tmp_path):
    """One kv group over 2 ranks: a contiguous colwise shard would put queries on one rank and gates on the other."""
    folder, results = tmp_path / "model", tmp_path / "results"
    results.mkdir()
    Qwen3GatedForCausalLM(tiny_config("elementwise", 2, 1)).save_pretrained(folder)
    run_on_two_ranks(_load_expecting_refusal, str(folder), None, str(results))
    for rank in range(2):
        message = (results / f"rank{rank}.txt").read_text()
        assert "would cut a kv group's query and gate rows apart (1 kv heads over 2 ranks)" in message, message


@needs_two_cpus
def test_a_gate_with_its_own_projection_is_refused_under_tensor_parallelism(tmp_path):
    """A value gate (g_proj) has no sharding plan: refused when the plan is applied, on every rank."""
    from gated_qwen import Qwen3GatedConfig

    folder, results = tmp_path / "model", tmp_path / "results"
    results.mkdir()
    config = tiny_config("elementwise", 4, 2).to_dict() | {"gate_position": "value", "gate_type": "elementwise"}
    Qwen3GatedForCausalLM(Qwen3GatedConfig.from_dict(config)).save_pretrained(folder)
    run_on_two_ranks(_load_expecting_refusal, str(folder), None, str(results))
    for rank in range(2):
        message = (results / f"rank{rank}.txt").read_text()
        assert "shards the released gate layout only" in message and "g_proj" in message, message


# ------------------------------------------------------------------------------------------------ the plan check


def plan(q, k="colwise", v="colwise", o="rowwise"):
    styles = {"q_proj": q, "k_proj": k, "v_proj": v, "o_proj": o}
    return {f"{ATTENTION}.{name}": style for name, style in styles.items() if style is not None}


def test_unit_styles_are_replaced_on_q_proj_and_o_proj_only():
    changes = check_and_adapt_tp_plan(UNIT_PLAN, num_key_value_heads=1, tp_size=2)
    assert changes == {
        f"{ATTENTION}.q_proj": GATED_UNIT_STYLES["unit_colwise"],
        f"{ATTENTION}.o_proj": GATED_UNIT_STYLES["unit_rowwise"],
    }


@pytest.mark.parametrize(
    "tp_plan, kv_heads, names",
    [
        (plan("colwise"), 1, "would cut a kv group"),
        (plan("colwise", k="colwise_rep"), 2, "needs k_proj sharded the same way"),
        (plan("unit_colwise", k="colwise", v="colwise", o="rowwise"), 2, "needs `unit_colwise` on k_proj and v_proj"),
        (plan(None), 2, "keeps all its rows on every rank but k_proj is `colwise`"),
        (plan("packed_colwise"), 2, "`model.layers.*.self_attn.q_proj: packed_colwise` is not supported"),
    ],
)
def test_plans_that_would_split_a_kv_group_are_refused_naming_the_rule(tp_plan, kv_heads, names):
    with pytest.raises(ValueError, match="tensor parallelism of Qwen3Gated") as refused:
        check_and_adapt_tp_plan(tp_plan, num_key_value_heads=kv_heads, tp_size=2)
    assert names in str(refused.value)


def test_plans_that_keep_kv_groups_whole_pass_unchanged():
    assert check_and_adapt_tp_plan(plan("colwise"), num_key_value_heads=4, tp_size=2) == {}
    assert check_and_adapt_tp_plan(plan("colwise_rep", k="colwise_rep", v=None, o=None), 1, 2) == {}
    assert check_and_adapt_tp_plan({}, 1, 2) == {}
