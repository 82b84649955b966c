"""``gated-qwen generate`` and gated_qwen.tools.generation, end to end on tiny checkpoints the tests build."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from conftest import write_released_checkpoint, write_tiny_tokenizer
from transformers import AutoTokenizer

from gated_qwen import Qwen3GatedForCausalLM, default_models
from gated_qwen.cli import main
from gated_qwen.tools import generation
from gated_qwen.utils import devices


PROMPTS = ["Hello world", "def add(a, b):\n    return", "The gate"]
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A released-layout headwise arm with a tokenizer in the same folder, as a user would have it."""
    folder = tmp_path_factory.mktemp("generate") / "1B_gate_headwise"
    write_released_checkpoint(folder, vocab_size=320)
    write_tiny_tokenizer(folder)
    return folder


def run_generate(capsys, *args) -> tuple[int, str, str]:
    try:
        code = main(["generate", *map(str, args)])
    except SystemExit as stop:  # a usage error, which argparse has printed
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


def json_records(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def reference_completion(folder: Path, prompt: str, max_new_tokens: int) -> str:
    """Greedy completion computed with transformers directly, one prompt, no padding."""
    model = Qwen3GatedForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    inputs = tokenizer([prompt], return_tensors="pt")
    output = model.generate(
        **inputs, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id
    )
    return tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def test_command_continues_the_prompt_greedily(checkpoint, capsys):
    code, out, err = run_generate(capsys, "--model", checkpoint, "--greedy", "--max-new-tokens", 10, PROMPTS[0])
    assert code == 0, err
    assert out == PROMPTS[0] + reference_completion(checkpoint, PROMPTS[0], 10) + "\n"


def test_json_records_per_prompt(checkpoint, capsys):
    code, out, err = run_generate(capsys, "--model", checkpoint, "--json", "--max-new-tokens", 6, *PROMPTS[:2])
    assert code == 0, err
    records = json_records(out)
    assert [r["prompt"] for r in records] == PROMPTS[:2]
    for record in records:
        assert set(record) == {"prompt", "completion", "new_tokens", "seconds", "tokens_per_second"}
        assert record["completion"] == reference_completion(checkpoint, record["prompt"], 6)
        assert 0 < record["new_tokens"] <= 6
        assert record["tokens_per_second"] == pytest.approx(record["new_tokens"] / record["seconds"], rel=0.01)


def test_batched_greedy_equals_one_prompt_at_a_time(checkpoint, capsys):
    common = ("--model", checkpoint, "--json", "--greedy", "--max-new-tokens", 12, *PROMPTS)
    _, batched_out, _ = run_generate(capsys, "--batch-size", 3, *common)
    _, single_out, _ = run_generate(capsys, "--batch-size", 1, *common)
    batched, single = json_records(batched_out), json_records(single_out)
    assert (
        len({len(generation.load_tokenizer(str(checkpoint))(p)["input_ids"]) for p in PROMPTS}) > 1
    )  # padding happens
    assert [(r["completion"], r["new_tokens"]) for r in batched] == [
        (r["completion"], r["new_tokens"]) for r in single
    ]


def test_seed_reproduces_a_sampled_output(checkpoint, capsys):
    def sample(seed):
        code, out, err = run_generate(
            capsys,
            "--model",
            checkpoint,
            "--json",
            "--max-new-tokens",
            16,
            "--temperature",
            1.5,
            "--seed",
            seed,
            *PROMPTS[:2],
        )
        assert code == 0, err
        return [r["completion"] for r in json_records(out)]

    first = sample(7)
    assert sample(7) == first
    assert sample(8) != first
    assert first[0] != reference_completion(checkpoint, PROMPTS[0], 16)  # it did sample


def test_streaming_prints_the_same_text_as_not_streaming(checkpoint, capsys, monkeypatch):
    puts = []
    original_put = generation.CompletionStreamer.put
    monkeypatch.setattr(
        generation.CompletionStreamer, "put", lambda self, value: puts.append(1) or original_put(self, value)
    )
    args = ("--model", checkpoint, "--max-new-tokens", 12, PROMPTS[1])
    code, streamed, err = run_generate(capsys, *args)
    assert code == 0, err
    assert len(puts) == 1 + 12  # the prompt, then each new token as it came
    puts.clear()
    _, printed, _ = run_generate(capsys, "--no-stream", *args)
    assert not puts
    assert streamed == printed == PROMPTS[1] + reference_completion(checkpoint, PROMPTS[1], 12) + "\n"


def test_stop_string_ends_the_completion(checkpoint, capsys):
    full = reference_completion(checkpoint, PROMPTS[0], 16)
    tokenizer = generation.load_tokenizer(str(checkpoint))
    pieces = [tokenizer.decode([i]) for i in tokenizer(full)["input_ids"]]
    # a complete, printable piece past the start, so that stopping shortens the completion
    stop = next(p for p in pieces[2:] if p.strip() and p.isascii() and p.isprintable())
    expected = full[: full.index(stop) + len(stop)]
    args = ("--model", checkpoint, "--max-new-tokens", 16, "--stop", stop, PROMPTS[0])
    code, out, err = run_generate(capsys, "--json", *args)
    assert code == 0, err
    (record,) = json_records(out)
    assert record["completion"] == expected and len(expected) < len(full)
    assert record["new_tokens"] < 16, (stop, record)
    _, streamed, _ = run_generate(capsys, *args)
    assert streamed == PROMPTS[0] + expected + "\n"


def test_stop_understands_escapes():
    from gated_qwen.cli.generate import _unescape

    assert _unescape(r"\n\n") == "\n\n" and _unescape(r"a\tb\\n") == "a\tb\\n"


def test_truncate_at_stop_cuts_at_the_earliest_stop():
    assert generation.truncate_at_stop("abcXdefY", ["Y", "X"]) == "abcX"
    assert generation.truncate_at_stop("abc", ["Z"]) == "abc"
    assert generation.truncate_at_stop("a\nb", "\n") == "a\n"


def test_prompts_from_file_and_stdin(checkpoint, capsys, monkeypatch, tmp_path):
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text(f"{PROMPTS[0]}\n\n{PROMPTS[2]}\n")
    common = ("--model", checkpoint, "--json", "--max-new-tokens", 4)
    _, from_file, _ = run_generate(capsys, *common, "--prompts-file", prompts_file)
    monkeypatch.setattr(sys, "stdin", io.StringIO(prompts_file.read_text()))
    _, from_stdin, _ = run_generate(capsys, *common)
    _, from_args, _ = run_generate(capsys, *common, PROMPTS[0], PROMPTS[2])

    def prompts_and_completions(out):
        return [(r["prompt"], r["completion"]) for r in json_records(out)]

    assert [p for p, _ in prompts_and_completions(from_file)] == [PROMPTS[0], PROMPTS[2]]
    assert (
        prompts_and_completions(from_file) == prompts_and_completions(from_stdin) == prompts_and_completions(from_args)
    )


def test_several_prompts_print_one_block_each(checkpoint, capsys):
    code, out, err = run_generate(capsys, "--model", checkpoint, "--max-new-tokens", 5, "--batch-size", 2, *PROMPTS)
    assert code == 0, err
    expected = "\n".join(p + reference_completion(checkpoint, p, 5) + "\n" for p in PROMPTS)
    assert out == expected


def test_chat_applies_the_template(tmp_path, checkpoint, capsys):
    folder = tmp_path / "chat"
    shutil.copytree(checkpoint, folder)
    write_tiny_tokenizer(folder, chat_template=CHAT_TEMPLATE)
    code, out, err = run_generate(
        capsys, "--model", folder, "--chat", "--system", "Be brief.", "--json", "--max-new-tokens", 6, "Hello"
    )
    assert code == 0, err
    (record,) = json_records(out)
    rendered = "system: Be brief.\nuser: Hello\nassistant:"
    assert record["prompt"] == "Hello"
    assert record["completion"] == reference_completion(folder, rendered, 6)
    code, streamed, _ = run_generate(capsys, "--model", folder, "--chat", "--max-new-tokens", 6, "Hello")
    assert code == 0 and streamed == reference_completion(folder, "user: Hello\nassistant:", 6) + "\n"


def test_default_model_is_used_when_model_is_absent(checkpoint, capsys, monkeypatch):
    monkeypatch.setattr(default_models, "default_model_path", lambda name="headwise": checkpoint)
    code, out, err = run_generate(capsys, "--max-new-tokens", 8, "--no-stream", PROMPTS[0])
    assert code == 0, err
    assert out == PROMPTS[0] + reference_completion(checkpoint, PROMPTS[0], 8) + "\n"


def assert_one_line_error(code: int, out: str, err: str, *fragments: str) -> None:
    assert code == 2
    assert "Traceback" not in err and not out
    message = err.strip().splitlines()[-1]
    assert message.startswith("gated-qwen generate: error:"), err
    for fragment in fragments:
        assert fragment in message, message


def test_missing_model_without_embedded_default(capsys, monkeypatch):
    monkeypatch.setattr(default_models, "default_model_path", lambda name="headwise": None)
    assert_one_line_error(*run_generate(capsys, "Hello"), "--model is required", "no embedded default model")


def test_missing_model_folder(tmp_path, capsys):
    assert_one_line_error(*run_generate(capsys, "--model", tmp_path / "nowhere", "Hello"), "nowhere does not exist")
    assert_one_line_error(
        *run_generate(capsys, "--model", "./missing_dir", "Hello"),
        "./missing_dir does not exist: there is no such folder",
    )


def test_folder_of_several_arms_asks_for_a_subfolder(checkpoint, capsys):
    code, out, err = run_generate(capsys, "--model", checkpoint.parent, "Hello")
    assert_one_line_error(code, out, err, "has no config.json", "--subfolder", "1B_gate_headwise")
    code, out, err = run_generate(
        capsys, "--model", checkpoint.parent, "--subfolder", checkpoint.name, "--max-new-tokens", 2, "Hello"
    )
    assert code == 0, err


def test_folder_without_tokenizer_names_the_missing_files(tmp_path, capsys):
    write_released_checkpoint(tmp_path / "arm", vocab_size=320)
    code, out, err = run_generate(capsys, "--model", tmp_path / "arm", "Hello")
    assert_one_line_error(code, out, err, "has no tokenizer files", "tokenizer.json", "vocab.json and merges.txt")
    # --tokenizer points elsewhere
    write_tiny_tokenizer(tmp_path / "tokenizer")
    code, out, err = run_generate(
        capsys, "--model", tmp_path / "arm", "--tokenizer", tmp_path / "tokenizer", "--max-new-tokens", 2, "Hello"
    )
    assert code == 0, err


def test_tokenizer_larger_than_the_vocabulary(tmp_path, capsys):
    write_released_checkpoint(tmp_path / "arm", vocab_size=96)
    write_tiny_tokenizer(tmp_path / "arm")
    assert_one_line_error(
        *run_generate(capsys, "--model", tmp_path / "arm", "Hello"), "vocab_size is 96", "not this model's"
    )


def test_bad_dtype(checkpoint, capsys):
    code, out, err = run_generate(capsys, "--model", checkpoint, "--dtype", "float8", "Hello")
    assert_one_line_error(code, out, err, "--dtype: invalid choice: 'float8'", "bfloat16")


def test_bad_device_and_attention_names(checkpoint, capsys):
    assert_one_line_error(
        *run_generate(capsys, "--model", checkpoint, "--device", "tpu", "x"), "--device: invalid choice: 'tpu'"
    )
    assert_one_line_error(
        *run_generate(capsys, "--model", checkpoint, "--attn", "fast", "x"), "--attn: invalid choice: 'fast'", "sdpa"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where CUDA is missing")
def test_unavailable_cuda_and_flash_attention(checkpoint, capsys, monkeypatch):
    assert_one_line_error(
        *run_generate(capsys, "--model", checkpoint, "--device", "cuda", "x"), "device cuda is unavailable"
    )
    code, out, err = run_generate(capsys, "--model", checkpoint, "--attn", "flash_attention_2", "x")
    assert_one_line_error(code, out, err, "flash_attention_2 needs a CUDA device")
    # on a CUDA machine without the package
    monkeypatch.setattr(devices, "is_flash_attn_2_available", lambda: False)
    with pytest.raises(generation.GatedQwenError, match="needs the flash-attn package"):
        devices.check_attention("flash_attention_2", torch.device("cuda"), torch.bfloat16)


def test_bad_decoding_options_fail_before_loading(checkpoint, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--model", str(checkpoint), "--top-p", "1.5", "x"])
    assert exit_info.value.code == 2 and "--top-p: 1.5 is out of range" in capsys.readouterr().err
    code, out, err = run_generate(capsys, "--model", checkpoint, "--greedy", "--temperature", 0.7, "x")
    assert_one_line_error(code, out, err, "temperature only apply to sampling")
    assert_one_line_error(*run_generate(capsys, "--model", checkpoint, "--system", "s", "x"), "--system needs --chat")


def test_chat_without_template(checkpoint, capsys):
    assert_one_line_error(*run_generate(capsys, "--model", checkpoint, "--chat", "x"), "has no chat template")


def test_no_prompt(checkpoint, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert_one_line_error(*run_generate(capsys, "--model", checkpoint), "no prompt")


def test_pipeline_loads_a_checkpoint_saved_by_this_package(checkpoint, tmp_path, capsys):
    saved = tmp_path / "saved"
    Qwen3GatedForCausalLM.from_pretrained(checkpoint).save_pretrained(saved)
    AutoTokenizer.from_pretrained(checkpoint).save_pretrained(saved)
    pipe = transformers.pipeline("text-generation", model=str(saved))
    assert isinstance(pipe.model, Qwen3GatedForCausalLM) and pipe.model.config.gate_type == "headwise"
    text = pipe(PROMPTS[0], max_new_tokens=8, do_sample=False)[0]["generated_text"]
    assert text == PROMPTS[0] + reference_completion(checkpoint, PROMPTS[0], 8)


def test_pipeline_takes_a_released_arm_loaded_by_this_package(checkpoint):
    model = Qwen3GatedForCausalLM.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    pipe = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer)
    text = pipe(PROMPTS[2], max_new_tokens=8, do_sample=False)[0]["generated_text"]
    assert text == PROMPTS[2] + reference_completion(checkpoint, PROMPTS[2], 8)


@pytest.mark.slow
def test_installed_console_script(checkpoint):
    command = Path(sys.executable).with_name("gated-qwen")
    result = subprocess.run(
        [str(command), "generate", "--model", str(checkpoint), "--json", "--max-new-tokens", "5", PROMPTS[0]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    (record,) = json_records(result.stdout)
    assert record["completion"] == reference_completion(checkpoint, PROMPTS[0], 5)


def test_attention_choice_reaches_the_model(checkpoint, capsys, monkeypatch):
    seen = []
    original = generation.Qwen3GatedForCausalLM.from_pretrained
    monkeypatch.setattr(
        generation.Qwen3GatedForCausalLM,
        "from_pretrained",
        lambda *args, **kwargs: seen.append(kwargs["attn_implementation"]) or original(*args, **kwargs),
    )
    common = ("--model", checkpoint, "--json", "--max-new-tokens", 8, *PROMPTS[:2])
    _, eager, _ = run_generate(capsys, "--attn", "eager", *common)
    _, sdpa, _ = run_generate(capsys, "--attn", "sdpa", *common)
    assert seen == ["eager", "sdpa"]
    assert [r["completion"] for r in json_records(eager)] == [r["completion"] for r in json_records(sdpa)]


def test_attention_that_fails_to_compile_is_one_message(checkpoint, monkeypatch):
    model, tokenizer = generation.load_model_and_tokenizer(str(checkpoint), device="cpu")

    def failing_generate(**kwargs):
        raise torch._dynamo.exc.TorchDynamoException("C++ compile error\nmany lines")

    monkeypatch.setattr(model, "generate", failing_generate)
    config = generation.build_generation_config(model, tokenizer, max_new_tokens=2)
    with pytest.raises(
        generation.GatedQwenError, match=r"failed to compile on cpu \(C\+\+ compile error\); use --attn sdpa"
    ):
        list(generation.generate(model, tokenizer, ["Hello"], config))


# ---------------------------------------------------------------------------------------------- a released arm as downloaded


@pytest.fixture(scope="module")
def released_arm(tmp_path_factory) -> Path:
    """An arm as the hub has it: qwen2 label, pytorch_model.bin, Qwen's tokenizer without BOS or pad, vocabulary 152064."""
    from conftest import write_released_arm

    folder = tmp_path_factory.mktemp("released") / "1B_gate_headwise"
    write_released_arm(folder, gate="headwise", dtype=torch.bfloat16, gate_scale=3.0)
    return folder


def test_released_arm_with_qwen_tokenizer_batches_like_one_at_a_time(released_arm, capsys):
    tokenizer = AutoTokenizer.from_pretrained(released_arm)
    assert tokenizer.bos_token is None and tokenizer.pad_token is None  # as released: batching must still work
    common = ("--model", released_arm, "--json", "--greedy", "--max-new-tokens", 8, *PROMPTS)
    code, batched_out, err = run_generate(capsys, "--batch-size", 3, *common)
    assert code == 0, err
    _, single_out, _ = run_generate(capsys, "--batch-size", 1, *common)
    batched, single = json_records(batched_out), json_records(single_out)
    assert len({len(tokenizer(p)["input_ids"]) for p in PROMPTS}) > 1  # padding happens
    assert [(r["completion"], r["new_tokens"]) for r in batched] == [
        (r["completion"], r["new_tokens"]) for r in single
    ]
    assert all(r["new_tokens"] > 0 for r in batched)
    assert single[0]["completion"] == reference_completion(released_arm, PROMPTS[0], 8)


class Payload:
    """Unpickling this runs code: it makes the folder it names."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        import os

        return (os.mkdir, (self.path,))


def test_a_malicious_bin_is_one_line_not_a_traceback(tmp_path, capsys):
    spec = write_released_checkpoint(tmp_path / "arm", vocab_size=320)
    write_tiny_tokenizer(tmp_path / "arm")
    torch.save(
        {**spec["tensors"], "lm_head.weight": Payload(tmp_path / "payload-ran")},
        tmp_path / "arm" / "pytorch_model.bin",
    )
    code, out, err = run_generate(capsys, "--model", tmp_path / "arm", "Hello")
    assert_one_line_error(
        code, out, err, "pytorch_model.bin holds a pickle that is not plain tensors", "nothing in it ran"
    )
    assert not (tmp_path / "payload-ran").exists()


def test_the_first_command_gives_the_same_text_every_run(capsys):
    """README's first command: the embedded model samples (its generation config), seeded with 0 by default."""
    if default_models.default_model_path() is None:
        pytest.skip("this install has no embedded default model")
    prompt = "def read_config(path):"
    runs = [run_generate(capsys, "--max-new-tokens", 24, "--no-stream", prompt) for _ in range(2)]
    assert runs[0][0] == 0 and runs[0] == runs[1]
    assert run_generate(capsys, "--max-new-tokens", 24, "--no-stream", "--seed", 0, prompt) == runs[0]
    assert (
        run_generate(capsys, "--max-new-tokens", 24, "--no-stream", "--seed", 1, prompt)[1] != runs[0][1]
    )  # it samples


def test_terminal_stays_clean_unless_verbose(capfd):
    """No "Loading weights" bar, and no note about sampling flags inside greedy streamed text (the embedded
    model's generation config samples at temperature 0.8)."""
    if default_models.default_model_path() is None:
        pytest.skip("this install has no embedded default model")
    assert main(["generate", "--greedy", "--max-new-tokens", "8", "def add(a, b):"]) == 0
    out, err = capfd.readouterr()
    assert out.startswith("def add(a, b):") and err == ""
    assert main(["generate", "--greedy", "--max-new-tokens", "8", "--verbose", "def add(a, b):"]) == 0
    assert "Loading weights" in capfd.readouterr().err


def test_a_bare_model_checkpoint_is_refused(tmp_path, capsys):
    from gated_qwen import Qwen3GatedModel

    write_released_checkpoint(tmp_path / "src", vocab_size=320)
    Qwen3GatedModel(Qwen3GatedForCausalLM.config_class.from_pretrained(tmp_path / "src")).save_pretrained(
        tmp_path / "bare"
    )
    write_tiny_tokenizer(tmp_path / "bare")
    assert_one_line_error(
        *run_generate(capsys, "--model", tmp_path / "bare", "Hello"),
        "lacks lm_head.weight",
        "not a complete causal language model",
    )
