"""The benchmark's machinery on a tiny config: it runs, writes its files, and its numbers follow from its
measurements. Nothing here asserts a speed; the targets are checked by reading the benchmark's output."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from gated_qwen.cli import main
from gated_qwen.cli.bench import check_targets
from gated_qwen.tools.benchmark.measure import (
    BenchmarkOptions,
    build_arms,
    interleaved,
    paired_ratio,
    time_decode,
)


TINY = ["--size", "tiny", "--repeats", "1", "--prompt-length", "8", "--new-tokens", "3", "--threads", "1"]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """One full tiny run through the CLI: models, loading and conversion."""
    root = tmp_path_factory.mktemp("bench")
    out, scratch = root / "out", root / "scratch"
    status = main(["bench", *TINY, "--batch-sizes", "1", "2", "--output-dir", str(out), "--scratch-dir", str(scratch)])
    return status, out, scratch, json.loads((out / "benchmark.json").read_text())


@pytest.mark.slow
def test_cli_writes_markdown_and_json_and_cleans_its_scratch(bench_run, capsys):
    status, out, scratch, result = bench_run
    assert status == 0
    markdown = (out / "benchmark.md").read_text()
    assert "| transformers Qwen3ForCausalLM |" in markdown and "| Qwen3Gated elementwise |" in markdown
    assert "prefill b2 tokens/s" in markdown and "decode b1 tokens/s" in markdown
    assert "convert_checkpoint (headwise)" in markdown and "from_pretrained" in markdown
    assert f"Command: `{result['command']}`" in markdown
    assert result["command"].startswith("gated-qwen bench --size tiny --batch-sizes 1 2 --prompt-length 8")
    assert list(scratch.iterdir()) == []  # the checkpoints lived in a temporary folder inside it
    assert not list(out.glob(".*partial"))


def test_model_numbers_follow_from_the_measured_seconds(bench_run):
    result = bench_run[3]
    models, arch = result["models"], result["architecture"]
    assert set(models["workloads"]) == {"prefill_b1", "prefill_b2", "decode_b1"}
    for workload, numbers in models["workloads"].items():
        seconds = numbers["seconds"]
        assert set(seconds) == {"qwen3", "none", "headwise", "elementwise"}
        assert all(len(times) == 1 and times[0] > 0 for times in seconds.values())  # 1 round kept, warm-up dropped
        tokens = {"prefill_b1": 8, "prefill_b2": 16, "decode_b1": 1}[workload]
        for arm, times in seconds.items():
            assert numbers["tokens_per_second"][arm] == pytest.approx(tokens / statistics.median(times))
            assert numbers["time_ratio_to_none"][arm] == pytest.approx(times[0] / seconds["none"][0])
        assert numbers["none_time_ratio_to_qwen3"] == pytest.approx(seconds["none"][0] / seconds["qwen3"][0])

    parameters = models["parameters"]
    layers, heads, head_dim, hidden = (
        arch[k] for k in ("num_hidden_layers", "num_attention_heads", "head_dim", "hidden_size")
    )
    assert parameters["qwen3"] == parameters["none"]
    assert parameters["headwise"] - parameters["none"] == layers * heads * hidden  # one gate row per head
    assert parameters["elementwise"] - parameters["none"] == layers * heads * head_dim * hidden


def test_targets_compare_measurements_with_the_issue_limits(bench_run):
    result = bench_run[3]
    targets = {row["target"]: row for row in result["targets"]}
    parameters = result["models"]["parameters"]
    decode = result["models"]["workloads"]["decode_b1"]
    row = targets["decode_b1: elementwise time / none time"]
    assert row["measured"] == decode["time_ratio_to_none"]["elementwise"]
    assert row["limit"] == pytest.approx(parameters["elementwise"] / parameters["none"] + 0.02)
    assert tuple(row["quartiles"]) == tuple(decode["time_ratio_quartiles_to_none"]["elementwise"])
    assert targets["conversion time / copy time"]["quartiles"] is None
    assert targets["decode_b1: headwise time / none time"]["limit"] == pytest.approx(1.02)
    # prefill's compute grows with the decoder layers' weights only: the embedding is a lookup
    layers = result["models"]["layer_parameters"]
    assert layers["elementwise"] - layers["none"] == parameters["elementwise"] - parameters["none"]
    assert layers["none"] < parameters["none"]
    assert targets["prefill_b1: elementwise time / none time"]["limit"] == pytest.approx(
        layers["elementwise"] / layers["none"] + 0.02
    )
    assert all(row["met"] == (row["measured"] <= row["limit"]) for row in result["targets"])
    assert len(targets) == 3 * 3 + 2
    # recomputed from the stored measurements, the same rows come out
    assert check_targets({k: result[k] for k in ("models", "conversion")}) == result["targets"]


def test_loading_and_conversion_are_measured_on_real_checkpoints(bench_run):
    result = bench_run[3]
    loading, conversion = result["loading"], result["conversion"]
    assert loading["bytes"]["qwen3"] > 0 and loading["bytes"]["headwise"] > loading["bytes"]["qwen3"]
    assert loading["time_ratio_to_qwen3"] == pytest.approx(
        loading["seconds"]["headwise"][0] / loading["seconds"]["qwen3"][0]
    )
    # the gated checkpoint adds H gate rows per layer to the stock one
    arch = result["architecture"]
    gate_bytes = arch["num_hidden_layers"] * arch["num_attention_heads"] * arch["hidden_size"] * 4
    assert conversion["written_bytes"] - gate_bytes == pytest.approx(conversion["source_bytes"], rel=0.05)
    assert conversion["megabytes_per_second"]["convert"] == pytest.approx(
        conversion["written_bytes"] / 1e6 / conversion["median_seconds"]["convert"]
    )
    assert conversion["largest_tensor_bytes"] == arch["vocab_size"] * arch["hidden_size"] * 4  # the embedding
    # Each child's own peak (ru_maxrss from wait4 would report this process's peak for both): the copy
    # holds nothing beyond its imports, sendfile never brings the bytes into the process.
    assert abs(conversion["peak_rss"]["copy"] - conversion["import_only_peak_rss"]) < 32 * 2**20
    assert conversion["peak_rss"]["convert"] >= conversion["import_only_peak_rss"]


def test_existing_results_are_not_overwritten_unless_asked(tmp_path, capsys):
    (tmp_path / "benchmark.md").write_text("earlier run")
    assert main(["bench", *TINY, "--skip", "loading", "--skip", "conversion", "--output-dir", str(tmp_path)]) == 2
    assert "already holds benchmark.md; pass --overwrite" in capsys.readouterr().err
    assert (tmp_path / "benchmark.md").read_text() == "earlier run"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "num_hidden_layer=3"], "num_hidden_layer: not a Qwen3 config key"),
        (["--set", "num_hidden_layers"], "is not KEY=VALUE"),
        (["--set", 'num_hidden_layers="two"'], "not a valid config"),
        (["--repeats", "0"], "repeats must be at least 1"),
        (["--new-tokens", "1"], "new tokens must be at least 2"),
        (["--gate-position", "dense_output"], "headwise"),  # the default arms include headwise: no heads after o_proj
        pytest.param(
            ["--device", "cuda"],
            "torch sees no CUDA device",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="has CUDA"),
        ),
    ],
)
def test_bad_arguments_fail_with_one_line(tmp_path, capsys, args, message):
    status = main(["bench", *TINY, "--skip", "loading", "--skip", "conversion", "--output-dir", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith("gated-qwen bench: error: ") and message in err and "Traceback" not in err
    assert not (tmp_path / "benchmark.json").exists()


def test_an_invalid_architecture_is_one_line_that_keeps_its_cause():
    """The library raises the one-line message from the validation error, which a Python caller can still read."""
    from huggingface_hub.errors import StrictDataclassError

    from gated_qwen.errors import GatedQwenError
    from gated_qwen.tools.benchmark.measure import run_benchmark

    with pytest.raises(GatedQwenError, match="not a valid config") as caught:
        run_benchmark(BenchmarkOptions(size="tiny", overrides={"num_hidden_layers": "two"}))
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value.__cause__, (StrictDataclassError, TypeError, ValueError))


def test_interleaved_rotates_the_order_and_drops_the_warm_up_round():
    calls = []

    def measure(name):
        calls.append(name)
        return float(len(calls))

    times = interleaved({"a": "a", "b": "b", "c": "c"}, measure, repeats=2)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert times == {"a": [6.0, 8.0], "b": [4.0, 9.0], "c": [5.0, 7.0]}
    assert paired_ratio(times, "b", "a") == pytest.approx(statistics.median([4 / 6, 9 / 8]))


def test_arms_share_weights_and_decode_is_timed_over_cached_steps():
    arms = build_arms(BenchmarkOptions(size="tiny"))
    stock, none = arms["qwen3"].state_dict(), arms["none"].state_dict()
    assert stock.keys() == none.keys() and all(stock[k].equal(none[k]) for k in stock)
    assert type(arms["qwen3"]).__name__ == "Qwen3ForCausalLM"
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():  # same weights, no gate: the same computation
        torch.testing.assert_close(arms["none"](ids).logits, arms["qwen3"](ids).logits, rtol=0, atol=1e-6)
    q_rows = {
        gate: arms[gate].model.layers[0].self_attn.q_proj.out_features for gate in ("none", "headwise", "elementwise")
    }
    assert q_rows == {"none": 64, "headwise": 68, "elementwise": 128}  # H*D, +H, x2
    assert time_decode(arms["headwise"], ids, new_tokens=3) > 0


def test_decode_time_is_the_median_step(monkeypatch):
    """One stretched step (an interrupt, a page fault) does not move a run's per-token time."""
    import gated_qwen.tools.benchmark.measure as benchmark

    clock = iter([0.0, 10.0, 11.0, 12.0, 20.0])  # prompt, then four tokens: steps of 1, 1 and 8 seconds
    monkeypatch.setattr(benchmark.time, "perf_counter", lambda: next(clock))

    class FakeModel:
        def generate(self, input_ids, generation_config, streamer):
            for _ in range(generation_config.max_new_tokens + 1):
                streamer.put(None)
            return torch.zeros(1, input_ids.shape[1] + generation_config.max_new_tokens, dtype=torch.long)

    assert time_decode(FakeModel(), torch.tensor([[1, 2]]), new_tokens=4) == 1.0


def test_size_1b_is_the_released_architecture_from_configs():
    from gated_qwen.tools.benchmark.measure import architecture

    arch = architecture(BenchmarkOptions(size="1b", overrides={"num_hidden_layers": 2}))
    assert {
        k: arch[k]
        for k in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
        )
    } == {
        "vocab_size": 152064,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
    }
    assert arch["num_hidden_layers"] == 2 and arch["tie_word_embeddings"] is True


def test_a_gate_variant_reaches_every_arm_the_loader_and_the_converter(tmp_path):
    """--gate and --gate-* through the CLI: the arms asked for, built as the variant, and the converter given it."""
    out = tmp_path / "out"
    variant = ["--gate-position", "value", "--gate-activation", "silu", "--gate-combination", "additive"]
    status = main(["bench", *TINY, "--gate", "elementwise", *variant, "--output-dir", str(out)])
    assert status == 0
    result = json.loads((out / "benchmark.json").read_text())
    assert result["options"]["gates"] == ["elementwise"]
    assert set(result["models"]["workloads"]["decode_b1"]["seconds"]) == {"qwen3", "none", "elementwise"}
    # a value gate's own projection: one score per kv-head channel, from the hidden state, in each layer
    arch = result["architecture"]
    g_proj = arch["num_hidden_layers"] * arch["hidden_size"] * arch["num_key_value_heads"] * arch["head_dim"]
    assert result["parameters"]["elementwise"] - result["parameters"]["none"] == g_proj
    assert result["loading"]["gate"] == "elementwise"
    converter = {"gate": "elementwise", "init": "identity", "gate_position": "value", "gate_activation": "silu"}
    assert result["conversion"]["converter"] == {**converter, "gate_combination": "additive"}
    assert [row["target"] for row in result["targets"]][:1] == ["prefill_b1: elementwise time / none time"]
    assert (
        "--gate elementwise --gate-position value --gate-activation silu --gate-combination additive"
        in (result["command"])
    )
    assert "| Qwen3Gated elementwise (value, silu, additive) |" in (out / "benchmark.md").read_text()


def test_build_arms_gives_the_gated_arms_the_variant_and_the_no_gate_arm_none():
    arms = build_arms(BenchmarkOptions(size="tiny", gates=("headwise",), gate_variant={"gate_position": "key"}))
    assert list(arms) == ["qwen3", "none", "headwise"]
    assert arms["headwise"].config.gate_position == "key" and arms["none"].config.gate_position == "sdpa_output"
    assert hasattr(arms["headwise"].model.layers[0].self_attn, "g_proj")


def test_the_paper_rows_reach_the_gated_arms_and_not_the_no_gate_arm():
    variant = {"gate_input": "none", "attn_output_transform": "rmsnorm", "sandwich_norm": True}
    arms = build_arms(BenchmarkOptions(size="tiny", gates=("headwise",), gate_variant=variant))
    layer, plain = arms["headwise"].model.layers[0], arms["none"].model.layers[0]
    assert layer.self_attn.gate_logits.shape[-1] == 1 and not hasattr(layer.self_attn, "g_proj")
    assert hasattr(layer, "mlp_output_layernorm") and hasattr(layer.self_attn, "attn_output_transform")
    assert not hasattr(plain, "mlp_output_layernorm") and not hasattr(plain.self_attn, "attn_output_transform")


def test_the_converter_step_writes_the_variant_it_is_given(tmp_path):
    """The child process converts with the options it is passed (JSON on its command line)."""
    from gated_qwen.tools.benchmark.child import run_step
    from gated_qwen.tools.benchmark.measure import architecture, stock_model

    stock = tmp_path / "stock"
    stock_model(architecture(BenchmarkOptions(size="tiny"))).save_pretrained(stock)
    options = {"gate": "headwise", "init": "random", "gate_activation": "silu"}  # no identity: random init
    outcome = run_step("convert", str(stock), str(tmp_path / "gated"), options)
    config = json.loads((tmp_path / "gated" / "config.json").read_text())
    assert outcome["bytes"] > 0
    assert (config["gate_type"], config["gate_activation"]) == ("headwise", "silu")
