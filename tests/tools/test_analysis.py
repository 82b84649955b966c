import json
import math

import pytest
import torch
from conftest import tiny_config, write_released_checkpoint, write_tiny_tokenizer
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from gated_qwen import Qwen3GatedForCausalLM
from gated_qwen.cli import main
from gated_qwen.errors import GatedQwenError
from gated_qwen.models.layout import gate_dim, split_query_and_gate
from gated_qwen.tools.analysis.gates import override_gates, record_gates, summarize_gates
from gated_qwen.tools.analysis.perplexity import perplexity
from gated_qwen.tools.analysis.sinks import (
    attention_sink,
    first_token_attention,
    massive_activations,
    record_attention,
)


def ids(batch=2, length=9, vocab=96, seed=0):
    return torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def attention_input(model, layer, inputs):
    captured = []
    handle = model.model.layers[layer].self_attn.q_proj.register_forward_pre_hook(lambda m, a: captured.append(a[0]))
    with torch.no_grad():
        model(inputs)
    handle.remove()
    return captured[0]  # (B, T, hidden)


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_recorded_gates_are_sigmoid_of_the_written_gate_rows(released_checkpoint, gate):
    folder, spec = released_checkpoint(gate=gate, qkv_bias=True, gate_scale=3.0)
    model = Qwen3GatedForCausalLM.from_pretrained(folder).eval()
    inputs = ids()
    with torch.no_grad():
        plain = model(inputs).logits
    with torch.no_grad(), record_gates(model) as record:
        recorded = model(inputs).logits
    assert torch.equal(plain, recorded)  # recording leaves the outputs as they are
    assert record.layers == [0, 1]
    for layer, rows in enumerate(spec["layers"]):
        x = attention_input(model, layer, inputs).flatten(0, 1)  # (B*T, hidden)
        by_hand = torch.stack(
            [torch.sigmoid(x @ rows["gate_rows"][h].T + rows["gate_bias"][h]) for h in range(4)], dim=1
        )  # (B*T, H, g)
        torch.testing.assert_close(record.gates(layer), by_hand)
        assert record.token_positions(layer).tolist() == list(range(9)) * 2


def test_gates_recorded_during_generate_with_positions(released_checkpoint):
    folder, _ = released_checkpoint(gate="headwise", gate_scale=3.0)
    model = Qwen3GatedForCausalLM.from_pretrained(folder).eval()
    prompt = ids(batch=1, length=5)
    with record_gates(model) as record:
        out = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(out, model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0))
    # the last new token is never fed back: 5 prompt tokens + 3 steps
    assert record.token_positions(0).tolist() == list(range(8))
    summary = summarize_gates(record)
    layer = summary["layers"][0]
    gates = record.gates(0)
    assert layer["first_token"]["mean"] == pytest.approx(gates[0].mean().item())
    assert layer["rest"]["mean"] == pytest.approx(gates[1:].mean().item())
    assert layer["below_0.5"] == pytest.approx((gates < 0.5).float().mean().item())
    assert layer["heads"][2]["median"] == pytest.approx(gates[:, 2].median().item())
    assert sum(layer["histogram"]) == gates.numel()
    assert 0 < summary["overall"]["below_0.5"] < 1


def without_gate(model):
    """The same weights in a gate "none" model: q_proj keeps only its query rows."""
    config = model.config
    ungated = Qwen3GatedForCausalLM(tiny_config(gate="none", qkv_bias=config.qkv_bias)).eval()
    state = model.state_dict()
    g = gate_dim(config.gate_type, config.head_dim)
    for key in [k for k in state if "q_proj" in k]:
        query, _ = split_query_and_gate(state[key], config.num_key_value_heads, config.head_dim, g, dim=0)
        state[key] = query.flatten(0, 2)
    ungated.load_state_dict(state)
    return ungated


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_constant_one_override_equals_the_ungated_model(released_checkpoint, gate):
    folder, _ = released_checkpoint(gate=gate, qkv_bias=True, gate_scale=3.0)
    model = Qwen3GatedForCausalLM.from_pretrained(folder).eval()
    ungated = without_gate(model)
    inputs = ids()
    with torch.no_grad():
        reference = ungated(inputs).logits
        gated = model(inputs).logits
        with override_gates(model, 1.0):
            overridden = model(inputs).logits
        after = model(inputs).logits
    assert not torch.allclose(gated, reference, atol=1e-3)  # the gate matters in this model
    torch.testing.assert_close(overridden, reference, rtol=1e-6, atol=1e-6)
    assert torch.equal(after, gated)
    assert all(layer.self_attn.gate_override is None for layer in model.model.layers)


def test_override_selects_layers_and_heads_and_restores_on_error(released_checkpoint):
    folder, _ = released_checkpoint(gate="headwise", gate_scale=3.0)
    model = Qwen3GatedForCausalLM.from_pretrained(folder).eval()
    inputs = ids()
    o_proj = model.model.layers[1].self_attn.o_proj
    seen = []
    handle = o_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].unflatten(-1, (4, 8))))  # (B, T, H, D)
    with torch.no_grad():
        model(inputs)
        with override_gates(model, 0.0, layers=[1], heads=[2]):
            model(inputs)
        with override_gates(model, scale=0.5, heads=torch.tensor([[0, 0, 0, 0], [1, 0, 0, 0]])):
            model(inputs)
        with override_gates(model, lambda gate, layer: gate.clamp(min=0.9)):
            model(inputs)
    handle.remove()
    plain, closed, scaled, clamped = seen
    assert torch.equal(closed[:, :, 2], torch.zeros_like(closed[:, :, 2]))
    assert torch.equal(closed[:, :, [0, 1, 3]], plain[:, :, [0, 1, 3]])
    torch.testing.assert_close(scaled[:, :, 0], plain[:, :, 0] * 0.5)
    assert torch.equal(scaled[:, :, 1:], plain[:, :, 1:])
    assert not torch.equal(clamped, plain)
    with pytest.raises(RuntimeError), override_gates(model, 0.0):
        raise RuntimeError("inside")
    assert all(layer.self_attn.gate_override is None for layer in model.model.layers)
    with pytest.raises(GatedQwenError, match="layers \\[5\\]"), override_gates(model, 0.0, layers=[5]):
        pass
    with pytest.raises(GatedQwenError, match="head 7"), override_gates(model, 0.0, heads=[7]):
        pass
    baseline = Qwen3GatedForCausalLM(tiny_config(gate="none"))
    with pytest.raises(GatedQwenError, match="gated model"), override_gates(baseline, 0.0):
        pass


def test_first_token_attention_on_hand_built_patterns():
    on_first = torch.zeros(2, 3, 6, 6)
    on_first[..., 0] = 1.0
    assert torch.equal(first_token_attention(on_first), torch.ones(3))
    uniform = (torch.tril(torch.ones(6, 6)) / torch.arange(1, 7)[:, None]).expand(2, 3, 6, 6)
    expected = sum(1 / (i + 1) for i in range(6)) / 6
    torch.testing.assert_close(first_token_attention(uniform), torch.full((3,), expected))
    skipped = sum(1 / (i + 1) for i in range(2, 6)) / 4
    torch.testing.assert_close(first_token_attention(uniform, skip_first=2), torch.full((3,), skipped))
    # left padding by two: the first real token is key 2, padded queries are left out
    padded = torch.zeros(1, 1, 6, 6)
    padded[0, 0, 2:, 2:] = torch.tril(torch.ones(4, 4)) / torch.arange(1, 5)[:, None]
    padded[0, 0, :2, 0] = 1.0
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
    torch.testing.assert_close(
        first_token_attention(padded, attention_mask=mask), torch.tensor([(1 + 1 / 2 + 1 / 3 + 1 / 4) / 4])
    )
    with pytest.raises(GatedQwenError, match="no query"):
        first_token_attention(uniform, skip_first=6)


def stock_qwen3():
    torch.manual_seed(0)
    config = tiny_config(gate="none")
    stock = Qwen3Config(**{k: v for k, v in config.to_dict().items() if k in Qwen3Config.__dataclass_fields__})
    return Qwen3ForCausalLM(stock).eval()


@pytest.mark.parametrize("make", [stock_qwen3, lambda: Qwen3GatedForCausalLM(tiny_config(gate="headwise")).eval()])
def test_attention_sink_matches_transformers_output_attentions(make):
    model = make()
    inputs = ids()
    sink = attention_sink(model, inputs, skip_first=1)
    assert model.config._attn_implementation == "sdpa"  # switched back after
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(inputs, output_attentions=True).attentions
    expected = torch.stack([first_token_attention(a, skip_first=1) for a in attentions])
    torch.testing.assert_close(sink, expected)
    assert sink.shape == (2, 4)
    with torch.no_grad(), record_attention(model, map_layers=[1]) as record:
        model(inputs)
    torch.testing.assert_close(record.maps[1], attentions[1][0].mean(0))


def test_massive_activations_finds_a_planted_outlier():
    model = stock_qwen3()
    inputs = ids(batch=1)
    with torch.no_grad():
        model.model.embed_tokens.weight[inputs[0, 3], 5] = 500.0  # rides the residual stream through every layer
        hidden = model(inputs, output_hidden_states=True).hidden_states
    rows = massive_activations(model, inputs)
    assert [r["layer"] for r in rows] == [0, 1]
    assert rows[0]["max_abs"] == pytest.approx(hidden[1].abs().max().item())
    assert rows[0]["median_abs"] == pytest.approx(hidden[1].abs().median().item())
    assert (rows[0]["token"], rows[0]["channel"]) == (3, 5)
    assert rows[0]["ratio"] > 100


def nll_by_hand(model, stream, context, stride):
    """The NLL of each token t >= 1 from the window that scores it, one forward per token."""
    total, n = 0.0, len(stream)
    ends = [min(context, n)]
    while ends[-1] < n:
        ends.append(min(ends[-1] + stride, n))
    for t in range(1, n):
        end = next(e for e in ends if t < e)
        begin = max(0, end - context)
        with torch.no_grad():
            logits = model(stream[begin:end][None]).logits[0]
        total -= torch.log_softmax(logits[t - 1 - begin], -1)[stream[t]].item()
    return total / (n - 1)


def test_perplexity_is_exp_of_the_mean_token_nll():
    torch.manual_seed(0)
    model = Qwen3GatedForCausalLM(tiny_config(gate="headwise")).eval()
    stream = ids(batch=1, length=23)[0]
    with torch.no_grad():
        logits = model(stream[None]).logits[0]
    full_nll = -torch.log_softmax(logits[:-1], -1).gather(-1, stream[1:, None]).mean().item()
    whole = perplexity(model, stream, context=32, progress=False)
    assert whole.tokens == 22 and whole.windows == 1
    assert whole.perplexity == pytest.approx(math.exp(full_nll), rel=1e-5)
    windowed = perplexity(model, stream, context=8, stride=3, batch_size=2, progress=False)
    assert windowed.tokens == 22 and windowed.windows == 6  # 7 tokens, then 15 in steps of 3
    assert windowed.mean_nll == pytest.approx(nll_by_hand(model, stream, 8, 3), rel=1e-5)
    one_by_one = perplexity(model, stream, context=8, stride=3, batch_size=1, progress=False)
    assert one_by_one.mean_nll == pytest.approx(windowed.mean_nll, rel=1e-6)
    assert windowed.mean_nll != pytest.approx(whole.mean_nll, rel=1e-4)
    with pytest.raises(GatedQwenError, match="smaller than the context"):
        perplexity(model, stream, context=8, stride=8)


@pytest.fixture
def two_arms(tmp_path):
    folders = []
    for gate in ("none", "headwise"):
        folder = tmp_path / gate
        write_released_checkpoint(folder, gate=gate, vocab_size=300, gate_scale=3.0)
        write_tiny_tokenizer(folder)
        folders.append(folder)
    return folders


def test_analyze_command_writes_json_and_figures(two_arms, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the figures need the plot extra")
    baseline, headwise = two_arms
    out = tmp_path / "report"
    text = tmp_path / "text.txt"
    text.write_text("The gate scales each head's attention output. Hello world. " * 4)
    argv = [
        "analyze",
        str(headwise),
        "--text",
        str(text),
        "--compare",
        str(baseline),
        "--out",
        str(out),
        "--layers",
        "0",
        "1",
        "--context",
        "16",
        "--stride",
        "8",
    ]
    assert main(argv) == 0
    report = json.loads((out / "analysis.json").read_text())
    arms = report["models"]
    assert list(arms) == ["headwise", "none"]
    assert report["arguments"]["context"] == 16 and report["arguments"]["compare"] == [str(baseline)]
    assert arms["headwise"]["gate_type"] == "headwise" and arms["none"]["gates"] is None
    assert len(arms["headwise"]["gates"]["layers"]) == 2
    assert len(arms["none"]["first_token_attention"]["per_layer_and_head"]) == 2
    assert arms["none"]["perplexity"]["tokens"] == arms["headwise"]["perplexity"]["tokens"] > 16
    assert sorted(report["figures"]) == ["attention_maps.png", "first_token_attention.png", "gate_histograms.png"]
    import matplotlib.image

    # attention maps: 2 models (rows) x 2 layers (columns), 4 inches each at 100 dpi
    assert matplotlib.image.imread(out / "attention_maps.png").shape[:2] == (800, 800)
    assert matplotlib.image.imread(out / "first_token_attention.png").shape[:2] == (500, 800)
    table = capsys.readouterr().out
    assert "headwise" in table and "first-token attn" in table

    # never overwrites unless asked; nothing is left half-written
    assert main(argv) == 2
    assert "is not empty; choose another folder or pass --overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):  # --text and --prompt exclude each other (argparse)
        main([*argv, "--prompt", "x"])
    assert main([*argv, "--overwrite", "--no-plots"]) == 0
    assert json.loads((out / "analysis.json").read_text())["figures"] == []
    assert not (out / "attention_maps.png").exists()  # the old folder was replaced as a whole
    assert (
        main(["analyze", str(headwise), "--prompt", "Hello world", "--out", str(tmp_path / "bad"), "--layers", "9"])
        == 2
    )
    assert "--layers [9]" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    assert (
        main(["analyze", str(headwise), "--prompt", "Hi", "--out", str(tmp_path / "x"), "--subfolder", "a", "b"]) == 2
    )
    assert "--subfolder" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path / "missing"), "--prompt", "Hi", "--out", str(tmp_path / "x")]) == 2
    assert "missing does not exist" in capsys.readouterr().err


def test_analyze_without_matplotlib_says_what_to_install(two_arms, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["analyze", str(two_arms[1]), "--prompt", "Hello world", "--out", str(tmp_path / "o")]) == 2
    assert "gated-qwen[plot]" in capsys.readouterr().err
    assert (
        main(
            ["analyze", str(two_arms[1]), "--prompt", "Hello world hello", "--out", str(tmp_path / "o"), "--no-plots"]
        )
        == 0
    )
    assert json.loads((tmp_path / "o" / "analysis.json").read_text())["figures"] == []


def test_analyze_a_released_arm_as_downloaded(tmp_path, capsys):
    """qwen2 label, pytorch_model.bin, Qwen's tokenizer (no BOS): analyze loads it and measures every gate."""
    from conftest import write_released_arm

    arm = tmp_path / "1B_gate_elementwise"
    write_released_arm(arm, gate="elementwise", gate_scale=3.0)
    assert (
        main(
            [
                "analyze",
                str(arm),
                "--prompt",
                "The gate scales each head. Hello world.",
                "--out",
                str(tmp_path / "o"),
                "--no-plots",
                "--context",
                "8",
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "o" / "analysis.json").read_text())["models"]["1B_gate_elementwise"]
    assert report["gate_type"] == "elementwise" and len(report["gates"]["layers"]) == 2
    tokens = len(AutoTokenizer.from_pretrained(arm)("The gate scales each head. Hello world.")["input_ids"])
    assert report["gates"]["overall"]["count"] == 2 * 4 * 8 * tokens  # layers x heads x head_dim x tokens
    assert 0 < report["gates"]["overall"]["mean"] < 1


class Payload:
    """Unpickling this runs code: it makes the folder it names."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        import os

        return (os.mkdir, (self.path,))


def test_analyze_refuses_a_malicious_bin_in_one_line(two_arms, tmp_path, capsys):
    arm = two_arms[1]
    state = torch.load(arm / "pytorch_model.bin", weights_only=True)
    torch.save({**state, "model.norm.weight": Payload(tmp_path / "payload-ran")}, arm / "pytorch_model.bin")
    assert main(["analyze", str(arm), "--prompt", "Hello world", "--out", str(tmp_path / "o"), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (message,) = [line for line in err.splitlines() if line.startswith("gated-qwen analyze: error:")]
    assert "pytorch_model.bin holds a pickle that is not plain tensors" in message and "posix.mkdir" in message
    assert not (tmp_path / "payload-ran").exists() and not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "option, value", [("--batch-size", "0"), ("--batch-size", "-1"), ("--max-tokens", "0"), ("--context", "1")]
)
def test_analyze_refuses_out_of_range_numbers_in_one_line(two_arms, tmp_path, capsys, option, value):
    out = tmp_path / "report"
    with pytest.raises(SystemExit) as stop:  # refused by argparse, before anything loads
        main(["analyze", str(two_arms[1]), "--prompt", "Hello world", "--out", str(out), option, value])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("gated-qwen analyze: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert f"argument {option}: {value} is out of range: it must be at least" in err
    assert not out.exists()


def test_analyze_a_folder_without_tokenizer_says_the_tokenizer_is_missing(tmp_path, capsys):
    weights_only = tmp_path / "weights_only"
    write_released_checkpoint(weights_only, vocab_size=320)
    assert (
        main(["analyze", str(weights_only), "--prompt", "Hello world", "--no-plots", "--out", str(tmp_path / "out")])
        == 2
    )
    err = capsys.readouterr().err
    assert "has no tokenizer files: it needs tokenizer.json" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------- the gate design space


def variant_model(**variant):
    from gated_qwen import Qwen3GatedConfig

    torch.manual_seed(0)
    config = Qwen3GatedConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, **variant,
    )  # fmt: skip
    model = Qwen3GatedForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.g_proj.weight.normal_(0, 0.5)
    return model


@pytest.mark.parametrize(
    "variant,heads,width",
    [
        ({"gate_type": "headwise", "gate_position": "value"}, 2, 1),  # per kv head
        ({"gate_type": "elementwise", "gate_position": "query", "gate_activation": "silu"}, 4, 8),
        ({"gate_type": "elementwise", "gate_shared_across_heads": True}, 1, 8),
        ({"gate_type": "elementwise", "gate_position": "dense_output"}, 1, 32),
    ],
)
def test_recorded_gates_of_every_variant_are_its_activation_of_g_proj(variant, heads, width):
    model = variant_model(**variant)
    inputs = ids()
    with record_gates(model) as record:
        with torch.no_grad():
            model(inputs)
    x = attention_input(model, 1, inputs)
    activation = torch.sigmoid if model.config.gate_activation == "sigmoid" else torch.nn.functional.silu
    expected = activation(model.model.layers[1].self_attn.g_proj(x)).reshape(-1, heads, width)
    assert record.gates(1).shape == (inputs.numel(), heads, width)
    torch.testing.assert_close(record.gates(1), expected.detach())
    summary = summarize_gates(record)
    assert len(summary["layers"][1]["heads"]) == heads
    assert summary["layers"][1]["below_0.5"] == pytest.approx((expected < 0.5).float().mean().item())


def test_an_input_independent_gate_is_recorded_as_the_same_scores_at_every_token():
    from gated_qwen import Qwen3GatedConfig

    config = Qwen3GatedConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, gate_type="headwise", gate_input="none",
    )  # fmt: skip
    model = Qwen3GatedForCausalLM(config).eval()
    with torch.no_grad():
        model.model.layers[1].self_attn.gate_logits.copy_(torch.tensor([[-1.0], [0.0], [1.0], [2.0]]))
    inputs = ids()
    with record_gates(model) as record:
        with torch.no_grad():
            model(inputs)
    expected = torch.sigmoid(torch.tensor([-1.0, 0.0, 1.0, 2.0])).view(1, 4, 1).expand(inputs.numel(), 4, 1)
    torch.testing.assert_close(record.gates(1), expected)
    assert summarize_gates(record)["layers"][1]["below_0.5"] == pytest.approx(0.25)


def test_overriding_a_value_gate_changes_the_model_as_zero_values_would():
    model = variant_model(gate_type="headwise", gate_position="value")
    inputs = ids()
    with torch.no_grad(), override_gates(model, 0.0, layers=[0], heads=[1]):
        ablated = model(inputs).logits
    # the same as a model whose second kv head's values are zero in layer 0
    attention = model.model.layers[0].self_attn
    with torch.no_grad():
        attention.v_proj.weight[8:16] = 0  # (a multiplicative gate keeps zero values zero)
        zeroed = model(inputs).logits
    torch.testing.assert_close(ablated, zeroed)
    with pytest.raises(GatedQwenError, match="head 2 does not exist"):
        with override_gates(model, 0.0, heads=[2]):  # the value gate has one set per kv head (2)
            pass
