import json
import os
from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from safetensors.torch import save_file

from gated_qwen.checkpoint import (
    CheckpointTensors,
    TensorInfo,
    check_weights_match_config,
    load_pickle_weights,
    read_checkpoint_header,
    resolve_weight_files,
    write_safetensors_checkpoint,
)
from gated_qwen.errors import CheckpointError, GatedQwenError


@pytest.mark.parametrize("weights", ["bin", "safetensors"])
def test_header_reads_shapes_without_the_weights(released_checkpoint, weights):
    folder, spec = released_checkpoint(gate="elementwise", weights=weights, dtype=torch.bfloat16)
    header = read_checkpoint_header(folder)
    assert header.config["model_type"] == "qwen2"  # as the released config.json says
    assert header.weights_format == ("pytorch" if weights == "bin" else "safetensors")
    assert set(header.tensors) == set(spec["tensors"])
    assert header.tensors["model.layers.0.self_attn.q_proj.weight"].shape == (64, 32)
    assert header.tensors["model.layers.0.self_attn.q_proj.weight"].dtype == "BF16"


def test_pickle_shapes_are_read_without_the_data(tmp_path, monkeypatch):
    torch.save({"a": torch.zeros(3, 5, dtype=torch.bfloat16)}, tmp_path / "pytorch_model.bin")
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(k) or real_load(*a, **k))
    header = read_checkpoint_header_of_file(tmp_path)
    assert header == {"a": TensorInfo((3, 5), "BF16")}
    assert loads == [{"map_location": "meta", "weights_only": True, "mmap": False}]


def read_checkpoint_header_of_file(folder):
    (folder / "config.json").write_text("{}")
    return read_checkpoint_header(folder).tensors


class Payload:
    """Unpickling this runs code: it creates the file it names."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_a_pickle_that_would_run_code_is_refused_and_nothing_runs(tmp_path):
    ran = tmp_path / "payload-ran"
    torch.save({"model.norm.weight": torch.ones(2), "x": Payload(ran)}, tmp_path / "pytorch_model.bin")
    for read in (
        lambda: read_checkpoint_header_of_file(tmp_path),
        lambda: load_pickle_weights(tmp_path / "pytorch_model.bin"),
    ):
        with pytest.raises(CheckpointError, match="pickle that is not plain tensors.*nothing in it ran") as error:
            read()
        assert "pytorch_model.bin" in str(error.value) and "\n" not in str(error.value)
    assert not ran.exists()


def test_truncated_pickle_weights_get_one_clear_message(tmp_path):
    torch.save({"a": torch.zeros(100)}, tmp_path / "pytorch_model.bin")
    data = (tmp_path / "pytorch_model.bin").read_bytes()
    (tmp_path / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(
        CheckpointError, match="pytorch_model.bin is not a readable PyTorch weights file.*corrupt or truncated"
    ):
        read_checkpoint_header_of_file(tmp_path)


def test_sharded_pickle_weights_are_read_through_their_index(tmp_path):
    torch.save({"a": torch.zeros(2, 3)}, tmp_path / "pytorch_model-00001-of-00002.bin")
    torch.save({"b": torch.ones(4)}, tmp_path / "pytorch_model-00002-of-00002.bin")
    index = {
        "metadata": {},
        "weight_map": {"a": "pytorch_model-00001-of-00002.bin", "b": "pytorch_model-00002-of-00002.bin"},
    }
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text("{}")
    assert [Path(f).name for f in resolve_weight_files(tmp_path)] == [
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model-00002-of-00002.bin",
    ]
    assert {k: v.shape for k, v in read_checkpoint_header(tmp_path).tensors.items()} == {"a": (2, 3), "b": (4,)}
    assert torch.equal(CheckpointTensors(resolve_weight_files(tmp_path)).get("b"), torch.ones(4))


def test_safetensors_are_preferred_to_pickles_as_transformers_does(tmp_path):
    torch.save({"a": torch.zeros(2)}, tmp_path / "pytorch_model.bin")
    save_file({"a": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    assert [Path(f).name for f in resolve_weight_files(tmp_path)] == ["model.safetensors"]


@pytest.mark.parametrize("weights", ["bin", "safetensors"])
def test_tensors_are_read_one_at_a_time_as_stored(released_checkpoint, weights, monkeypatch):
    folder, spec = released_checkpoint(gate="headwise", weights=weights, dtype=torch.bfloat16)
    monkeypatch.setattr(CheckpointTensors, "MAPPED_BYTES", 1000)  # remap the .bin often
    tensors = CheckpointTensors(resolve_weight_files(folder))
    assert tensors.infos.keys() == spec["tensors"].keys()
    for name, expected in spec["tensors"].items():
        assert torch.equal(tensors.get(name), expected), name
        assert (tensors.stored(name) is None) == (weights == "bin")


def test_streamed_writer_shards_and_copies_stored_bytes(tmp_path):
    from safetensors.torch import load_file

    source = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.arange(4.0), "c": torch.ones(5, dtype=torch.bfloat16)}
    save_file(source, str(tmp_path / "source.safetensors"))
    stored = CheckpointTensors([tmp_path / "source.safetensors"])
    plan = {name: stored.infos[name] for name in source}
    out = tmp_path / "out"
    out.mkdir()
    produce = {"a": stored.stored, "b": lambda name: stored.get(name) * 2, "c": stored.stored}
    files = write_safetensors_checkpoint(
        out, plan, lambda name: produce[name](name), max_shard_size=30, progress=False
    )
    assert len(files) > 1 and (out / "model.safetensors.index.json").is_file()
    written = {k: v for f in files for k, v in load_file(out / f).items()}
    assert torch.equal(written["a"], source["a"]) and torch.equal(written["b"], source["b"] * 2)
    assert torch.equal(written["c"], source["c"])


def test_sharded_checkpoints_are_read_through_their_index(tmp_path):
    tensors = {"a": torch.zeros(2, 3), "b": torch.zeros(4)}
    save_file({"a": tensors["a"]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": tensors["b"]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    index = {
        "metadata": {},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text("{}")
    assert len(resolve_weight_files(tmp_path)) == 2
    assert {k: v.shape for k, v in read_checkpoint_header(tmp_path).tensors.items()} == {"a": (2, 3), "b": (4,)}
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing"):
        read_checkpoint_header(tmp_path)


def test_corrupt_files_get_one_clear_message(released_checkpoint):
    folder, _ = released_checkpoint(weights="safetensors")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        read_checkpoint_header(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON") as raised:
        read_checkpoint_header(folder)
    assert isinstance(raised.value.__cause__, json.JSONDecodeError)  # the cause stays for Python callers


def test_a_cli_error_with_a_cause_is_still_one_line(released_checkpoint, capsys):
    from gated_qwen.cli import main

    folder, _ = released_checkpoint(weights="safetensors")
    (folder / "config.json").write_text("{not json")
    assert main(["inspect", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "not valid JSON" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_offsets_locate_each_tensors_bytes(tmp_path):
    tensors = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.arange(4, dtype=torch.bfloat16)}
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    data = path.read_bytes()
    stored = CheckpointTensors([path])
    assert stored.infos.keys() == tensors.keys()
    for name, tensor in tensors.items():
        start, end = stored.stored(name).start, stored.stored(name).end
        assert data[start:end] == tensor.view(-1).view(torch.uint8).numpy().tobytes(), name
    path.write_bytes(data[:-4])  # the last tensor's bytes cut short
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        CheckpointTensors([path])
    path.write_bytes(b"\x04\x00\x00\x00\x00\x00\x00\x00{no}")
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        CheckpointTensors([path])


def test_missing_folder_and_missing_config(tmp_path):
    with pytest.raises(GatedQwenError, match="nothing does not exist: there is no such folder"):
        read_checkpoint_header(tmp_path / "nothing")
    with pytest.raises(CheckpointError, match="no config.json"):
        read_checkpoint_header(tmp_path)


def test_layout_check_names_layer_shapes_and_implied_gate(released_checkpoint):
    """On the released layout: the shapes come from the .bin's pickle, the config says model_type qwen2."""
    folder, _ = released_checkpoint(gate="elementwise")
    tensors = read_checkpoint_header(folder).tensors
    check_weights_match_config(tiny_config(gate="elementwise"), tensors)
    with pytest.raises(
        CheckpointError, match=r"q_proj.weight has shape \(64, 32\).*expects \(36, 32\).*'elementwise' gate"
    ):
        check_weights_match_config(tiny_config(gate="headwise"), tensors)
