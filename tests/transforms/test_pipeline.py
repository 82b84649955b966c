"""The streaming pipeline convert and export share, on a checkpoint of three plain tensors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from gated_qwen.checkpoint import TensorInfo
from gated_qwen.errors import CheckpointError
from gated_qwen.transforms.pipeline import TensorMapping, plan_tensors, transform_checkpoint


TENSORS = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4), "c": torch.full((2,), 3.0)}


@pytest.fixture
def source(tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    save_file(TENSORS, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"model_type": "toy"}))
    (folder / "tokenizer.json").write_text("{}")
    return folder


def doubling_b(calls=None) -> TensorMapping:
    """Doubles b, renames c to d, leaves a as it is."""

    def map_tensor(name, tensor):
        if calls is not None and tensor.device.type != "meta":
            calls.append(name)
        if name == "b":
            return [("b", tensor * 2)]
        if name == "c":
            return [("d", tensor)]
        return [(name, tensor)]

    return TensorMapping(
        map_tensor=map_tensor,
        target_shapes={"a": (2, 3), "b": (4,), "d": (2,)},
        write_config=lambda folder: (folder / "config.json").write_text(json.dumps({"model_type": "toy2"})),
    )


def test_unchanged_tensors_are_copied_unread_and_the_rest_mapped(source, tmp_path):
    calls = []
    written = transform_checkpoint(
        source,
        tmp_path / "dst",
        lambda header, dtype: doubling_b(calls),
        output_name="copy",
        description="copying",
        progress=False,
    )
    out = load_file(written.path / "model.safetensors")
    assert torch.equal(out["a"], TENSORS["a"]) and torch.equal(out["b"], TENSORS["b"] * 2)
    assert torch.equal(out["d"], TENSORS["c"]) and "c" not in out
    assert written.plan.unchanged == {"a"}  # renamed c is not "unchanged": its name changes
    assert sorted(calls) == ["b", "c"]  # a was never read into a tensor
    assert json.loads((written.path / "config.json").read_text()) == {"model_type": "toy2"}
    assert (written.path / "tokenizer.json").is_file()


def test_a_cast_applies_before_the_mapping_and_to_copied_tensors(source, tmp_path):
    written = transform_checkpoint(
        source,
        tmp_path / "dst",
        lambda header, dtype: doubling_b(),
        output_name="copy",
        description="copying",
        dtype="bfloat16",
        progress=False,
    )
    out = load_file(written.path / "model.safetensors")
    assert {t.dtype for t in out.values()} == {torch.bfloat16}
    assert written.plan.unchanged == set()


@pytest.mark.parametrize(
    "target, problem",
    [
        ({"a": (2, 3), "b": (4,)}, "unexpected: d"),
        ({"a": (2, 3), "b": (4,), "d": (2,), "e": (1,)}, "missing: e"),
        ({"a": (3, 2), "b": (4,), "d": (2,)}, "wrong shape: a"),
    ],
)
def test_a_plan_that_does_not_fit_the_target_is_refused_before_any_data(target, problem):
    mapping = doubling_b()
    mapping.target_shapes = target
    infos = {name: TensorInfo(tuple(t.shape), "F32") for name, t in TENSORS.items()}
    with pytest.raises(CheckpointError, match=problem):
        plan_tensors(infos, mapping, None, "src")


def test_integer_tensors_are_refused():
    with pytest.raises(CheckpointError, match="only floating-point"):
        plan_tensors({"a": TensorInfo((2,), "I64")}, doubling_b(), None, "src")


def test_a_failure_while_writing_leaves_no_destination(source, tmp_path):
    def failing(name, tensor):
        if name == "b" and tensor.device.type != "meta":
            raise RuntimeError("disk on fire")
        return doubling_b().map_tensor(name, tensor)

    mapping = doubling_b()
    mapping.map_tensor = failing
    with pytest.raises(RuntimeError, match="disk on fire"):
        transform_checkpoint(
            source,
            tmp_path / "dst",
            lambda header, dtype: mapping,
            output_name="copy",
            description="copying",
            progress=False,
        )
    assert not (tmp_path / "dst").exists()
    assert sorted(p.name for p in source.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
