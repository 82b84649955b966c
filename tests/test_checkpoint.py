import json

import pytest
from conftest import tiny_config
from safetensors.torch import save_file
import torch

from gated_qwen.checkpoint import (
    check_q_proj_layout,
    read_checkpoint_header,
    read_local_safetensors_offsets,
    resolve_weight_files,
)
from gated_qwen.errors import CheckpointError


def test_header_reads_shapes_without_the_weights(released_checkpoint):
    folder, spec = released_checkpoint(gate="elementwise")
    header = read_checkpoint_header(folder)
    assert header.config["model_type"] == "qwen3"
    assert set(header.tensors) == set(spec["tensors"])
    assert header.tensors["model.layers.0.self_attn.q_proj.weight"].shape == (64, 32)
    assert header.tensors["model.layers.0.self_attn.q_proj.weight"].dtype == "F32"


def test_sharded_checkpoints_are_read_through_their_index(tmp_path):
    tensors = {"a": torch.zeros(2, 3), "b": torch.zeros(4)}
    save_file({"a": tensors["a"]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": tensors["b"]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text("{}")
    assert len(resolve_weight_files(tmp_path)) == 2
    assert {k: v.shape for k, v in read_checkpoint_header(tmp_path).tensors.items()} == {"a": (2, 3), "b": (4,)}
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing"):
        read_checkpoint_header(tmp_path)


def test_corrupt_files_get_one_clear_message(released_checkpoint):
    folder, _ = released_checkpoint()
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        read_checkpoint_header(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_checkpoint_header(folder)


def test_offsets_locate_each_tensors_bytes(tmp_path):
    tensors = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.arange(4, dtype=torch.bfloat16)}
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    data = path.read_bytes()
    offsets = read_local_safetensors_offsets(path)
    assert offsets.keys() == tensors.keys()
    for name, tensor in tensors.items():
        start, end = offsets[name]
        assert data[start:end] == tensor.view(-1).view(torch.uint8).numpy().tobytes(), name
    path.write_bytes(data[:-4])  # the last tensor's bytes cut short
    with pytest.raises(CheckpointError, match="shorter than its header says"):
        read_local_safetensors_offsets(path)
    path.write_bytes(b"\x04\x00\x00\x00\x00\x00\x00\x00{no}")
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        read_local_safetensors_offsets(path)


def test_missing_folder_and_missing_config(tmp_path):
    with pytest.raises(CheckpointError, match="not a folder"):
        read_checkpoint_header(tmp_path / "nothing")
    with pytest.raises(CheckpointError, match="no config.json"):
        read_checkpoint_header(tmp_path)


def test_layout_check_names_layer_shapes_and_implied_gate(released_checkpoint):
    folder, _ = released_checkpoint(gate="elementwise")
    tensors = read_checkpoint_header(folder).tensors
    check_q_proj_layout(tiny_config(gate="elementwise"), tensors)
    with pytest.raises(CheckpointError, match=r"q_proj.weight has shape \(64, 32\).*expects \(36, 32\).*'elementwise' gate"):
        check_q_proj_layout(tiny_config(gate="headwise"), tensors)
