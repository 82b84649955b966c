"""Where a checkpoint comes from: a local folder or a hub repository, read as headers or fetched as files.

Commands and ``from_pretrained`` take a checkpoint as a folder or a hub id (with ``subfolder`` and
``revision``). The functions here find its config and weight files, read its tensor shapes without the
weights (:func:`read_checkpoint_header`), and fetch from the hub only what is needed (config, one weight
format, tokenizer, generation config; never Python files). File formats themselves are
:mod:`gated_qwen.checkpoint.formats`; hub probing and error messages are :mod:`gated_qwen.checkpoint.hub`.
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
    weights_format,
)
from .hub import looks_like_path, resolve_source, source_location


def read_checkpoint_header(
    path_or_repo_id: str | os.PathLike,
    subfolder: str = "",
    revision: str | None = None,
    token: str | bool | None = None,
) -> CheckpointHeader:
    """Config and tensor shapes of a local checkpoint folder or a hub repository, without the weights.

    Locally, safetensors headers are read, or a ``pytorch_model.bin``'s pickle without its data. On the
    hub only config.json, the index and the safetensors headers are fetched (HTTP range reads); of
    pickle weights only the file sizes can be had without the download.

    >>> from gated_qwen.default_models import default_model_path
    >>> models = default_model_path().parent  # headwise/ and baseline/, as the hub repository holds its arms
    >>> header = read_checkpoint_header(models, subfolder="headwise")
    >>> header.weights_format, header.tensors["model.layers.0.self_attn.q_proj.weight"]
    ('safetensors', TensorInfo(shape=(260, 256), dtype='BF16'))
    """
    local = Path(path_or_repo_id) / subfolder
    if local.is_dir():
        config_path = local / CONFIG_NAME
        if not config_path.is_file():
            raise CheckpointError(f"{local} has no {CONFIG_NAME}; it is not a model checkpoint folder")
        header = CheckpointHeader(str(local), read_json(config_path, "model config"))
        files = local_weight_files(local)
        header.weights_format = weights_format(files)
        for file in files:
            header.tensors.update(read_weight_file_header(file))
            header.files.append(str(file))
            header.file_sizes[str(file)] = file.stat().st_size
        return header
    _check_hub_source(path_or_repo_id, subfolder, revision, token)
    return _read_hub_header(str(path_or_repo_id), subfolder, revision, token)


def hub_weight_files(
    repo_id: str, subfolder: str = "", revision: str | None = None, token=None
) -> tuple[str | None, dict[str, int]]:
    """The weight format of a hub checkpoint and its weight files with their sizes, from the repository's listing.

    Safetensors where the repository has them, else ``pytorch_model.bin``; an index's shards are
    read from the index. ``(None, {})`` where there are no weights.

    >>> hub_weight_files("QwQZh/gated_attention", "1B_gate_headwise")  # needs the network  # doctest: +SKIP
    ('pytorch', {'1B_gate_headwise/pytorch_model.bin': 3443587890})
    """
    from huggingface_hub import HfApi, hf_hub_download

    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    listed = {
        entry.path: entry.size
        for entry in HfApi(token=token).list_repo_tree(repo_id, path_in_repo=subfolder or None, revision=revision)
        if getattr(entry, "size", None) is not None
    }
    for format_name, (index_name, single_name) in WEIGHT_FILES.items():
        if prefix + index_name in listed:
            index = Path(
                hf_hub_download(repo_id, index_name, subfolder=subfolder or None, revision=revision, token=token)
            )
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
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    where = source_location(repo_id, subfolder)
    try:
        try:
            config_path = hf_hub_download(
                repo_id, CONFIG_NAME, subfolder=subfolder or None, revision=revision, token=token
            )
        except EntryNotFoundError as error:
            raise CheckpointError(f"{where} has no {CONFIG_NAME}; it is not a model checkpoint") from error
        header = CheckpointHeader(where, read_json(config_path, "model config"))
        header.weights_format, header.file_sizes = hub_weight_files(repo_id, subfolder, revision, token)
        header.files = list(header.file_sizes)
        if header.weights_format == "safetensors":  # headers by HTTP range reads; a pickle's need the whole file
            api = HfApi(token=token)
            for filename in header.files:
                metadata = api.parse_safetensors_file_metadata(repo_id, filename, revision=revision)
                header.tensors.update({k: TensorInfo(tuple(v.shape), v.dtype) for k, v in metadata.tensors.items()})
        return header
    except CheckpointError:
        raise
    except (HfHubHTTPError, OSError) as error:
        raise CheckpointError(
            f"could not read {where} from the hub ({error}); check the id, or the network"
        ) from error


def _check_hub_source(src, subfolder: str, revision: str | None, token: str | bool | None = None) -> None:
    """Refuse, in one line and at once, a ``src`` that is not a local folder and cannot be a usable hub id:
    a file, a path, or (:func:`gated_qwen.checkpoint.hub.resolve_source`) offline, no network, an unknown repository."""
    if Path(src).expanduser().exists() or looks_like_path(str(src)):
        raise CheckpointError(f"{src} is not a folder; give a checkpoint folder or a hub id like owner/name")
    resolve_source(str(src), subfolder, revision, token)


def _hub_failure(src, error: BaseException, doing: str) -> CheckpointError:
    """The one line for a hub request that failed after :func:`gated_qwen.checkpoint.hub.resolve_source` found the source."""
    reason = " ".join(str(error).split())
    return CheckpointError(
        f"{src} is not a local folder and could not be {doing} from the hub ({reason}); "
        "check the path or hub id, the revision, or the network"
    )


def read_config_json(src: str | os.PathLike, subfolder: str = "", revision: str | None = None) -> dict:
    """A checkpoint's config.json as a dict, from a local folder or, downloading that file alone, the hub.

    Commands that can refuse a checkpoint from its config alone read it first, so that a refusal costs
    no weight download.

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
    _check_hub_source(src, subfolder, revision)
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError

    try:
        return read_json(
            hf_hub_download(str(src), CONFIG_NAME, subfolder=subfolder or None, revision=revision), "model config"
        )
    except EntryNotFoundError as error:
        raise CheckpointError(
            f"{source_location(str(src), subfolder)} has no config.json; it is not a model checkpoint"
        ) from error
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as error:
        raise _hub_failure(src, error, "read") from error


def checkpoint_folder(src: str | os.PathLike, subfolder: str = "", revision: str | None = None) -> Path:
    """The local folder holding a checkpoint: ``src/subfolder``, or a hub snapshot of only the files needed.

    From the hub come config.json, one weight format (safetensors where the repository has them, else
    ``pytorch_model.bin``), the tokenizer and generation config (:data:`AUXILIARY_FILES`); never Python files.

    >>> from gated_qwen.default_models import default_model_path
    >>> models = default_model_path().parent  # headwise/ and baseline/, as the hub repository holds its arms
    >>> checkpoint_folder(models, "headwise") == models / "headwise"  # a local folder is used where it lies
    True
    """
    local = Path(src).expanduser()
    if local.is_dir():
        folder = local / subfolder
        if not folder.is_dir():
            raise GatedQwenError(f"{local} has no subfolder {subfolder!r}")
        return folder
    _check_hub_source(src, subfolder, revision)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    try:
        format_name, _ = hub_weight_files(str(src), subfolder, revision)
        patterns = [CONFIG_NAME, *AUXILIARY_FILES, "additional_chat_templates/*"]
        patterns += list(WEIGHT_PATTERNS[format_name]) if format_name else []
        snapshot = snapshot_download(str(src), revision=revision, allow_patterns=[prefix + p for p in patterns])
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as error:
        raise _hub_failure(src, error, "downloaded") from error
    folder = Path(snapshot) / subfolder
    if not (folder / CONFIG_NAME).is_file():
        raise CheckpointError(
            f"{source_location(str(src), subfolder)} has no {CONFIG_NAME}; it is not a model checkpoint"
        )
    return folder


def read_source_checkpoint(
    src: str | os.PathLike, subfolder: str, revision: str | None, dst: Path, output: str
) -> CheckpointHeader:
    """The header of the checkpoint a command reads to write the folder ``dst`` (``output`` names what it writes).

    The source is :func:`checkpoint_folder`'s (a hub snapshot of only the files needed); a source and DST
    that lie inside one another, and a source without weights, are refused before anything is written.

    >>> import tempfile
    >>> import gated_qwen
    >>> arm = Path(gated_qwen.__file__).parent / "default_models" / "headwise"  # the embedded 4.2M model
    >>> read_source_checkpoint(str(arm), "", None, Path(tempfile.mkdtemp()) / "out", "export").weights_format
    'safetensors'
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
