"""Reading checkpoints without loading them: config.json and safetensors headers, local or on the hub.

Used by ``from_pretrained`` (to refuse a q_proj that does not match the config before any weight is
read), by ``gated-qwen inspect`` and by the converter. Nothing here runs code from a checkpoint or
unpickles anything.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from .errors import CheckpointError
from .hub import resolve_source
from .layout import gate_type_for_rows, q_proj_rows

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"


# safetensors' dtype codes and the torch dtypes they hold
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip
SAFETENSORS_CODES = {dtype: code for code, dtype in SAFETENSORS_DTYPES.items()}


@dataclass
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str  # safetensors spelling: "F32", "BF16", ...

    @property
    def numel(self) -> int:
        n = 1
        for size in self.shape:
            n *= size
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * SAFETENSORS_DTYPES[self.dtype].itemsize


@dataclass
class CheckpointHeader:
    """What a checkpoint holds, read from its config.json and safetensors headers only."""

    source: str
    config: dict
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


def _read_json(path: str | os.PathLike, what: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path} is not valid JSON ({error}); the {what} is corrupt or truncated") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} does not hold a JSON object; it is not a {what}")
    return data


def read_local_safetensors_header(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """Names, shapes and dtypes of the tensors in one local safetensors file, without reading them.

    >>> read_local_safetensors_header("model.safetensors")  # doctest: +SKIP
    {'model.embed_tokens.weight': TensorInfo(shape=(151936, 2048), dtype='BF16'), ...}
    """
    try:
        with safe_open(os.fspath(path), framework="pt") as handle:
            return {
                name: TensorInfo(tuple(handle.get_slice(name).get_shape()), handle.get_slice(name).get_dtype())
                for name in handle.keys()
            }
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist") from None
    except Exception as error:  # safetensors raises its own SafetensorError for a bad header
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({error}); it is corrupt or truncated: download or write it again"
        ) from None


def read_local_safetensors_offsets(path: str | os.PathLike) -> dict[str, tuple[int, int]]:
    """Where each tensor's bytes lie in one local safetensors file: ``(start, end)`` from the file's start.

    The converter copies unchanged tensors with these, byte for byte, without reading them into memory.

    >>> read_local_safetensors_offsets("model.safetensors")["model.norm.weight"]  # doctest: +SKIP
    (3441427968, 3441432064)
    """
    try:
        with open(path, "rb") as handle:
            (header_size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(header_size))
            file_size = os.fstat(handle.fileno()).st_size
        data_start = 8 + header_size
        offsets = {
            name: (data_start + entry["data_offsets"][0], data_start + entry["data_offsets"][1])
            for name, entry in header.items()
            if name != "__metadata__"
        }
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist") from None
    except (struct.error, ValueError, TypeError, KeyError, IndexError) as error:
        raise CheckpointError(f"{path} is not a readable safetensors file ({error}); it is corrupt or truncated") from None
    if any(end > file_size or start > end for start, end in offsets.values()):
        raise CheckpointError(f"{path} is shorter than its header says; it is corrupt or truncated: download or write it again")
    return offsets


def local_weight_files(folder: str | os.PathLike) -> list[Path]:
    """The safetensors files of a local checkpoint folder: the shards its index names, or the single file."""
    folder = Path(folder)
    index = folder / SAFE_WEIGHTS_INDEX_NAME
    if index.is_file():
        weight_map = _read_json(index, "safetensors index").get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index} has no weight_map; the index is corrupt")
        files = [folder / name for name in dict.fromkeys(weight_map.values())]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shards that are missing: {', '.join(missing)}")
        return files
    single = folder / SAFE_WEIGHTS_NAME
    return [single] if single.is_file() else []


def read_checkpoint_header(
    path_or_repo_id: str | os.PathLike,
    subfolder: str = "",
    revision: str | None = None,
    token: str | bool | None = None,
) -> CheckpointHeader:
    """Config and tensor shapes of a local checkpoint folder or a hub repository, without the weights.

    On the hub only config.json, the index and the safetensors headers are fetched (HTTP range reads).

    >>> header = read_checkpoint_header("QwQZh/gated_attention", subfolder="1B_gate_headwise")  # doctest: +SKIP
    >>> header.tensors["model.layers.0.self_attn.q_proj.weight"].shape  # doctest: +SKIP
    (2064, 2048)
    """
    local = Path(path_or_repo_id) / subfolder
    if local.is_dir():
        config_path = local / CONFIG_NAME
        if not config_path.is_file():
            raise CheckpointError(f"{local} has no {CONFIG_NAME}; it is not a model checkpoint folder")
        header = CheckpointHeader(str(local), _read_json(config_path, "model config"))
        for file in local_weight_files(local):
            header.tensors.update(read_local_safetensors_header(file))
            header.files.append(str(file))
        return header
    if Path(path_or_repo_id).exists() or str(path_or_repo_id).startswith((".", "/", "~")):
        raise CheckpointError(f"{local} is not a folder; give a checkpoint folder or a hub id like owner/name")
    resolve_source(str(path_or_repo_id), subfolder, revision, token)  # offline, no network, unknown repo: said at once
    return _read_hub_header(str(path_or_repo_id), subfolder, revision, token)


def _read_hub_header(repo_id: str, subfolder: str, revision: str | None, token) -> CheckpointHeader:
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    def fetch_json(name: str, what: str) -> dict | None:
        try:
            return _read_json(hf_hub_download(repo_id, name, subfolder=subfolder or None, revision=revision, token=token), what)
        except EntryNotFoundError:
            return None

    where = f"{repo_id}" + (f" (subfolder {subfolder})" if subfolder else "")
    try:
        config = fetch_json(CONFIG_NAME, "model config")
        if config is None:
            raise CheckpointError(f"{where} has no {CONFIG_NAME}; it is not a model checkpoint")
        header = CheckpointHeader(where, config)
        index = fetch_json(SAFE_WEIGHTS_INDEX_NAME, "safetensors index")
        names = list(dict.fromkeys(index["weight_map"].values())) if index else [SAFE_WEIGHTS_NAME]
        api = HfApi(token=token)
        for name in names:
            filename = f"{subfolder}/{name}" if subfolder else name
            try:
                metadata = api.parse_safetensors_file_metadata(repo_id, filename, revision=revision)
            except EntryNotFoundError:
                continue
            header.tensors.update({k: TensorInfo(tuple(v.shape), v.dtype) for k, v in metadata.tensors.items()})
            header.files.append(filename)
        return header
    except CheckpointError:
        raise
    except (HfHubHTTPError, OSError) as error:
        raise CheckpointError(f"could not read {where} from the hub ({error}); check the id, or the network") from None


HUB_KWARGS = ("subfolder", "revision", "cache_dir", "token", "local_files_only", "force_download", "proxies")


def resolve_weight_files(path_or_repo_id: str | os.PathLike, **hub_kwargs) -> list[str]:
    """Local paths of a checkpoint's safetensors files (downloaded into the hub cache if need be).

    Takes from_pretrained's hub arguments (``subfolder``, ``revision``, ...); returns [] when the
    checkpoint has no safetensors weights.

    >>> resolve_weight_files("QwQZh/gated_attention", subfolder="1B_baseline")  # doctest: +SKIP
    ['/root/.cache/huggingface/hub/.../1B_baseline/model.safetensors']
    """
    from transformers.utils import cached_file

    hub_kwargs = {k: v for k, v in hub_kwargs.items() if k in HUB_KWARGS}

    def fetch(name: str) -> str | None:
        return cached_file(
            path_or_repo_id, name, _raise_exceptions_for_missing_entries=False, **hub_kwargs
        )

    index = fetch(SAFE_WEIGHTS_INDEX_NAME)
    if index is None:
        single = fetch(SAFE_WEIGHTS_NAME)
        return [single] if single else []
    weight_map = _read_json(index, "safetensors index").get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index} has no weight_map; the index is corrupt")
    files = []
    for name in dict.fromkeys(weight_map.values()):
        shard = fetch(name)
        if shard is None:
            raise CheckpointError(f"{index} names the shard {name}, which is missing")
        files.append(shard)
    return files


def check_q_proj_layout(config, tensors: dict[str, TensorInfo], source: str = "the checkpoint") -> None:
    """Refuse a checkpoint whose q_proj rows do not match ``config``'s gate type.

    Raises :class:`CheckpointError` naming the layer, the expected and found shapes, and the gate type
    the found shape implies, so that gate rows are never silently dropped or initialised at random.

    >>> check_q_proj_layout(config, read_checkpoint_header(folder).tensors)  # doctest: +SKIP
    """
    head_dim = config.head_dim  # a Qwen3GatedConfig always has one (Qwen3Config's default: 128)
    expected_rows = q_proj_rows(config.gate_type, config.num_attention_heads, head_dim)
    for layer in range(config.num_hidden_layers):
        name = f"model.layers.{layer}.self_attn.q_proj.weight"
        info = tensors.get(name) or tensors.get(name.removeprefix("model."))
        if info is None:
            continue
        expected = (expected_rows, config.hidden_size)
        if tuple(info.shape) != expected:
            implied = gate_type_for_rows(info.shape[0], config.num_attention_heads, head_dim)
            implied_text = (
                f"that is the shape of a {implied!r} gate" if implied else "no gate type has that many rows"
            )
            raise CheckpointError(
                f"{source}: {name} has shape {tuple(info.shape)} but the config (gate type {config.gate_type!r}, "
                f"{config.num_attention_heads} heads of dim {head_dim}) expects {expected}; {implied_text}. "
                "Use the config.json that came with these weights."
            )
