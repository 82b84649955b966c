"""Where a checkpoint comes from: a local folder or a hub repository (``subfolder``, ``revision``), checked before
anything heavy runs (:func:`resolve_source`: one line for a missing path, a file, a missing subfolder, no network,
the hub switched off without the files cached, an unknown or gated repository; one probe without retries, where
huggingface_hub retries a download for about 25 s), then read as headers (:func:`read_checkpoint_header`) or
fetched as the files needed (config, one weight format, tokenizer, generation config; never Python files).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from ..errors import CheckpointError, GatedQwenError
from .formats import (
    AUXILIARY_FILES,
    CONFIG_NAME,
    WEIGHT_FILES,
    CheckpointHeader,
    TensorInfo,
    read_json,
    read_weight_file_header,
    resolve_weight_files,
)


PROBE_TIMEOUT_S = 10.0


def source_location(repo_id: str, subfolder: str = "") -> str:
    """A source as messages name it.

    >>> source_location("QwQZh/gated_attention", "1B_gate_headwise")
    'QwQZh/gated_attention (subfolder 1B_gate_headwise)'
    """
    return f"{repo_id}" + (f" (subfolder {subfolder})" if subfolder else "")


def _arms(folder_names: list[str]) -> str:
    return f"; it holds {', '.join(sorted(folder_names))}: pass one with --subfolder" if folder_names else ""


def _looks_like_path(source: str) -> bool:
    """Whether ``source`` can only be a local path, not a hub id (``./x``, ``/x``, ``~/x``, ``a/b/c``, ``x/``)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(source)
    except HFValidationError:
        return True
    return False


def resolve_source(
    source: str, subfolder: str = "", revision: str | None = None, token: str | bool | None = None
) -> Path | None:
    """The local folder ``source``/``subfolder``, or None for a hub repository that can be read (one request, or a
    look into the local cache when offline); else one :class:`GatedQwenError` saying what is wrong.

    >>> from gated_qwen.default_models import default_model_path
    >>> models = default_model_path().parent  # headwise/ and baseline/, as the hub repository holds its arms
    >>> resolve_source(str(models), "headwise") == models / "headwise"
    True
    >>> resolve_source(str(models), "no_such_arm")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    gated_qwen.errors.GatedQwenError: ... has no subfolder 'no_such_arm'; it holds baseline, headwise: pass one...
    """
    source = str(source)
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise GatedQwenError(
                f"{source} is a file, not a folder; give the folder that holds the checkpoint (config.json, weights, tokenizer files)"
            )
        folder = path / subfolder
        if not folder.is_dir():
            arms = [p.name for p in path.iterdir() if (p / "config.json").is_file()]
            raise GatedQwenError(f"{path} has no subfolder {subfolder!r}{_arms(arms)}")
        return folder
    if _looks_like_path(source):
        raise GatedQwenError(f"{source} does not exist: there is no such folder")
    try:
        _check_hub_repository(source, subfolder, revision, token)
    except GatedQwenError as error:
        if "/" in source:  # owner/name: a hub id
            raise
        raise GatedQwenError(f"there is no local folder {source}, and as a hub id: {error}") from error
    return None


def _check_hub_repository(
    repo_id: str, subfolder: str = "", revision: str | None = None, token: str | bool | None = None
) -> None:
    """Refuse a hub repository (and subfolder) that cannot be read, with one request and no retries; offline, its
    ``config.json`` must be in the local cache."""
    config_name = f"{subfolder.strip('/')}/config.json" if subfolder else "config.json"
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE:
        if not isinstance(try_to_load_from_cache(repo_id, config_name, revision=revision), str):
            raise GatedQwenError(
                f"{source_location(repo_id, subfolder)} is not in the local hub cache, and the hub is switched off "
                "(HF_HUB_OFFLINE=1): unset HF_HUB_OFFLINE on a machine with network, or give a local folder"
            )
        return
    try:
        files = _repository_files(repo_id, revision, token)
    except Exception as error:  # noqa: BLE001 - classified by hub_error; anything unknown is re-raised as it is
        mapped = hub_error(error, repo_id, subfolder, revision)
        if mapped is error:
            raise
        raise mapped from error
    if files and config_name not in files:
        arms = sorted({name.rsplit("/", 2)[-2] for name in files if name.endswith("/config.json")})
        what = f"no subfolder {subfolder!r} with a config.json" if subfolder else "no config.json at its top"
        raise GatedQwenError(f"{repo_id} has {what}{_arms(arms)}")


@functools.lru_cache(maxsize=32)
def _repository_files(repo_id: str, revision: str | None, token: str | bool | None) -> tuple[str, ...]:
    """The file names of a hub repository at ``revision``: one request, remembered for the process."""
    from huggingface_hub import HfApi

    info = HfApi(token=token).model_info(repo_id, revision=revision, timeout=PROBE_TIMEOUT_S)
    return tuple(sibling.rfilename for sibling in info.siblings or ())


def hub_error(error: BaseException, repo_id: str, subfolder: str = "", revision: str | None = None) -> BaseException:
    """The one-line :class:`GatedQwenError` for an error huggingface_hub raised, or ``error`` itself if unknown.

    >>> from huggingface_hub.errors import OfflineModeIsEnabled
    >>> print(hub_error(OfflineModeIsEnabled("offline"), "owner/name"))
    owner/name cannot be read: the hub is switched off (HF_HUB_OFFLINE=1) and the files are not in the local cache
    """
    from huggingface_hub import constants, errors

    if isinstance(error, GatedQwenError):
        return error
    where, reason = source_location(repo_id, subfolder), " ".join(str(error).split())[:200]
    # fmt: off
    for matches, message in (  # the first that matches (a GatedRepoError is a RepositoryNotFoundError too)
        (isinstance(error, errors.OfflineModeIsEnabled), f"{where} cannot be read: the hub is switched off (HF_HUB_OFFLINE=1) and the files are not in the local cache"),
        (isinstance(error, errors.GatedRepoError), f"{repo_id} is a gated repository: accept its terms on its hub page, then log in (hf auth login)"),
        (isinstance(error, errors.RepositoryNotFoundError), f"{repo_id} is neither a local folder nor a repository on the hub (or it is private: log in with hf auth login)"),
        (isinstance(error, errors.RevisionNotFoundError), f"{repo_id} has no revision {revision!r} on the hub"),
        (isinstance(error, errors.LocalEntryNotFoundError) or _is_connection_error(error), f"{where} cannot be read: the hub ({constants.ENDPOINT}) cannot be reached ({reason}); check the network, or set HF_HUB_OFFLINE=1 to use files already in the local cache"),
        (isinstance(error, errors.EntryNotFoundError), f"{where} lacks a file it needs ({reason})"),
    ):
        if matches:
            return GatedQwenError(message)
    # fmt: on
    return error


def _is_connection_error(error: BaseException) -> bool:
    """A failure to reach a server: socket errors, and the HTTP library's transport errors (httpx or httpx2)."""
    if isinstance(error, (ConnectionError, TimeoutError)) or (isinstance(error, OSError) and error.errno is not None):
        return True
    return any(cls.__name__ in ("TransportError", "ConnectionError", "Timeout") for cls in type(error).__mro__)


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
    local = resolve_source(str(path_or_repo_id), subfolder, revision, token)
    if local is None:
        return _read_hub_header(str(path_or_repo_id), subfolder, revision, token)
    header = CheckpointHeader(str(local), read_config_json(local))
    files = resolve_weight_files(local)
    header.weights_format = ("safetensors" if files[0].endswith(".safetensors") else "pytorch") if files else None
    for file in files:
        header.tensors.update(read_weight_file_header(file))
        header.files.append(file)
        header.file_sizes[file] = os.path.getsize(file)
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


def _hub_failure(src, error: BaseException, doing: str) -> CheckpointError:
    """The one line for a hub request that failed once :func:`resolve_source` had passed."""
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
    local = resolve_source(str(src), subfolder, revision, token)
    if local is not None:
        if not (local / CONFIG_NAME).is_file():
            raise CheckpointError(f"{local} has no config.json; it is not a model checkpoint folder")
        return read_json(local / CONFIG_NAME, "model config")
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


def _hub_snapshot(src: str | os.PathLike, subfolder: str = "", revision: str | None = None) -> Path:
    """The local folder of a hub snapshot of only the files a checkpoint needs (config.json, one weight format,
    :data:`AUXILIARY_FILES`; never Python files)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    try:
        format_name, weights = _hub_weight_files(str(src), subfolder, revision)  # the shards its index names
        names = [CONFIG_NAME, *AUXILIARY_FILES, "additional_chat_templates/*", *WEIGHT_FILES.get(format_name, ())]
        snapshot = snapshot_download(
            str(src), revision=revision, allow_patterns=[*(prefix + n for n in names), *weights]
        )
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as error:
        raise _hub_failure(src, error, "downloaded") from error
    return Path(snapshot) / subfolder


def read_source_checkpoint(
    src: str | os.PathLike, subfolder: str, revision: str | None, dst: Path, output: str
) -> CheckpointHeader:
    """The header of the checkpoint a command reads to write the folder ``dst`` (``output`` names what it writes),
    a local folder or a hub snapshot; a source and DST inside one another, or a source without weights, are refused.

    >>> from gated_qwen.default_models import default_model_path
    >>> arm = default_model_path("headwise")
    >>> read_source_checkpoint(str(arm), "", None, arm / "out", "export")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    gated_qwen.errors.GatedQwenError: .../headwise/out and the source .../headwise overlap; write the export elsewhere
    """
    folder = resolve_source(str(src), subfolder, revision) or _hub_snapshot(src, subfolder, revision)
    for inside, outside in ((dst, folder), (folder, dst)):
        if inside.resolve().is_relative_to(outside.resolve()):
            raise GatedQwenError(f"{dst} and the source {folder} overlap; write the {output} elsewhere")
    header = read_checkpoint_header(folder)
    if not header.tensors:
        raise CheckpointError(f"{folder} has no weights (model.safetensors, pytorch_model.bin, or an index of either)")
    return header
