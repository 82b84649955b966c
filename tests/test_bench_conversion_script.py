"""scripts/bench_conversion.py: the source in Qwen's MoE layout, and a run at a tiny shape whose rows and outputs are real."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import load_script


ROOT = Path(__file__).resolve().parents[1]
bench_conversion = load_script("bench_conversion")


def test_a_missing_scratch_folder_is_named_before_anything_is_written(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_conversion.main(["--scratch", str(tmp_path / "missing"), "--results-dir", str(tmp_path / "results")])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert f"--scratch {tmp_path / 'missing'}: no such folder" in error and "Traceback" not in error
    assert not (tmp_path / "results").exists()


def test_the_source_has_qwen3_30b_a3b_layer_shapes_in_the_per_expert_layout():
    tensors = bench_conversion.source_tensors(bench_conversion.SHAPES["30b-a3b"], layers=2)
    assert tensors["model.layers.1.self_attn.q_proj.weight"] == (4096, 2048)  # 32 heads of 128
    assert tensors["model.layers.1.self_attn.k_proj.weight"] == (512, 2048)  # 4 kv heads
    assert tensors["model.layers.1.mlp.experts.127.down_proj.weight"] == (2048, 768)
    assert tensors["model.layers.1.mlp.gate.weight"] == (128, 2048)
    assert tensors["lm_head.weight"] == tensors["model.embed_tokens.weight"] == (151936, 2048)
    assert "model.layers.2.input_layernorm.weight" not in tensors
    assert len(tensors) == 3 + 2 * (9 + 128 * 3)


@pytest.mark.slow
def test_a_tiny_run_measures_each_converter_and_what_they_wrote_loads(tmp_path, monkeypatch):
    import torch

    from gated_qwen import Qwen3MoeGatedForCausalLM

    kept = []

    def measure_and_keep(command, env):  # the real measurement; each converted folder copied before it is removed
        result = measure(command, env)
        if "convert" in command:
            kept.append(shutil.copytree(command[command.index("convert") + 2], tmp_path / f"kept{len(kept)}"))
        return result

    measure = bench_conversion.measure
    monkeypatch.setattr(bench_conversion, "measure", measure_and_keep)
    results = tmp_path / "results"
    args = ["--shape", "tiny", "--layers", "2", "--repeats", "1", "--source-shard-size", "20KB"]
    assert bench_conversion.main([*args, "--before", str(ROOT), "--scratch", str(tmp_path), "--results-dir", str(results)]) == 0  # fmt: skip
    report = json.loads((results / "results.json").read_text())
    rows = {(row["gate"], row["checkout"]): row for row in report["summary"]}
    assert set(rows) == {("copy", None)} | {
        (gate, c) for gate in ("headwise", "elementwise") for c in ("before", "after")
    }
    for (gate, checkout), row in rows.items():
        assert row["runs"] == 1 and row["seconds"] > 0 and row["output_bytes"] > 0
        if gate != "copy":  # a Python that imported torch: far above a bare interpreter's
            assert row["peak_rss_mib"] > 100 and row["anon_mib"] > 50
    assert report["source"]["files"] > 1 and report["source"]["tensors"] == 3 + 2 * (9 + 8 * 3)
    table = (results / "results.md").read_text()
    assert "| headwise | before `" in table and "| elementwise | after / before | **" in table and "`cp -r`" in table
    assert len(kept) == 4
    for folder in kept:
        model = Qwen3MoeGatedForCausalLM.from_pretrained(folder)  # strict loading: the config describes the weights
        assert model.config.gate_type in ("headwise", "elementwise") and model.config.num_experts == 8
        with torch.no_grad():
            assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()
