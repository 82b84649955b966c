"""Conversion of stock Qwen3 into Qwen3Gated: exact outputs, the released layout, bad input, untouched sources."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import write_released_arm, write_released_checkpoint, write_tiny_tokenizer
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3ForSequenceClassification,
    Qwen3Model,
)

from gated_qwen import (
    Qwen3GatedForCausalLM,
    Qwen3GatedForSequenceClassification,
    Qwen3GatedModel,
    convert_checkpoint,
    convert_qwen3_to_gated,
)
from gated_qwen.cli import main
from gated_qwen.errors import CheckpointError, GatedQwenError
from gated_qwen.models.layout import split_query_and_gate


CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"


def stock_config(num_key_value_heads=2, tie_word_embeddings=False, attention_bias=False, vocab_size=300, **kwargs):
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=num_key_value_heads,
        head_dim=8,
        tie_word_embeddings=tie_word_embeddings,
        attention_bias=attention_bias,
        **kwargs,
    )


def stock_model(seed=0, dtype=torch.float32, model_class=Qwen3ForCausalLM, **config_kwargs):
    torch.manual_seed(seed)
    config = stock_config(**config_kwargs)
    if model_class is Qwen3ForSequenceClassification:
        config.num_labels, config.pad_token_id = 3, 0
    model = model_class(config).to(dtype).eval()
    # stock init leaves biases and norms at 0 and 1: give them values so that a wrong bias shows
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                parameter.normal_(0.0 if name.endswith("bias") else 1.0, 0.1)
    return model


def write_stock_checkpoint(folder: Path, max_shard_size="1GB", dtype=torch.float32, **config_kwargs) -> Path:
    """A stock transformers Qwen3 checkpoint with tokenizer, chat template and generation config."""
    stock_model(dtype=dtype, **config_kwargs).save_pretrained(folder, max_shard_size=max_shard_size)
    write_tiny_tokenizer(folder, chat_template=CHAT_TEMPLATE)
    return folder


def digests(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def probe_ids(vocab_size=300):
    return torch.randint(vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))


def gate_rows(model, layer=0):
    attention = model.model.layers[layer].self_attn
    _, gate = split_query_and_gate(
        attention.q_proj.weight, attention.config.num_key_value_heads, attention.head_dim, attention.gate_dim, dim=0
    )
    return gate


# ---------------------------------------------------------------------------------------------- in memory


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_identity_conversion_in_memory_is_bit_exact(gate, kv_heads, tie, dtype):
    stock = stock_model(dtype=dtype, num_key_value_heads=kv_heads, tie_word_embeddings=tie, attention_bias=True)
    ids = probe_ids()
    with torch.no_grad():
        expected = stock(ids).logits
        gated = convert_qwen3_to_gated(stock, gate=gate)
        logits = gated(ids).logits
    assert isinstance(gated, Qwen3GatedForCausalLM) and gated.config.gate_type == gate
    assert torch.equal(logits, expected)
    head_dim, heads = 8, 4
    gate_width = 1 if gate == "headwise" else head_dim
    q_proj = gated.model.layers[0].self_attn.q_proj
    assert q_proj.weight.shape == (heads * (head_dim + gate_width), 32) and q_proj.bias.shape == (
        heads * (head_dim + gate_width),
    )
    assert q_proj.weight.dtype == dtype
    assert (gated.lm_head.weight is gated.model.embed_tokens.weight) == tie


def test_in_memory_shares_weights_and_leaves_source_unchanged():
    stock = stock_model(attention_bias=True)
    before = {name: tensor.clone() for name, tensor in stock.state_dict().items()}
    ids = probe_ids()
    expected = stock(ids).logits.detach()
    gated = convert_qwen3_to_gated(stock, gate="elementwise")

    stock_attention, gated_attention = stock.model.layers[1].self_attn, gated.model.layers[1].self_attn
    # no copy: untouched tensors are the very same Parameters
    assert gated.model.embed_tokens.weight is stock.model.embed_tokens.weight
    assert gated.model.layers[1].mlp.down_proj.weight is stock.model.layers[1].mlp.down_proj.weight
    assert gated_attention.k_proj.weight is stock_attention.k_proj.weight
    assert gated_attention.o_proj.bias is stock_attention.o_proj.bias
    # q_proj and o_proj are new tensors, the source's are untouched
    assert gated_attention.q_proj.weight.data_ptr() != stock_attention.q_proj.weight.data_ptr()
    assert torch.equal(gated_attention.o_proj.weight, 2 * stock_attention.o_proj.weight)
    for name, tensor in stock.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert torch.equal(stock(ids).logits, expected)
    assert not gated.training  # the source was in eval mode


def test_in_memory_grown_q_proj_is_in_released_layout():
    stock = stock_model(attention_bias=True)  # 4 heads, 2 kv heads: G = 2
    gated = convert_qwen3_to_gated(stock, gate="headwise")
    stock_q, gated_q = stock.model.layers[0].self_attn.q_proj, gated.model.layers[0].self_attn.q_proj
    D, G = 8, 2
    # docs/released-format.md: per kv head k, the G heads' queries (G*D rows), then their G gate rows
    for k in range(2):
        block = gated_q.weight[k * (G * D + G) : (k + 1) * (G * D + G)]
        assert torch.equal(block[: G * D], stock_q.weight[k * G * D : (k + 1) * G * D])
        assert torch.equal(block[G * D :], torch.zeros(G, 32))
        bias_block = gated_q.bias[k * (G * D + G) : (k + 1) * (G * D + G)]
        assert torch.equal(bias_block[: G * D], stock_q.bias[k * G * D : (k + 1) * G * D])
        assert torch.equal(bias_block[G * D :], torch.zeros(G))


@pytest.mark.parametrize(
    "model_class, gated_class",
    [(Qwen3Model, Qwen3GatedModel), (Qwen3ForSequenceClassification, Qwen3GatedForSequenceClassification)],
)
def test_in_memory_other_heads(model_class, gated_class):
    stock = stock_model(model_class=model_class)
    ids = probe_ids()
    with torch.no_grad():
        expected = stock(ids)[0]
        gated = convert_qwen3_to_gated(stock)
        assert type(gated) is gated_class
        assert torch.equal(gated(ids)[0], expected)


def test_in_memory_with_device_map_keeps_devices():
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        stock_model(dtype=torch.bfloat16).save_pretrained(folder)
        stock = Qwen3ForCausalLM.from_pretrained(folder, device_map="cpu", dtype=torch.bfloat16)
    ids = probe_ids()
    with torch.no_grad():
        expected = stock(ids).logits
        gated = convert_qwen3_to_gated(stock)
        assert torch.equal(gated(ids).logits, expected)
    assert {(p.device.type, p.dtype) for p in gated.parameters()} == {("cpu", torch.bfloat16)}


def test_one_optimizer_step_reaches_the_gate_rows():
    gated = convert_qwen3_to_gated(stock_model(), gate="headwise")
    gated.train()
    before = gate_rows(gated).detach().clone()
    assert torch.equal(before, torch.zeros_like(before))
    optimizer = torch.optim.SGD(gated.parameters(), lr=0.1)
    ids = probe_ids()
    gated(ids, labels=ids).loss.backward()
    optimizer.step()
    assert gate_rows(gated).abs().min() > 0  # every gate row of every head moved


def test_random_init_draws_gate_rows_and_keeps_o_proj():
    stock = stock_model(attention_bias=True)
    torch.manual_seed(0)
    gated = convert_qwen3_to_gated(stock, gate="elementwise", init="random")
    rows = gate_rows(gated)
    assert rows.abs().min() > 0
    assert 0.5 * gated.config.initializer_range < rows.std() < 2 * gated.config.initializer_range
    attention, stock_attention = gated.model.layers[0].self_attn, stock.model.layers[0].self_attn
    assert attention.o_proj.weight is stock_attention.o_proj.weight
    _, gate_bias = split_query_and_gate(attention.q_proj.bias, 2, 8, 8)
    assert torch.equal(gate_bias, torch.zeros_like(gate_bias))
    ids = probe_ids()
    assert not torch.equal(gated(ids).logits, stock(ids).logits)


def test_in_memory_refuses_bad_input():
    with pytest.raises(GatedQwenError, match="already gated"):
        convert_qwen3_to_gated(convert_qwen3_to_gated(stock_model()))
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    with pytest.raises(GatedQwenError, match="LlamaForCausalLM"):
        convert_qwen3_to_gated(llama)
    with pytest.raises(GatedQwenError, match="unknown gate 'channelwise'"):
        convert_qwen3_to_gated(stock_model(), gate="channelwise")
    with pytest.raises(GatedQwenError, match="unknown init 'zeros'"):
        convert_qwen3_to_gated(stock_model(), init="zeros")


# ---------------------------------------------------------------------------------------------- on disk


@pytest.mark.parametrize(
    "gate, source_kwargs",
    [
        ("headwise", {}),
        ("elementwise", {"tie_word_embeddings": True, "attention_bias": True}),
        ("headwise", {"num_key_value_heads": 4, "dtype": torch.bfloat16, "max_shard_size": "40KB"}),
    ],
    ids=["headwise-gqa", "elementwise-tied-bias", "headwise-mha-bf16-sharded"],
)
def test_identity_conversion_on_disk_is_bit_exact(tmp_path, gate, source_kwargs):
    source = write_stock_checkpoint(tmp_path / "stock", **source_kwargs)
    before = digests(source)
    result = convert_checkpoint(source, tmp_path / "gated", gate=gate, progress=False)

    assert digests(source) == before  # the source is byte-identical afterwards
    assert result.path == tmp_path / "gated" and result.max_difference is None
    reference = Qwen3ForCausalLM.from_pretrained(source, dtype="auto")
    converted = AutoModelForCausalLM.from_pretrained(result.path, dtype="auto")
    assert type(converted) is Qwen3GatedForCausalLM and converted.config.gate_type == gate
    assert converted.dtype == reference.dtype
    ids = probe_ids()
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, reference(ids).logits)


def test_on_disk_reads_only_the_tensors_it_changes(tmp_path, monkeypatch):
    """Unchanged tensors are copied as stored bytes: only q_proj and o_proj pass through torch."""
    from safetensors.torch import load_file

    from gated_qwen.checkpoint.formats import CheckpointTensors

    source = write_stock_checkpoint(tmp_path / "stock", max_shard_size="40KB")
    read = []
    real_get = CheckpointTensors.get
    monkeypatch.setattr(CheckpointTensors, "get", lambda self, name: read.append(name) or real_get(self, name))
    result = convert_checkpoint(source, tmp_path / "gated", max_shard_size="50KB", progress=False)
    assert read and all(name.endswith(("q_proj.weight", "o_proj.weight")) for name in read)
    assert len(read) == 2 * stock_config().num_hidden_layers
    stock = {k: v for f in source.glob("*.safetensors") for k, v in load_file(f).items()}
    gated = {k: v for f in result.path.glob("*.safetensors") for k, v in load_file(f).items()}
    assert gated.keys() == stock.keys()
    for name, tensor in stock.items():
        if "q_proj" not in name and "o_proj" not in name:
            assert torch.equal(gated[name], tensor), name


def test_on_disk_copies_without_copy_file_range(tmp_path, monkeypatch):
    """Where the kernel cannot copy between the files, chunked reads give the same checkpoint."""
    import gated_qwen.checkpoint.formats as checkpoint

    source = write_stock_checkpoint(tmp_path / "stock", attention_bias=True)
    kernel = convert_checkpoint(source, tmp_path / "kernel", progress=False)

    def refuse(*args, **kwargs):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(checkpoint.os, "copy_file_range", refuse, raising=False)
    monkeypatch.setattr(checkpoint, "COPY_CHUNK_SIZE", 1000)  # several chunks per tensor
    chunked = convert_checkpoint(source, tmp_path / "chunked", progress=False)
    assert digests(chunked.path) == digests(kernel.path)


def test_on_disk_writes_a_complete_checkpoint(tmp_path):
    source = write_stock_checkpoint(tmp_path / "stock", max_shard_size="40KB", tie_word_embeddings=True)
    (source / "modeling_qwen3.py").write_text("raise RuntimeError('never copied')\n")
    assert (source / "model.safetensors.index.json").is_file()  # a sharded source
    result = convert_checkpoint(source, tmp_path / "gated", gate="elementwise", max_shard_size="60KB", progress=False)

    config = json.loads((result.path / "config.json").read_text())
    assert config["model_type"] == "qwen3_gated" and config["architectures"] == ["Qwen3GatedForCausalLM"]
    assert config["elementwise_attn_output_gate"] is True and config["headwise_attn_output_gate"] is False
    index = json.loads((result.path / "model.safetensors.index.json").read_text())
    assert len(result.files) > 1 and sorted(set(index["weight_map"].values())) == sorted(result.files)
    assert "lm_head.weight" not in index["weight_map"]  # tied
    assert index["metadata"]["total_size"] == result.total_size
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (result.path / name).read_bytes() == (source / name).read_bytes(), name
    assert not list(result.path.glob("*.py"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gated", "stock"]  # no temporary folder left
    (tmp_path / "fresh").mkdir()
    assert result.path.stat().st_mode == (tmp_path / "fresh").stat().st_mode  # as if made by mkdir, not 0700
    (tmp_path / "fresh").rmdir()

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(result.path)
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "<|user|>hi"


@pytest.mark.parametrize(
    "model_class, gated_class",
    [(Qwen3Model, Qwen3GatedModel), (Qwen3ForSequenceClassification, Qwen3GatedForSequenceClassification)],
)
def test_on_disk_other_heads(tmp_path, model_class, gated_class):
    stock_model(model_class=model_class).save_pretrained(tmp_path / "stock")
    result = convert_checkpoint(tmp_path / "stock", tmp_path / "gated", max_shard_size="50000", progress=False)
    assert len(result.files) > 1  # a plain number of bytes is a shard size too
    reference = model_class.from_pretrained(tmp_path / "stock")
    converted = gated_class.from_pretrained(result.path)
    ids = probe_ids()
    with torch.no_grad():
        assert torch.equal(converted(ids)[0], reference(ids)[0])


def test_on_disk_dtype_cast(tmp_path):
    source = write_stock_checkpoint(tmp_path / "stock")
    result = convert_checkpoint(source, tmp_path / "gated", dtype="bfloat16", progress=False)
    converted = Qwen3GatedForCausalLM.from_pretrained(result.path, dtype="auto")
    reference = Qwen3ForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
    assert (
        converted.dtype == torch.bfloat16
        and json.loads((result.path / "config.json").read_text())["dtype"] == "bfloat16"
    )
    ids = probe_ids()
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, reference(ids).logits)


def test_on_disk_random_init_and_verify(tmp_path):
    source = write_stock_checkpoint(tmp_path / "stock")
    identity = convert_checkpoint(source, tmp_path / "identity", verify=True, progress=False)
    assert identity.max_difference == 0.0
    torch.manual_seed(0)
    random = convert_checkpoint(source, tmp_path / "random", init="random", verify=True, progress=False)
    assert random.max_difference > 0
    rows = gate_rows(Qwen3GatedForCausalLM.from_pretrained(random.path))
    assert rows.abs().min() > 0


def test_released_baseline_converts(tmp_path):
    """A no-gate arm in the released layout (model_type qwen2, pytorch_model.bin; here with qkv_bias, so
    biases on o_proj too, and without QK-norm) converts exactly."""
    source = tmp_path / "baseline"
    write_released_checkpoint(source, gate="none", qkv_bias=True, use_qk_norm=False)
    result = convert_checkpoint(source, tmp_path / "gated", gate="headwise", progress=False)
    reference = Qwen3GatedForCausalLM.from_pretrained(source)
    converted = Qwen3GatedForCausalLM.from_pretrained(result.path)
    assert converted.config.gate_type == "headwise" and not converted.config.use_qk_norm
    ids = torch.randint(96, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, reference(ids).logits)


def fake_hub(monkeypatch, snapshot: Path, listing: dict[str, int]):
    """A hub whose repository lists ``listing`` (path: size) and whose snapshot is the folder ``snapshot``;
    returns the recorded snapshot_download calls."""
    import huggingface_hub

    calls = []

    def fake_snapshot_download(repo_id, revision=None, allow_patterns=None):
        calls.append((repo_id, revision, allow_patterns))
        return str(snapshot)

    def fake_list_repo_tree(self, repo_id, path_in_repo=None, revision=None, **kwargs):
        return [SimpleNamespace(path=path, size=size) for path, size in listing.items()]

    def fake_hf_hub_download(repo_id, filename, subfolder=None, revision=None, **kwargs):
        assert filename == "config.json", filename  # the one file fetched alone: convert checks the config first
        calls.append((repo_id, revision, [f"{subfolder}/{filename}"]))
        return str(snapshot / (subfolder or "") / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_hf_hub_download)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_tree", fake_list_repo_tree)
    monkeypatch.setattr(
        "gated_qwen.checkpoint.sources._check_hub_repository", lambda *args: None
    )  # the hub probe (tests/checkpoint/test_hub.py)
    return calls


def test_hub_source_downloads_only_needed_files(tmp_path, monkeypatch):
    write_stock_checkpoint(tmp_path / "snapshot" / "arm")
    listing = {
        "arm/config.json": 1,
        "arm/model.safetensors": 9,
        "arm/pytorch_model.bin": 9,
        "arm/modeling_qwen3.py": 1,
    }
    calls = fake_hub(monkeypatch, tmp_path / "snapshot", listing)
    result = convert_checkpoint("owner/model", tmp_path / "gated", subfolder="arm", revision="v1", progress=False)
    assert (result.path / "config.json").is_file()
    (config_call, (repo_id, revision, patterns)) = calls
    assert config_call == ("owner/model", "v1", ["arm/config.json"])
    assert (repo_id, revision) == ("owner/model", "v1")
    assert all(pattern.startswith("arm/") for pattern in patterns)
    wanted = (
        "arm/config.json",
        "arm/model.safetensors",
        "arm/tokenizer.json",
        "arm/chat_template.jinja",
    )
    unwanted = ("arm/modeling_qwen3.py", "arm/pytorch_model.bin", "arm/README.md", "other/model.safetensors",
                "arm/adapter_model.safetensors")  # fmt: skip
    assert all(any(fnmatch(name, pattern) for pattern in patterns) for name in wanted)
    assert not any(fnmatch(name, pattern) for pattern in patterns for name in unwanted)


def test_hub_released_arm_downloads_its_bin_and_no_code(tmp_path, monkeypatch):
    """A released arm on the hub has only pytorch_model.bin: that is fetched, never the .py files beside it."""
    write_released_arm(tmp_path / "snapshot" / "1B_gate_headwise", vocab_size=300)
    listing = {
        f"1B_gate_headwise/{p.name}": p.stat().st_size for p in (tmp_path / "snapshot" / "1B_gate_headwise").iterdir()
    }
    calls = fake_hub(monkeypatch, tmp_path / "snapshot", listing)
    result = convert_checkpoint(
        "QwQZh/gated_attention", tmp_path / "clean", gate="keep", subfolder="1B_gate_headwise", progress=False
    )
    (_, (_, _, patterns)) = calls
    fetched = sorted(name for name in listing if any(fnmatch(name, pattern) for pattern in patterns))
    assert fetched == [
        f"1B_gate_headwise/{n}"
        for n in (
            "config.json",
            "generation_config.json",
            "pytorch_model.bin",
            "tokenizer.json",
            "tokenizer_config.json",
            "vocab.json",
        )
    ]
    assert result.gate == "headwise"


# ---------------------------------------------------------------------------------------------- bad input


def corrupt(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")


def truncate(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def drop_shard(folder: Path) -> None:
    sorted(folder.glob("model-*.safetensors"))[-1].unlink()


def to_llama(folder: Path) -> None:
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).save_pretrained(folder)


def to_gated(folder: Path) -> None:
    for path in folder.iterdir():
        path.unlink()
    write_released_checkpoint(folder, gate="headwise")


def to_pickle(folder: Path) -> None:
    state = Qwen3ForCausalLM.from_pretrained(folder).state_dict()
    for path in folder.glob("model*.safetensors*"):
        path.unlink()
    torch.save(state, folder / "pytorch_model.bin")


class Payload:
    """Unpickling this runs code: it makes the folder it names."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        import os

        return (os.mkdir, (self.path,))


def to_malicious_pickle(folder: Path) -> None:
    to_pickle(folder)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    state["model.norm.weight"] = Payload(folder.parent / "payload-ran")
    torch.save(state, folder / "pytorch_model.bin")


def gated_weights_stock_config(folder: Path) -> None:
    """Gated q_proj rows behind a config without a gate: refused, not silently re-gated."""
    write_released_checkpoint(folder / "released", gate="headwise", vocab_size=300, weights="safetensors")
    (folder / "released" / "model.safetensors").replace(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_size=32, num_hidden_layers=2)
    (folder / "config.json").write_text(json.dumps(config))


def drop_layer(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 3
    config.pop("layer_types")
    (folder / "config.json").write_text(json.dumps(config))


def garbled_config(folder: Path) -> None:
    (folder / "config.json").write_text('{"model_type": "qwen3", ')


@pytest.mark.parametrize(
    "damage, shard, message",
    [
        (corrupt, "1GB", "corrupt or truncated"),
        (truncate, "1GB", "corrupt or truncated"),
        (drop_shard, "40KB", "missing"),
        (to_llama, "1GB", "'llama' model, not Qwen3"),
        (to_gated, "1GB", "already gated"),
        (to_malicious_pickle, "1GB", "pickle that is not plain tensors"),
        (gated_weights_stock_config, "1GB", "shape of a 'headwise' gate"),
        # refused from the headers, before the plan (issue 21), naming the key and what the weights hold
        (drop_layer, "1GB", "config.json says num_hidden_layers 3, but the checkpoint holds 2 layers"),
        (garbled_config, "1GB", "not valid JSON"),
    ],
    ids=[
        "corrupt",
        "truncated",
        "missing-shard",
        "not-qwen3",
        "already-gated",
        "malicious-pickle",
        "gated-rows",
        "layers",
        "config",
    ],
)
def test_bad_source_is_refused_without_leftovers(tmp_path, damage, shard, message):
    source = write_stock_checkpoint(tmp_path / "stock", max_shard_size=shard)
    damage(source)
    before = digests(source)
    with pytest.raises(CheckpointError, match=message):
        convert_checkpoint(source, tmp_path / "gated", progress=False)
    assert digests(source) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stock"]


def test_pickle_source_converts_like_safetensors_and_only_safely(tmp_path, monkeypatch):
    """pytorch_model.bin sources (the released layout) convert to the same tensors, read only with weights_only=True."""
    from safetensors.torch import load_file

    source = write_stock_checkpoint(tmp_path / "stock")
    from_safetensors = convert_checkpoint(source, tmp_path / "from-safetensors", progress=False)
    to_pickle(source)
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(k.get("weights_only")) or real_load(*a, **k))
    from_pickle = convert_checkpoint(source, tmp_path / "from-pickle", progress=False)
    assert loads and all(weights_only is True for weights_only in loads)
    assert (
        load_file(from_pickle.path / "model.safetensors").keys()
        == load_file(from_safetensors.path / "model.safetensors").keys()
    )
    for name, tensor in load_file(from_pickle.path / "model.safetensors").items():
        assert torch.equal(tensor, load_file(from_safetensors.path / "model.safetensors")[name]), name


def test_malicious_pickle_payload_never_runs(tmp_path):
    source = write_stock_checkpoint(tmp_path / "stock")
    to_malicious_pickle(source)
    with pytest.raises(CheckpointError, match="pytorch_model.bin holds a pickle that is not plain tensors"):
        convert_checkpoint(source, tmp_path / "gated", progress=False)
    assert not (tmp_path / "payload-ran").exists()


def test_existing_destination_needs_overwrite(tmp_path):
    source = write_stock_checkpoint(tmp_path / "stock")
    dst = tmp_path / "gated"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    with pytest.raises(GatedQwenError, match="--overwrite"):
        convert_checkpoint(source, dst, progress=False)
    assert [p.name for p in dst.iterdir()] == ["keep.txt"]

    convert_checkpoint(source, dst, overwrite=True, progress=False)
    assert (dst / "config.json").is_file() and not (dst / "keep.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gated", "stock"]

    empty = tmp_path / "empty"
    empty.mkdir()
    convert_checkpoint(source, empty, progress=False)  # an empty folder is not "existing"
    assert (empty / "model.safetensors").is_file()


def test_destination_inside_source_is_refused(tmp_path):
    source = write_stock_checkpoint(tmp_path / "stock")
    before = digests(source)
    for dst, overwrite in ((source / "gated", False), (source, True), (tmp_path, True)):
        with pytest.raises(GatedQwenError, match="overlap"):
            convert_checkpoint(source, dst, overwrite=overwrite, progress=False)
    assert digests(source) == before


def test_library_refuses_bad_options(tmp_path):
    source = write_stock_checkpoint(tmp_path / "stock")
    for kwargs, message in (
        ({"gate": "none"}, "unknown gate"),
        ({"init": "zeros"}, "unknown init"),
        ({"dtype": "int8"}, "unknown dtype"),
        ({"max_shard_size": "5XB"}, "max shard size"),
    ):
        with pytest.raises(GatedQwenError, match=message):
            convert_checkpoint(source, tmp_path / "gated", progress=False, **kwargs)
    with pytest.raises(GatedQwenError, match="nowhere does not exist: there is no such folder"):
        convert_checkpoint(tmp_path / "nowhere", tmp_path / "gated", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stock"]


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_converts_and_verifies(tmp_path, capsys):
    source = write_stock_checkpoint(tmp_path / "stock")
    assert main(["convert", str(source), str(tmp_path / "gated"), "--gate", "elementwise", "--verify", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "elementwise gate, identity init" in out
    assert "largest logit difference" in out and out.strip().endswith(": 0")


def test_cli_errors_are_one_line(tmp_path, capsys):
    source = write_stock_checkpoint(tmp_path / "stock")
    (tmp_path / "gated").mkdir()
    (tmp_path / "gated" / "x").write_text("x")
    capsys.readouterr()
    assert main(["convert", str(source), str(tmp_path / "gated"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gated-qwen convert: error: ") and "--overwrite" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", str(source), str(tmp_path / "other"), "--init", "zeros"])
    assert exit_info.value.code == 2 and "invalid choice: 'zeros'" in capsys.readouterr().err


@pytest.mark.slow
def test_module_is_the_cli(tmp_path):
    source = write_stock_checkpoint(tmp_path / "stock")
    completed = subprocess.run(
        [sys.executable, "-m", "gated_qwen", "convert", str(source), str(tmp_path / "gated"), "--quiet"],
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 0, completed.stderr
    assert "headwise gate, identity init" in completed.stdout
    assert Qwen3GatedForCausalLM.from_pretrained(tmp_path / "gated").config.gate_type == "headwise"


# ---------------------------------------------------------------------------------------------- re-saving released arms


@pytest.mark.parametrize("gate", ["none", "headwise", "elementwise"])
def test_keep_resaves_a_released_arm_bit_for_bit(tmp_path, gate):
    """`convert --gate keep`: a released arm (qwen2 label, pytorch_model.bin, Qwen tokenizer) becomes a clean
    gated-qwen checkpoint (sharded safetensors, qwen3_gated) whose logits equal the source's exactly."""
    source = tmp_path / "arm"
    write_released_arm(source, gate=gate, dtype=torch.bfloat16)
    before = digests(source)
    assert (
        main(["convert", str(source), str(tmp_path / "clean"), "--gate", "keep", "--max-shard-size", "4MB", "--quiet"])
        == 0
    )
    assert digests(source) == before
    clean = tmp_path / "clean"
    config = json.loads((clean / "config.json").read_text())
    assert config["model_type"] == "qwen3_gated" and "auto_map" not in config
    assert (config["headwise_attn_output_gate"], config["elementwise_attn_output_gate"]) == (
        gate == "headwise",
        gate == "elementwise",
    )
    assert (
        config["use_qk_norm"] is True
        and config["qkv_bias"] is False
        and config["head_dim"] == 8
        and config["dtype"] == "bfloat16"
    )
    assert len(list(clean.glob("model-*.safetensors"))) > 1 and (clean / "model.safetensors.index.json").is_file()
    assert not list(clean.glob("*.py")) and not list(clean.glob("*.bin"))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "generation_config.json"):
        assert (clean / name).read_bytes() == (source / name).read_bytes(), name

    reference = Qwen3GatedForCausalLM.from_pretrained(source, dtype="auto")
    resaved = AutoModelForCausalLM.from_pretrained(
        clean, dtype="auto"
    )  # a qwen3_gated checkpoint: the Auto classes take it
    assert type(resaved) is Qwen3GatedForCausalLM and resaved.dtype == torch.bfloat16
    ids = torch.randint(152064, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(resaved(ids).logits, reference(ids).logits)


def test_keep_on_a_stock_qwen3_writes_gate_none(tmp_path):
    source = write_stock_checkpoint(tmp_path / "stock")
    result = convert_checkpoint(source, tmp_path / "clean", gate="keep", progress=False)
    assert result.gate == "none" and Qwen3GatedForCausalLM.from_pretrained(result.path).config.gate_type == "none"


# ------------------------------------------------------------------------------- the design space (docs/design-space.md)

IDENTITY_VARIANTS = {
    "G1 headwise": {"gate": "headwise"},
    "G1 elementwise, shared": {"gate": "elementwise", "gate_shared_across_heads": True},
    "G2 headwise": {"gate": "headwise", "gate_position": "value"},
    "G3 elementwise": {"gate": "elementwise", "gate_position": "key"},
    "G4 headwise": {"gate": "headwise", "gate_position": "query"},
    "G5 elementwise": {"gate": "elementwise", "gate_position": "dense_output"},
    "G1 additive SiLU": {"gate": "elementwise", "gate_activation": "silu", "gate_combination": "additive"},
    # the paper's mechanism rows that have an identity: zero logits add nothing, or give 0.5 and a doubled tensor
    "G1 additive identity": {"gate": "elementwise", "gate_activation": "identity", "gate_combination": "additive"},
    "G1 input-independent": {"gate": "elementwise", "gate_input": "none"},
    "G2 headwise input-independent": {"gate": "headwise", "gate_position": "value", "gate_input": "none"},
}


def _stock_qwen3(**kwargs):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, **kwargs,
    )  # fmt: skip
    return Qwen3ForCausalLM(config).eval()


@pytest.mark.parametrize("name", IDENTITY_VARIANTS)
@pytest.mark.parametrize("stock_kwargs", [{}, {"attention_bias": True}], ids=["plain", "biases"])
def test_identity_conversion_is_exact_for_every_variant_that_has_one(name, stock_kwargs, tmp_path):
    from gated_qwen.transforms.conversion import convert_checkpoint, convert_qwen3_to_gated

    stock = _stock_qwen3(**stock_kwargs)
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(0))
    variant = dict(IDENTITY_VARIANTS[name])
    gated = convert_qwen3_to_gated(stock, **variant)
    with torch.no_grad():
        assert torch.equal(gated(ids).logits, stock(ids).logits)
    # the gate really is there and trainable: random init changes the outputs
    torch.manual_seed(1)
    with torch.no_grad():
        assert not torch.equal(convert_qwen3_to_gated(stock, init="random", **variant)(ids).logits, stock(ids).logits)
    # on disk too, with --verify's probe
    stock.save_pretrained(tmp_path / "stock")
    result = convert_checkpoint(tmp_path / "stock", tmp_path / "gated", verify=True, progress=False, **variant)
    assert result.max_difference == 0.0
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tmp_path / "gated")
    assert config.gate_type == variant["gate"]
    assert config.gate_position == variant.get("gate_position", "sdpa_output")


@pytest.mark.parametrize(
    "variant,said",
    [
        ({"gate_activation": "silu"}, "multiplies by 0"),
        ({"gate_combination": "additive"}, "adds 0.5"),
        ({"gate_activation": "identity"}, "multiplies by 0"),  # bilinear
        ({"gate_activation": "ns_sigmoid"}, r"multiplies by 0\.75 \(undoing it multiplies by 1\.333, which rounds\)"),
        ({"gate_activation": "ns_sigmoid", "gate_input": "none"}, "multiplies by 0.75"),
        ({"attn_output_transform": "silu"}, "silu on the SDPA output: it changes the outputs whatever its weights"),
        ({"attn_output_transform": "rmsnorm"}, "rmsnorm on the SDPA output"),
        ({"sandwich_norm": True}, "a sandwich norm: it changes the outputs whatever its weights"),
    ],
)
def test_identity_is_refused_where_none_exists_and_random_remains(variant, said, tmp_path):
    from gated_qwen.transforms.conversion import convert_checkpoint, convert_qwen3_to_gated

    stock = _stock_qwen3()
    with pytest.raises(GatedQwenError, match=f"--init identity has no exact form .*{said}.*; use --init random"):
        convert_qwen3_to_gated(stock, gate="elementwise", **variant)
    stock.save_pretrained(tmp_path / "stock")
    with pytest.raises(GatedQwenError, match=said):
        convert_checkpoint(tmp_path / "stock", tmp_path / "gated", gate="elementwise", progress=False, **variant)
    assert not (tmp_path / "gated").exists()
    assert (
        convert_qwen3_to_gated(stock, gate="elementwise", init="random", **variant).config.gate_type == "elementwise"
    )


def test_random_init_adds_the_tensors_of_the_new_rows_on_disk(tmp_path):
    from safetensors.torch import load_file

    from gated_qwen import Qwen3GatedForCausalLM
    from gated_qwen.transforms.conversion import convert_checkpoint

    _stock_qwen3().save_pretrained(tmp_path / "stock")
    variant = {"gate_input": "none", "attn_output_transform": "rmsnorm", "sandwich_norm": True}
    convert_checkpoint(
        tmp_path / "stock", tmp_path / "gated", gate="headwise", init="random", progress=False, **variant
    )
    tensors = load_file(tmp_path / "gated" / "model.safetensors")
    layer = "model.layers.1."
    assert (
        tensors[layer + "self_attn.gate_logits"].shape == (4, 1) and tensors[layer + "self_attn.gate_logits"].std() > 0
    )
    assert torch.equal(tensors[layer + "self_attn.attn_output_transform.weight"], torch.ones(8))
    assert torch.equal(tensors[layer + "attn_output_layernorm.weight"], torch.ones(32))
    assert torch.equal(tensors[layer + "mlp_output_layernorm.weight"], torch.ones(32))
    model = Qwen3GatedForCausalLM.from_pretrained(tmp_path / "gated")  # the strict loader takes them
    assert model.config.sandwich_norm and torch.equal(
        model.model.layers[1].self_attn.gate_logits, tensors[layer + "self_attn.gate_logits"]
    )


def test_convert_cli_takes_the_variant_flags_and_refuses_a_gate_without_meaning(tmp_path, capsys):
    from gated_qwen.cli import main

    _stock_qwen3().save_pretrained(tmp_path / "stock")
    code = main(["convert", str(tmp_path / "stock"), str(tmp_path / "g2"), "--gate", "headwise",
                 "--gate-position", "value", "--verify", "--quiet"])  # fmt: skip
    assert code == 0 and "largest logit difference" in capsys.readouterr().out
    assert json.loads((tmp_path / "g2" / "config.json").read_text())["gate_position"] == "value"
    code = main(["convert", str(tmp_path / "stock"), str(tmp_path / "g5"), "--gate", "headwise",
                 "--gate-position", "dense_output"])  # fmt: skip
    error = capsys.readouterr().err
    assert code != 0 and "no heads" in error and "Traceback" not in error
    assert not (tmp_path / "g5").exists()
    code = main(["convert", str(tmp_path / "stock"), str(tmp_path / "ns"), "--gate", "headwise",
                 "--gate-activation", "ns_sigmoid"])  # fmt: skip
    error = capsys.readouterr().err
    assert code != 0 and "which rounds); use --init random" in error and error.count("\n") == 1
    assert not (tmp_path / "ns").exists()
    code = main(["convert", str(tmp_path / "stock"), str(tmp_path / "ii"), "--gate", "headwise", "--gate-input", "none",
                 "--verify", "--quiet"])  # fmt: skip
    assert code == 0 and "largest logit difference from" in capsys.readouterr().out
    assert json.loads((tmp_path / "ii" / "config.json").read_text())["gate_input"] == "none"
