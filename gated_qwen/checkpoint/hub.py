"""Where a model comes from, checked before anything heavy runs: the one place that says, in one line, what is
wrong with a model source (a missing path, a file, a missing subfolder, no network, the hub switched off without
the files cached, an unknown or gated repository or revision). A hub repository is probed with one request
without retries (huggingface_hub retries a failed download for about 25 s), so a missing network shows at once.

"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from ..errors import GatedQwenError


# owner/name or name, as the hub spells repository ids
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
PROBE_TIMEOUT_S = 10.0


def source_location(repo_id: str, subfolder: str = "") -> str:
    """A source as messages name it.

    >>> source_location("QwQZh/gated_attention", "1B_gate_headwise")
    'QwQZh/gated_attention (subfolder 1B_gate_headwise)'
    """
    return f"{repo_id}" + (f" (subfolder {subfolder})" if subfolder else "")


def _arms(folder_names: list[str]) -> str:
    return f"; it holds {', '.join(sorted(folder_names))}: pass one with --subfolder" if folder_names else ""


def looks_like_path(source: str) -> bool:
    """Whether ``source`` can only be a local path (not a hub id): ``./x``, ``/x``, ``~/x``, ``a/b/c``, ``x/``.

    >>> looks_like_path("./missing_dir"), looks_like_path("QwQZh/gated_attention"), looks_like_path("runs/a/final")
    (True, False, True)
    """
    return (
        source.startswith((".", "/", "~"))
        or source.count("/") > 1
        or source.endswith("/")
        or not HUB_ID.fullmatch(source)
    )


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
    if looks_like_path(source):
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
