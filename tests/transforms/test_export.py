"""Export to transformers' Qwen3.5: the same model, read by a process that never imports gated_qwen.

Every released-layout fixture shape (headwise and elementwise gates, GQA and MHA, tied and untied
embeddings, plus linear and yarn rope scaling) is exported in float32 and bfloat16. One subprocess,
which asserts that it never imports gated_qwen, loads every export with transformers'
``AutoModelForCausalLM`` and returns logits and greedy tokens; this process compares them with
Qwen3Gated's.

What "the same" means in bfloat16. Qwen3's RMSNorm rounds the normalized activations to bfloat16
and then multiplies by the weight in bfloat16 (two roundings); Qwen3.5's multiplies in float32 by
``1 + w`` and rounds once. So in bfloat16 the two architectures differ by that rounding, whatever
the weights: a few bfloat16 steps of the logits after two layers here. The tests pin both sides:
the export is *bit for bit* Qwen3Gated with its RMSNorm computed Qwen3.5's way (float32 multiply
by the weight the export restores, ``1 + (w - 1)``), and the export's bfloat16 error against the
float32 model is no larger than twice Qwen3Gated's own bfloat16 error (measured ratios: 0.6-1.4).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path

import pytest
import torch
from conftest import LOAD_WITHOUT_GATED_QWEN, tensors_of, tiny_config, write_released_checkpoint, write_tiny_tokenizer
from transformers.models.qwen3 import modeling_qwen3

from gated_qwen import Qwen3GatedForCausalLM
from gated_qwen.cli import main
from gated_qwen.errors import CheckpointError, GatedQwenError
from gated_qwen.transforms.export import (
    NormRounding,
    export_checkpoint,
    export_tensor,
    mrope_section,
    parameter_counts,
    qwen3_5_config,
)


VOCAB = 300  # the tiny tokenizer needs >= 300
NEW_TOKENS = 8
SHAPES = [(gate, kv, tie) for gate in ("headwise", "elementwise") for kv in (2, 4) for tie in (False, True)]
ROPE_SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
}
GENERATION_CONFIG = {"do_sample": False, "max_new_tokens": 16, "bos_token_id": 0, "eos_token_id": 0}


def probe_ids() -> torch.Tensor:
    return torch.randint(VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))


def write_source(
    folder: Path, gate: str, kv: int, tie: bool, rope_scaling: dict | None = None, tokenizer=False
) -> dict:
    spec = write_released_checkpoint(
        folder, gate=gate, num_key_value_heads=kv, tie_word_embeddings=tie, vocab_size=VOCAB
    )
    if rope_scaling is not None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "rope_scaling": rope_scaling}))
    if tokenizer:
        write_tiny_tokenizer(folder)
        (folder / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    return spec


def greedy(model, ids):
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                              min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)  # fmt: skip


def qwen3_5_rms_norm_forward(self, hidden_states):
    """Qwen3RMSNorm computed as Qwen3_5RMSNorm computes it: the weight multiplies in float32, one rounding."""
    normed = hidden_states.float() * torch.rsqrt(
        hidden_states.float().pow(2).mean(-1, keepdim=True) + self.variance_epsilon
    )
    return (normed * self.weight.float()).to(hidden_states.dtype)


@contextmanager
def normed_like_qwen3_5(model, exported: Path):
    """``model`` (Qwen3Gated) with Qwen3.5's RMSNorm rounding and the norm weights the export restores (1 + stored)."""
    stored = tensors_of(exported)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                restored = 1 + stored[name].float()
                parameter.copy_(restored)
                assert torch.equal(parameter.float(), restored), f"{name}: 1 + (w - 1) does not fit {parameter.dtype}"
    original = modeling_qwen3.Qwen3RMSNorm.forward
    modeling_qwen3.Qwen3RMSNorm.forward = qwen3_5_rms_norm_forward
    try:
        yield model
    finally:
        modeling_qwen3.Qwen3RMSNorm.forward = original


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Every case exported, the references computed here, and the subprocess's results."""
    root = tmp_path_factory.mktemp("export")
    ids = probe_ids()
    cases, jobs = {}, []
    sources = [(f"{gate}-{kv}-{tie}", {"gate": gate, "kv": kv, "tie": tie}) for gate, kv, tie in SHAPES]
    sources += [
        (f"rope-{kind}", {"gate": "headwise", "kv": 2, "tie": False, "rope_scaling": scaling})
        for kind, scaling in ROPE_SCALINGS.items()
    ]
    for source_name, kwargs in sources:
        source = root / source_name
        write_source(source, **kwargs, tokenizer=source_name == "headwise-2-False")
        for dtype in ("float32", "bfloat16") if not source_name.startswith("rope") else ("float32",):
            name = f"{source_name}-{dtype}"
            result = export_checkpoint(source, root / f"{name}-qwen3_5", dtype=dtype, progress=False)
            cases[name] = {"result": result, "source": source, "dtype": getattr(torch, dtype)}
            job = {"name": name, "path": str(result.path), "ids": ids.tolist(), "new_tokens": NEW_TOKENS}
            if source_name == "headwise-2-False":
                job["text"] = "Hello gated attention"
            jobs.append(job)

    # The other interpreter starts (its imports take seconds) while this one computes the references.
    out = root / "results.pt"
    process = subprocess.Popen(
        [sys.executable, "-c", LOAD_WITHOUT_GATED_QWEN, json.dumps(jobs), str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root,
        # GATED_QWEN_NO_STARTUP_HOOK: an installed gated-qwen would register itself in this process (docs/clients.md)
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "GATED_QWEN_NO_STARTUP_HOOK": "1"},
    )  # fmt: skip
    try:
        for case in cases.values():
            gated = Qwen3GatedForCausalLM.from_pretrained(case["source"], dtype=case["dtype"]).eval()
            with torch.no_grad():
                case.update(logits=gated(ids).logits, tokens=greedy(gated, ids))
            if case["dtype"] == torch.bfloat16:
                reference = Qwen3GatedForCausalLM.from_pretrained(case["source"], dtype=torch.float32)
                with torch.no_grad():
                    case["float32_logits"] = reference(ids).logits
                with normed_like_qwen3_5(gated, case["result"].path), torch.no_grad():
                    case["qwen3_5_rounding_logits"] = gated(ids).logits
                    case["qwen3_5_rounding_tokens"] = greedy(gated, ids)
        _, stderr = process.communicate(timeout=600)
    finally:
        process.kill()
    assert process.returncode == 0, stderr[-3000:]
    loaded = torch.load(out, weights_only=True)
    for name, case in cases.items():
        case["export"] = loaded[name]
    return cases


def case_names(dtype):
    """One pytest case per fixture shape, named by the key ``exports`` files it under."""
    return [
        pytest.param(
            f"{gate}-{kv}-{tie}-{dtype}", id=f"{gate}-{'gqa' if kv == 2 else 'mha'}-{'tied' if tie else 'untied'}"
        )
        for gate, kv, tie in SHAPES
    ]


@pytest.mark.parametrize("name", case_names("float32") + [f"rope-{kind}-float32" for kind in ROPE_SCALINGS])
def test_float32_export_computes_the_gated_model(exports, name):
    case = exports[name]
    export = case["export"]
    assert (export["class"], export["dtype"]) == ("Qwen3_5ForCausalLM", "torch.float32")
    assert (export["logits"] - case["logits"]).abs().max().item() <= 1e-5
    assert torch.equal(export["tokens"], case["tokens"])
    assert export["parameters"] == case["result"].exported_parameters


@pytest.mark.parametrize("name", case_names("bfloat16"))
def test_bfloat16_export_computes_the_gated_model(exports, name):
    case = exports[name]
    export = case["export"]
    assert (export["class"], export["dtype"]) == ("Qwen3_5ForCausalLM", "torch.bfloat16")
    # Bit for bit the gated model, once its RMSNorm rounds as Qwen3.5's does (module docstring).
    assert torch.equal(export["logits"], case["qwen3_5_rounding_logits"])
    assert torch.equal(export["tokens"], case["qwen3_5_rounding_tokens"])
    # Against stock Qwen3Gated in bfloat16: no further from the float32 model than Qwen3Gated itself.
    reference = case["float32_logits"]
    own_error = (case["logits"].float() - reference).abs().max().item()
    export_error = (export["logits"].float() - reference).abs().max().item()
    assert 0 < export_error <= 2 * own_error


def test_rope_scaling_is_carried_over(exports):
    for kind, scaling in ROPE_SCALINGS.items():
        config = json.loads((exports[f"rope-{kind}-float32"]["result"].path / "config.json").read_text())
        assert {k: config["rope_parameters"][k] for k in scaling} == scaling
    # and it matters: the three sources differ only in rope scaling, and so do their logits
    plain, linear = (exports[f"{name}-float32"]["logits"] for name in ("headwise-2-False", "rope-linear"))
    assert (plain - linear).abs().max() > 1e-3


def test_tokenizer_and_generation_config_are_copied(exports):
    case = exports["headwise-2-False-float32"]
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (case["result"].path / name).read_bytes() == (case["source"] / name).read_bytes(), name
    assert not list(case["result"].path.glob("*.py"))  # the trap code files beside the source are not passed on
    from transformers import AutoTokenizer

    assert (
        case["export"]["text_ids"]
        == AutoTokenizer.from_pretrained(case["source"])("Hello gated attention")["input_ids"]
    )


def test_exported_config(exports):
    config = json.loads((exports["headwise-2-True-bfloat16"]["result"].path / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text" and config["architectures"] == ["Qwen3_5ForCausalLM"]
    assert config["layer_types"] == ["full_attention"] * 2 and config["full_attention_interval"] == 1
    rope = config["rope_parameters"]
    assert rope["partial_rotary_factor"] == 1.0 and rope["mrope_interleaved"] is True and rope["rope_theta"] == 10000.0
    assert sum(rope["mrope_section"]) == 8 // 2  # every frequency of head_dim 8
    assert (
        config["tie_word_embeddings"] is True and config["attention_bias"] is False and config["dtype"] == "bfloat16"
    )
    assert "auto_map" not in config


def llama_cpp_stream(frequency: int, sections: list[int]) -> str:
    """The position stream llama.cpp's interleaved M-RoPE (ggml's rope, imrope) gives a frequency; "e" is 0 for text."""
    sector = frequency % sum(sections)
    if sector % 3 == 1 and sector < 3 * sections[1]:
        return "h"
    if sector % 3 == 2 and sector < 3 * sections[2]:
        return "w"
    if sector % 3 == 0 and sector < 3 * sections[0]:
        return "t"
    return "e"


@pytest.mark.parametrize("head_dim", [8, 16, 64, 96, 128, 256])
def test_mrope_sections_cover_every_frequency_evenly(head_dim):
    sections = mrope_section(head_dim)
    assert sum(sections) == head_dim // 2 and max(sections) - min(sections) <= 1
    # every frequency rotates with the text position in llama.cpp too (none falls to the unrotated stream)
    assert {llama_cpp_stream(i, sections) for i in range(head_dim // 2)} <= {"t", "h", "w"}
    assert "e" in {llama_cpp_stream(i, [24, 20, 20]) for i in range(64)}  # what unbalanced sections do


# ---------------------------------------------------------------------------------------------- the mapping


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_q_proj_is_laid_out_per_head_as_query_then_gate(tmp_path, gate):
    # Against the rows the fixture wrote per head (from docs/released-format.md), not against gated_qwen.models.layout.
    spec = write_released_checkpoint(tmp_path, gate=gate, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    name = "model.layers.1.self_attn.q_proj.weight"
    ((out_name, q_proj),) = export_tensor(name, spec["tensors"][name], tiny_config(gate=gate))
    assert out_name == name and q_proj.shape == (4 * 2 * 8, 32)
    rows = spec["layers"][1]
    for head in range(4):
        block = q_proj[head * 16 : (head + 1) * 16]
        assert torch.equal(block[:8], rows["query_rows"][head])
        assert torch.equal(block[8:], rows["gate_rows"][head].expand(8, 32))  # headwise: its one row, 8 times


def test_norm_weights_are_stored_minus_one_and_the_rest_unchanged(tmp_path):
    spec = write_released_checkpoint(tmp_path, gate="headwise", tie_word_embeddings=True)
    config = tiny_config(gate="headwise", tie_word_embeddings=True)
    for name, tensor in spec["tensors"].items():
        outputs = export_tensor(name, tensor, config)
        if "norm" in name:
            ((_, out),) = outputs
            assert torch.equal(out, tensor - 1), name
        elif "q_proj" not in name:
            assert outputs == [(name, tensor)] and outputs[0][1] is tensor, name
    assert export_tensor("lm_head.weight", torch.zeros(96, 32), config) == []  # tied: Qwen3.5 ties it too


def test_norm_rounding_counts_weights_under_one_half():
    # bfloat16 keeps 8 significant bits: spacing 2**-9 in [0.25, 0.5), 2**-8 in [0.5, 1). So w = 151/512 has no
    # exact w - 1 = -361/512 (it rounds half to even, to -360/512) and comes back as 152/512; 154/512 does.
    weight = torch.tensor([151 / 512, 0.75, 2.0, 1.0, 0.5, 154 / 512], dtype=torch.bfloat16)
    ((_, exported),) = export_tensor("model.norm.weight", weight, tiny_config())
    assert (1 + exported.float()).tolist() == [152 / 512, 0.75, 2.0, 1.0, 0.5, 154 / 512]
    rounding = NormRounding()
    rounding.add("model.norm.weight", weight, exported)
    assert (rounding.total, rounding.rounded, rounding.worst_name) == (6, 1, "model.norm.weight")
    assert rounding.worst_relative_error == pytest.approx(1 / 151)


def test_export_warns_about_norm_weights_that_round(tmp_path, caplog, capsys):
    source = tmp_path / "source"
    spec = write_source(source, "headwise", 2, False)
    norms = torch.cat([t.flatten() for n, t in spec["tensors"].items() if "norm" in n])
    assert norms.min() < 0.5  # the fixture has weights that bfloat16 cannot store exactly as w - 1
    with caplog.at_level("WARNING", logger="gated_qwen.transforms.export"):
        assert (
            main(["export", str(source), str(tmp_path / "bf16"), "--to", "qwen3_5", "--dtype", "bfloat16", "--quiet"])
            == 0
        )
    (record,) = [r for r in caplog.records if r.name == "gated_qwen.transforms.export"]
    assert record.levelname == "WARNING" and "norm weights round when stored as w - 1 in bfloat16" in record.message
    assert "worst relative error" in record.message and "of 192 norm weights" in record.message
    # the fixture's weights are 1 + x in float32, so w - 1 = x exactly: nothing rounds, nothing is said
    caplog.clear()
    result = export_checkpoint(source, tmp_path / "fp32", progress=False)
    assert result.norm_rounding.rounded == 0 and result.norm_rounding.total == 192 and not caplog.records


# ---------------------------------------------------------------------------------------------- cost


def test_parameter_growth_of_the_released_headwise_arm():
    # docs/released-format.md: vocabulary 152064, 28 layers, hidden 2048, 16 query / 8 kv heads of 128, MLP 6144, tied
    released = {"model_type": "qwen3", "vocab_size": 152064, "hidden_size": 2048, "intermediate_size": 6144,
                "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                "tie_word_embeddings": True}  # fmt: skip
    gated, exported = parameter_counts({**released, "headwise_attn_output_gate": True})
    assert gated == 1_721_754_624  # 1721.8M, as measured on the downloaded arm
    assert exported - gated == 28 * (2 * 16 * 128 - 16 * 129) * 2048  # q_proj: 2064 -> 4096 rows per layer
    assert round(exported / gated - 1, 3) == 0.068
    gated, exported = parameter_counts({**released, "intermediate_size": 5504, "elementwise_attn_output_gate": True})
    assert gated == exported == 1_728_177_152  # 1728.2M; elementwise: the layout changes, the size does not


def test_cli_prints_the_parameter_growth(tmp_path, capsys):
    source = tmp_path / "source"
    write_source(source, "headwise", 2, True)
    assert main(["export", str(source), str(tmp_path / "out"), "--to", "qwen3_5", "--verify", "--quiet"]) == 0
    out = capsys.readouterr().out
    gated, exported = parameter_counts(json.loads((source / "config.json").read_text()))
    assert f"parameters: {gated:,} -> {exported:,} (+{exported / gated - 1:.2%})" in out
    difference = float(out.split("largest logit difference from")[1].split(":")[-1])
    assert difference <= 1e-5


# ---------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"use_qk_norm": False}, "has no QK-norm (use_qk_norm false)"),
        ({"qkv_bias": True}, "has attention biases (qkv_bias true"),
        ({"gate": "none"}, "has no gate (gate type 'none'): it is a stock Qwen3"),
    ],
    ids=["no-qk-norm", "qkv-bias", "gate-none"],
)
def test_cli_refuses_what_qwen3_5_cannot_compute(tmp_path, capsys, change, reason):
    source = tmp_path / "source"
    write_released_checkpoint(source, **{"gate": "headwise", **change})
    before = digests(source)
    assert main(["export", str(source), str(tmp_path / "out"), "--to", "qwen3_5", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gated-qwen export: error: ") and reason in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"] and digests(source) == before


def test_sliding_window_layers_are_refused(tmp_path):
    config = write_released_checkpoint(tmp_path / "source")["config"]
    with pytest.raises(CheckpointError, match="sliding-window layers"):
        qwen3_5_config({**config, "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0})


def test_cli_bad_arguments(tmp_path, capsys):
    source = tmp_path / "source"
    write_released_checkpoint(source)
    assert main(["export", str(source), str(tmp_path / "out"), "--to", "llama"]) == 2
    assert "unknown export target 'llama'; choose one of qwen3_5" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse's choices, as in convert: one line, exit 2
        main(["export", str(source), str(tmp_path / "out"), "--to", "qwen3_5", "--dtype", "int8"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--dtype" in err and "'int8'" in err and len(err.strip().splitlines()) == 1
    assert main(["export", str(tmp_path / "missing"), str(tmp_path / "out"), "--to", "qwen3_5"]) == 2
    assert "missing does not exist: there is no such folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["export", str(source), str(tmp_path / "out")])
    assert exit_info.value.code == 2 and "--to" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]


# ---------------------------------------------------------------------------------------------- files


def digests(folder: Path) -> dict[str, str]:
    files = (p for p in sorted(folder.rglob("*")) if p.is_file())
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_existing_output_is_kept_unless_overwrite(tmp_path):
    source, out = tmp_path / "source", tmp_path / "out"
    write_released_checkpoint(source)
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(GatedQwenError, match="is not empty; choose another folder or pass --overwrite"):
        export_checkpoint(source, out, progress=False)
    assert (out / "keep.txt").read_text() == "mine"
    export_checkpoint(source, out, overwrite=True, progress=False)
    assert not (out / "keep.txt").exists() and (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "source"]  # no temporary folder left


def test_failure_midway_leaves_no_output_and_an_unchanged_source(tmp_path, monkeypatch):
    source, out = tmp_path / "source", tmp_path / "out"
    write_released_checkpoint(source)
    before = digests(source)
    import gated_qwen.transforms.export as export_module

    original = export_module.export_tensor

    def failing(name, tensor, config):
        if tensor.device.type != "meta" and name.startswith("model.layers.1."):  # planning runs on meta tensors
            raise RuntimeError("disk full")
        return original(name, tensor, config)

    monkeypatch.setattr(export_module, "export_tensor", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        export_checkpoint(source, out, max_shard_size="20KB", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"] and digests(source) == before


def test_sharded_export_loads(tmp_path):
    source = tmp_path / "source"
    write_released_checkpoint(source)
    result = export_checkpoint(source, tmp_path / "out", max_shard_size="20KB", progress=False)
    assert len(result.files) > 1 and (result.path / "model.safetensors.index.json").is_file()
    from transformers import Qwen3_5ForCausalLM

    ids = probe_ids() % 96
    exported = Qwen3_5ForCausalLM.from_pretrained(result.path)
    gated = Qwen3GatedForCausalLM.from_pretrained(source)
    with torch.no_grad():
        assert (exported(ids).logits - gated(ids).logits).abs().max() <= 1e-5


def test_hub_source_downloads_config_weights_and_tokenizer_but_no_code(tmp_path, monkeypatch):
    """A released arm on the hub (pytorch_model.bin, the authors' .py files beside it): config.json first, then
    the weights, tokenizer and generation config; never the code."""
    from types import SimpleNamespace

    snapshot = tmp_path / "snapshot"
    write_source(snapshot / "arm", "elementwise", 2, False, tokenizer=True)
    (snapshot / "arm" / "chat_template.jinja").write_text("{{ messages }}")
    listing = {f"arm/{p.name}": p.stat().st_size for p in (snapshot / "arm").iterdir()}
    calls = []

    def fake_hf_hub_download(repo_id, filename, subfolder=None, revision=None, **kwargs):
        calls.append(("config", repo_id, filename, subfolder, revision))
        return str(snapshot / subfolder / filename)

    def fake_snapshot_download(repo_id, revision=None, allow_patterns=None):
        calls.append(("snapshot", repo_id, revision, allow_patterns))
        return str(snapshot)

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_hf_hub_download)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setattr(
        huggingface_hub.HfApi,
        "list_repo_tree",
        lambda self, repo_id, path_in_repo=None, **k: [SimpleNamespace(path=p, size=n) for p, n in listing.items()],
    )
    monkeypatch.setattr(
        "gated_qwen.checkpoint.sources._check_hub_repository", lambda *args: None
    )  # the hub probe (tests/checkpoint/test_hub.py)
    result = export_checkpoint("owner/model", tmp_path / "out", subfolder="arm", revision="v1", progress=False)
    assert (result.path / "tokenizer.json").is_file() and (result.path / "chat_template.jinja").is_file()
    (config_call, (_, repo_id, revision, patterns)) = calls
    assert config_call == ("config", "owner/model", "config.json", "arm", "v1") and (repo_id, revision) == (
        "owner/model",
        "v1",
    )
    fetched = sorted(name for name in listing if any(fnmatch(name, pattern) for pattern in patterns))
    assert fetched == [f"arm/{name}" for name in ("chat_template.jinja", "config.json", "generation_config.json", "pytorch_model.bin",
                                                  "tokenizer.json", "tokenizer_config.json")]  # fmt: skip

    # a refusal comes from config.json alone, before any weight is downloaded
    config = json.loads((snapshot / "arm" / "config.json").read_text())
    (snapshot / "arm" / "config.json").write_text(json.dumps({**config, "qkv_bias": True}))
    calls.clear()
    with pytest.raises(CheckpointError, match="qkv_bias"):
        export_checkpoint("owner/model", tmp_path / "refused", subfolder="arm", progress=False)
    assert [call[0] for call in calls] == ["config"]


@pytest.mark.parametrize(
    "variant",
    [
        {"gate_type": "headwise", "gate_position": "value"},
        {"gate_type": "elementwise", "gate_shared_across_heads": True},
        {"gate_type": "elementwise", "gate_activation": "silu", "gate_combination": "additive"},
        {"gate_type": "headwise", "gate_activation": "ns_sigmoid"},
        {"gate_type": "headwise", "sandwich_norm": True},
        {"gate_type": "elementwise", "attn_output_transform": "rmsnorm"},
    ],
)
def test_a_gate_qwen3_5_does_not_have_is_refused_with_nothing_written(tmp_path, capsys, variant):
    from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM

    source = tmp_path / "source"
    config = Qwen3GatedConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, **variant,
    )  # fmt: skip
    Qwen3GatedForCausalLM(config).save_pretrained(source)
    capsys.readouterr()  # save_pretrained's progress bar
    assert main(["export", str(source), str(tmp_path / "out"), "--to", "qwen3_5", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"has a {config.gate_variant()}; Qwen3.5's gate is the released one" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]
