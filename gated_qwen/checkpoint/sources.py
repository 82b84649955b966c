"""Where a checkpoint comes from: a local folder or a hub repository (``subfolder``, ``revision``), read as headers
(:func:`read_checkpoint_header`) or fetched as the files needed (config, one weight format, tokenizer, generation
config; never Python files). A source that cannot be read is refused by :mod:`gated_qwen.checkpoint.hub`.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import CheckpointError, GatedQwenError
from .formats import (
    AUXILIARY_FILES,
    CONFIG_NAME,
    WEIGHT_FILES,
    WEIGHT_PATTERNS,
    CheckpointHeader,
    TensorInfo,
    local_weight_files,
    read_json,
    read_weight_file_header,
)
from .hub import looks_like_path, resolve_source, source_location


def read_checkpoint_header(
    path_or_repo_id: str | os.PathLike, subfolder: str = "", revision: str | None = None, token=None
) -> CheckpointHeader:
    """Config and tensor shapes of a local checkpoint folder or a hub repository, without the weights (on the hub,
    config.json, the index and safetensors headers by HTTP range reads; of pickle weights only the file sizes).

    >>> from gated_qwen.default_models import default_model_path
    >>> models = default_model_path().parent  # headwise/ and baseline/, as the hub repository holds its arms
    >>> header = read_checkpoint_header(models, subfolder="headwise")
    >>> header.weights_format, header.tensors["model.layers.0.self_attn.q_proj.weight"]
    ('safetensors', TensorInfo(shape=(260, 256), dtype='BF16'))
    """
    local = Path(path_or_repo_id) / subfolder
    if not local.is_dir():
        return _read_hub_header(str(path_or_repo_id), subfolder, revision, token)
    header = CheckpointHeader(str(local), read_config_json(local))
    files = local_weight_files(local)
    header.weights_format = ("safetensors" if files[0].suffix == ".safetensors" else "pytorch") if files else None
    for file in files:
        header.tensors.update(read_weight_file_header(file))
        header.files.append(str(file))
        header.file_sizes[str(file)] = file.stat().st_size
    return header


def _hub_weight_files(
    repo_id: str, subfolder: str = "", revision: str | None = None, token=None
) -> tuple[str | None, dict[str, int]]:
    """The weight format of a hub checkpoint (safetensors where it has them) and its weight files with their
    sizes, from the repository's listing and its index; ``(None, {})`` where there are no weights."""
    from huggingface_hub import HfApi, hf_hub_download

    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    listed = {
        entry.path: entry.size
        for entry in HfApi(token=token).list_repo_tree(repo_id, path_in_repo=subfolder or None, revision=revision)
        if getattr(entry, "size", None) is not None
    }
    for format_name, (index_name, single_name) in WEIGHT_FILES.items():
        if prefix + index_name in listed:
            index = hf_hub_download(repo_id, index_name, subfolder=subfolder or None, revision=revision, token=token)
            names = dict.fromkeys(read_json(index, "weights index").get("weight_map", {}).values())
            if any(prefix + name not in listed for name in names):
                raise CheckpointError(f"{source_location(repo_id, subfolder)}: {index_name} names a shard it lacks")
        elif prefix + single_name in listed:
            names = [single_name]
        else:
            continue
        return format_name, {prefix + name: listed[prefix + name] for name in names}
    return None, {}


def _read_hub_header(repo_id: str, subfolder: str, revision: str | None, token) -> CheckpointHeader:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    header = CheckpointHeader(
        source_location(repo_id, subfolder), read_config_json(repo_id, subfolder, revision, token)
    )
    try:
        header.weights_format, header.file_sizes = _hub_weight_files(repo_id, subfolder, revision, token)
        header.files = list(header.file_sizes)
        if header.weights_format == "safetensors":  # headers by HTTP range reads; a pickle's need the whole file
            for filename in header.files:
                metadata = HfApi(token=token).parse_safetensors_file_metadata(repo_id, filename, revision=revision)
                header.tensors.update({k: TensorInfo(tuple(v.shape), v.dtype) for k, v in metadata.tensors.items()})
    except (HfHubHTTPError, OSError) as error:
        raise _hub_failure(repo_id, error, "read") from error
    return header


def _check_hub_source(src, subfolder: str, revision: str | None, token=None) -> None:
    """Refuse at once a ``src`` that is not a local folder and cannot be a usable hub id (a file, a path, or what
    :func:`~gated_qwen.checkpoint.hub.resolve_source` refuses: offline, no network, an unknown repository)."""
    if Path(src).expanduser().exists() or looks_like_path(str(src)):
        raise CheckpointError(f"{src} is not a folder; give a checkpoint folder or a hub id like owner/name")
    resolve_source(str(src), subfolder, revision, token)


def _hub_failure(src, error: BaseException, doing: str) -> CheckpointError:
    """The one line for a hub request that failed once :func:`_check_hub_source` had passed."""
    return CheckpointError(
        f"{src} is not a local folder and could not be {doing} from the hub ({' '.join(str(error).split())}); "
        "check the path or hub id, the revision, or the network"
    )


def read_config_json(src: str | os.PathLike, subfolder: str = "", revision: str | None = None, token=None) -> dict:
    """A checkpoint's config.json as a dict, from a local folder or, downloading that file alone, the hub: a
    command that can refuse a checkpoint from its config alone costs no weight download.

    >>> from gated_qwen.default_models import default_model_path
    >>> models = default_model_path().parent  # headwise/ and baseline/, as the hub repository holds its arms
    >>> read_config_json(models, "headwise")["model_type"]
    'qwen3_gated'
    """
    local = Path(src).expanduser()
    if local.is_dir():
        path = local / subfolder / CONFIG_NAME
        if not path.is_file():
            raise CheckpointError(f"{path.parent} has no config.json; it is not a model checkpoint folder")
        return read_json(path, "model config")
    _check_hub_source(src, subfolder, revision, token)
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError

    try:
        path = hf_hub_download(str(src), CONFIG_NAME, subfolder=subfolder or None, revision=revision, token=token)
    except EntryNotFoundError as error:
        raise CheckpointError(
            f"{source_location(str(src), subfolder)} has no config.json; it is not a model checkpoint"
        ) from error
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as error:
        raise _hub_failure(src, error, "read") from error
    return read_json(path, "model config")


def checkpoint_folder(src: str | os.PathLike, subfolder: str = "", revision: str | None = None) -> Path:
    """The local folder holding a checkpoint: ``src/subfolder``, or a hub snapshot of only the files needed
    (config.json, one weight format, :data:`AUXILIARY_FILES`; never Python files).

    >>> from gated_qwen.default_models import default_model_path
    >>> models = default_model_path().parent  # headwise/ and baseline/, as the hub repository holds its arms
    >>> checkpoint_folder(models, "headwise") == models / "headwise"  # a local folder is used where it lies
    True
    """
    local = Path(src).expanduser()
    if local.is_dir():
        if not (local / subfolder).is_dir():
            raise GatedQwenError(f"{local} has no subfolder {subfolder!r}")
        return local / subfolder
    _check_hub_source(src, subfolder, revision)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    try:
        format_name, _ = _hub_weight_files(str(src), subfolder, revision)
        patterns = [
            CONFIG_NAME,
            *AUXILIARY_FILES,
            "additional_chat_templates/*",
            *WEIGHT_PATTERNS.get(format_name, ()),
        ]
        snapshot = snapshot_download(str(src), revision=revision, allow_patterns=[prefix + p for p in patterns])
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as error:
        raise _hub_failure(src, error, "downloaded") from error
    if not (Path(snapshot) / subfolder / CONFIG_NAME).is_file():
        raise CheckpointError(
            f"{source_location(str(src), subfolder)} has no {CONFIG_NAME}; it is not a model checkpoint"
        )
    return Path(snapshot) / subfolder


def read_source_checkpoint(
    src: str | os.PathLike, subfolder: str, revision: str | None, dst: Path, output: str
) -> CheckpointHeader:
    """The header of the checkpoint a command reads to write the folder ``dst`` (``output`` names what it writes),
    from :func:`checkpoint_folder`; a source and DST inside one another, or a source without weights, are refused.

    >>> from gated_qwen.default_models import default_model_path
    >>> arm = default_model_path("headwise")
    >>> read_source_checkpoint(str(arm), "", None, arm / "out", "export")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    gated_qwen.errors.GatedQwenError: .../headwise/out and the source .../headwise overlap; write the export elsewhere
    """
    folder = checkpoint_folder(src, subfolder, revision)
    for inside, outside in ((dst, folder), (folder, dst)):
        if inside.resolve().is_relative_to(outside.resolve()):
            raise GatedQwenError(f"{dst} and the source {folder} overlap; write the {output} elsewhere")
    header = read_checkpoint_header(folder)
    if not header.tensors:
        raise CheckpointError(f"{folder} has no weights (model.safetensors, pytorch_model.bin, or an index of either)")
    return header
