"""Length extrapolation (issue 29): perplexity by context length, RoPE scaling, ``analyze --context-lengths``."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from gated_qwen import Qwen3GatedForCausalLM
from gated_qwen.cli import main
from gated_qwen.tools.analysis.extrapolation import apply_rope_scaling, perplexity_by_context_length, with_rope_scaling
from tests.conftest import tiny_config, write_released_checkpoint, write_tiny_tokenizer


def gated_model():
    torch.manual_seed(0)
    return Qwen3GatedForCausalLM(tiny_config(gate="headwise")).eval()  # max_position_embeddings 128


def stock_model():
    torch.manual_seed(0)
    config = tiny_config(gate="none")
    stock = Qwen3Config(**{k: v for k, v in config.to_dict().items() if k in Qwen3Config.__dataclass_fields__})
    return Qwen3ForCausalLM(stock).eval()


def stream(n, vocab=96, seed=1):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def test_perplexity_is_the_hand_computed_nll_of_one_window():
    model = gated_model()
    ids = stream(20)
    (result,) = perplexity_by_context_length(model, ids, [16])
    with torch.no_grad():
        logits = model(input_ids=ids[None, :16]).logits[0].float()
    log_probs = logits.log_softmax(-1)
    nll = -sum(log_probs[i, ids[i + 1]].item() for i in range(15)) / 15
    assert (result.windows, result.tokens) == (1, 15)  # the 4 tokens left over are dropped
    assert result.mean_nll == pytest.approx(nll, rel=1e-5)
    assert result.perplexity == pytest.approx(math.exp(nll), rel=1e-5)


@pytest.mark.parametrize("make", [gated_model, stock_model])
def test_windows_are_counted_and_lengths_past_the_text_are_not_measurable(make):
    model = make()
    results = perplexity_by_context_length(model, stream(100), [8, 30, 100, 101], batch_size=3)
    assert [(r.length, r.windows, r.tokens) for r in results] == [(8, 12, 84), (30, 3, 87), (100, 1, 99), (101, 0, 0)]
    assert all(r.perplexity > 1 for r in results[:3])
    assert results[3].perplexity is None and results[3].mean_nll is None


def test_lengths_beyond_max_position_embeddings_still_run_and_are_flagged():
    model = gated_model()
    assert model.config.max_position_embeddings == 128
    results = perplexity_by_context_length(model, stream(300), [64, 256])
    assert [r.beyond_max_position_embeddings for r in results] == [False, True]
    assert results[1].windows == 1 and math.isfinite(results[1].perplexity)


def test_yarn_changes_the_logits_at_long_positions():
    model = gated_model()
    ids = stream(256)[None]
    with torch.no_grad():
        before = model(input_ids=ids).logits
        apply_rope_scaling(model, "yarn", 4)
        after = model(input_ids=ids).logits
    params = model.config.rope_parameters
    assert (params["rope_type"], params["factor"], params["original_max_position_embeddings"]) == ("yarn", 4.0, 128)
    assert model.model.rotary_emb.rope_type == "yarn"
    assert not torch.allclose(before[0, 200:], after[0, 200:], atol=1e-4)


def moe_models():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from gated_qwen import Qwen3MoeGatedConfig, Qwen3MoeGatedForCausalLM
    from tests.conftest import tiny_moe_config_dict

    keys = {k: v for k, v in tiny_moe_config_dict().items() if k not in ("model_type", "architectures")}
    torch.manual_seed(0)
    yield Qwen3MoeForCausalLM(Qwen3MoeConfig(**keys)).eval()
    torch.manual_seed(0)
    yield Qwen3MoeGatedForCausalLM(Qwen3MoeGatedConfig(**keys, headwise_attn_output_gate=True)).eval()


@pytest.mark.parametrize("index", [0, 1], ids=["stock_moe", "gated_moe"])
def test_moe_models_are_measured_and_scaled_too(index):
    model = list(moe_models())[index]
    ids = stream(300, vocab=320)
    results = perplexity_by_context_length(model, ids, [64, 256])
    assert [(r.windows, r.beyond_max_position_embeddings) for r in results] == [(4, False), (1, True)]
    with torch.no_grad():
        before = model(input_ids=ids[None, :256]).logits
        apply_rope_scaling(model, "yarn", 4)
        after = model(input_ids=ids[None, :256]).logits
    assert not torch.allclose(before[0, 200:], after[0, 200:], atol=1e-4)


def test_with_rope_scaling_copies_the_config_and_refuses_bad_scalings():
    config = tiny_config()
    scaled = with_rope_scaling(config, "yarn", 2)
    assert scaled.rope_parameters["rope_type"] == "yarn" and config.rope_parameters["rope_type"] == "default"
    assert scaled.rope_parameters["rope_theta"] == config.rope_parameters["rope_theta"]
    from gated_qwen.errors import GatedQwenError

    with pytest.raises(GatedQwenError, match="supported are yarn"):
        with_rope_scaling(config, "ntk", 2)
    with pytest.raises(GatedQwenError, match="above 1"):
        with_rope_scaling(config, "yarn", 1)


@pytest.fixture
def arm(tmp_path):
    folder = tmp_path / "arm"
    write_released_checkpoint(folder, gate="headwise", vocab_size=300)
    write_tiny_tokenizer(folder)
    text = tmp_path / "text.txt"
    text.write_text("The gate scales each head's attention output. Hello world. " * 30)
    return folder, text


def digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_analyze_reports_perplexity_by_length_with_yarn_and_leaves_the_checkpoint(arm, tmp_path, capsys):
    import json

    folder, text = arm
    before = digests(folder)
    out = tmp_path / "report"
    argv = ["analyze", str(folder), "--text", str(text), "--out", str(out), "--no-plots", "--max-tokens", "16"]
    assert main([*argv, "--context-lengths", "32,200,100000", "--rope-scaling", "yarn:4"]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "analysis.json").read_text())
    lengths = next(iter(report["models"].values()))["context_lengths"]
    assert lengths["rope_parameters"]["rope_type"] == "yarn" and lengths["max_position_embeddings"] == 128
    rows = {r["length"]: r for r in lengths["lengths"]}
    assert rows[32]["windows"] > 1 and rows[200]["beyond_max_position_embeddings"]
    assert rows[100000]["perplexity"] is None
    assert "length" in printed and "windows" in printed and "not measurable" in printed
    line_200 = next(line for line in printed.splitlines() if line.split()[1:2] == ["200"])
    assert line_200.rstrip().endswith("*") and f"{rows[200]['perplexity']:.2f}" in line_200
    assert "* longer than max_position_embeddings (128)" in printed
    assert digests(folder) == before

    # the same run without scaling gives other perplexities past the trained length
    plain = tmp_path / "plain"
    assert main([*argv[:-5], "--out", str(plain), "--no-plots", "--context-lengths", "200"]) == 0
    capsys.readouterr()
    unscaled = json.loads((plain / "analysis.json").read_text())
    ppl = next(iter(unscaled["models"].values()))["context_lengths"]["lengths"][0]["perplexity"]
    assert ppl != pytest.approx(rows[200]["perplexity"], rel=1e-6)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--context-lengths", "256,abc"], "'abc' is not an integer"),
        (["--context-lengths", "0,512"], "0 is not a context length"),
        (["--context-lengths", "-5"], "is not a context length"),
        (["--context-lengths", "64", "--rope-scaling", "ntk:2"], "unknown RoPE scaling 'ntk': supported are yarn"),
        (["--context-lengths", "64", "--rope-scaling", "yarn:1"], "factor must be above 1"),
        (["--context-lengths", "64", "--rope-scaling", "yarn"], "is not TYPE:FACTOR"),
    ],
)
def test_analyze_refuses_bad_lengths_and_scalings_in_one_line(arm, tmp_path, capsys, extra, message):
    folder, text = arm
    out = tmp_path / "report"
    with pytest.raises(SystemExit) as stop:
        main(["analyze", str(folder), "--text", str(text), "--out", str(out), *extra])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("gated-qwen analyze: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert message in err
    assert not out.exists()


def test_analyze_refuses_context_lengths_without_text(arm, tmp_path, capsys):
    folder, _ = arm
    out = tmp_path / "report"
    assert main(["analyze", str(folder), "--prompt", "Hello", "--out", str(out), "--context-lengths", "64"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--context-lengths needs --text" in err and "Traceback" not in err
    assert not out.exists()
