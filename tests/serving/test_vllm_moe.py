"""vLLM serves gated Qwen3-MoE models (issues 23, 37): the native checkpoint through the plugin (vLLM's own
Qwen3-MoE with the gate in its attention, ``Qwen3MoeGatedForCausalLM``, the class asserted) and the Qwen3.5-MoE
export through vLLM's own ``Qwen3_5MoeForCausalLM``, each with greedy tokens equal to gated-qwen's own, at
tensor-parallel sizes 1 and 2.

Like ``test_vllm_plugin.py``, the vLLM cases need vLLM installed beside gated-qwen (``.ci/run`` builds such an
environment and runs this file there) and are skipped elsewhere; all of them run in one ``scripts/check_vllm.py``
process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_stock_moe_checkpoint


pytestmark = pytest.mark.slow


REPO = Path(__file__).resolve().parents[2]
TENSOR_PARALLEL_SIZES = (1, 2)
# vLLM's CPU attention takes head sizes of 32 and up; 4 query heads on 2 kv heads, so that a tensor-parallel
# size of 2 puts one kv group, its two queries and their gate rows on each rank; 4 experts of width 64.
TINY_MOE = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}


def gated_moe(folder: Path, gate: str, **config) -> Path:
    """A stock Qwen3-MoE converted with random gate rows (so that the gates matter): a native gated MoE."""
    import torch

    from gated_qwen import convert_checkpoint

    stock = write_stock_moe_checkpoint(folder / "stock", **{**TINY_MOE, **config})
    torch.manual_seed(0)
    convert_checkpoint(stock, folder / "gated", gate=gate, init="random", progress=False)
    return folder / "gated"


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    pytest.importorskip(
        "vllm", reason="vLLM is not installed here (.ci/run checks the plugin in an environment with vLLM)"
    )
    from gated_qwen.transforms.export import export_checkpoint

    root = tmp_path_factory.mktemp("vllm_moe")
    # a dense layer among the sparse ones natively (Qwen3.5-MoE cannot express it, so it is not exported)
    native_headwise = gated_moe(root / "headwise", "headwise", num_hidden_layers=3, mlp_only_layers=[1])
    native_elementwise = gated_moe(root / "elementwise", "elementwise")
    export = root / "elementwise-qwen3_5"
    export_checkpoint(native_elementwise, export, progress=False)
    # a headwise MoE whose config says elementwise: refused in the caller, before any engine starts
    mislabelled = gated_moe(root / "mislabelled", "headwise")
    config = json.loads((mislabelled / "config.json").read_text())
    config.update(headwise_attn_output_gate=False, elementwise_attn_output_gate=True)
    (mislabelled / "config.json").write_text(json.dumps(config))

    environment = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0|1")}
    process = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "check_vllm.py"),
            str(native_headwise),
            str(native_elementwise),
            "--export",
            str(export),
            str(native_elementwise),
            "--refused",
            str(mislabelled),
            "--json",
            "--tensor-parallel-size",
            *map(str, TENSOR_PARALLEL_SIZES),
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=3000,
    )
    results = {(Path(r["model"]), r["tensor_parallel_size"]): r for r in map(json.loads, process.stdout.splitlines())}
    assert len(results) == 4 * len(TENSOR_PARALLEL_SIZES), process.stderr[-5000:]
    cases = {"native-headwise": native_headwise, "native-elementwise": native_elementwise, "export": export}
    return {"cases": cases, "mislabelled": mislabelled, "results": results}


BUILT = {
    "native-headwise": "Qwen3MoeGatedForCausalLM",
    "native-elementwise": "Qwen3MoeGatedForCausalLM",
    "export": "Qwen3_5MoeForCausalLM",
}


@pytest.mark.parametrize("tensor_parallel_size", TENSOR_PARALLEL_SIZES)
@pytest.mark.parametrize("case", BUILT)
def test_vllm_generates_what_gated_qwen_generates(vllm_run, case, tensor_parallel_size):
    result = vllm_run["results"][vllm_run["cases"][case], tensor_parallel_size]
    assert "error" not in result, result["error"]
    assert result["built"] == BUILT[case]
    assert result["tokens"] == result["expected"]


@pytest.mark.parametrize("tensor_parallel_size", TENSOR_PARALLEL_SIZES)
def test_a_moe_config_that_does_not_describe_the_weights_is_refused_to_the_caller(vllm_run, tensor_parallel_size):
    result = vllm_run["results"][vllm_run["mislabelled"], tensor_parallel_size]
    assert "tokens" not in result, result
    assert "that is the shape of a 'headwise' gate" in result["error"]
