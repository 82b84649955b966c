"""Checkpoint file formats: what a weight file holds (safetensors, or as the released arms, PyTorch pickles, only
ever read with ``torch.load(weights_only=True)``), its tensors one at a time, and streamed safetensors output.
"""

from __future__ import annotations

import json
import math
import os
import pickle
from collections import namedtuple
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path

import torch
from safetensors import safe_open

from ..errors import CheckpointError, GatedQwenError


CONFIG_NAME = "config.json"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
# (index, single file) of each weight format, in the order transformers prefers them, and their files on the hub
WEIGHT_FILES = {"safetensors": (SAFE_WEIGHTS_INDEX_NAME, "model.safetensors"), "pytorch": ("pytorch_model.bin.index.json", "pytorch_model.bin")}  # fmt: skip
# Files beside the weights that a written checkpoint takes over unchanged: never Python files (a checkpoint's
# code is never run, nor passed on).
AUXILIARY_FILES = (
    "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
    "additional_chat_templates", "LICENSE", "NOTICE",
)  # fmt: skip

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
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * SAFETENSORS_DTYPES[self.dtype].itemsize


@dataclass
class CheckpointHeader:
    """What a checkpoint holds, from its config.json and weight headers only (``tensors`` empty for pickle weights
    on the hub, whose shapes need the download; ``file_sizes`` then still says how large each file is)."""

    source: str
    config: dict
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    weights_format: str | None = None  # "safetensors", "pytorch", or None when there are no weights
    file_sizes: dict[str, int] = field(default_factory=dict)


def read_json(path: str | os.PathLike, what: str) -> dict:
    """A JSON object from ``path``, or one clear error naming the file and what it should have been.

    >>> from gated_qwen.default_models import default_model_path
    >>> read_json(default_model_path("headwise") / "config.json", "model config")["model_type"]
    'qwen3_gated'
    """
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path} is not valid JSON ({error}); the {what} is corrupt or truncated") from error
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} does not hold a JSON object; it is not a {what}")
    return data


def read_weight_file_header(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """Names, shapes and dtypes in one weight file, without reading the tensors: safetensors by its header,
    ``.bin`` by its pickle loaded on the meta device.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())  # a tiny pytorch_model.bin, as the released arms have
    >>> torch.save({"model.norm.weight": torch.ones(8, dtype=torch.bfloat16)}, folder / "pytorch_model.bin")
    >>> read_weight_file_header(folder / "pytorch_model.bin")
    {'model.norm.weight': TensorInfo(shape=(8,), dtype='BF16')}
    """
    if not str(path).endswith(".safetensors"):
        infos = {}
        for name, tensor in load_pickle_weights(path, map_location="meta").items():
            if tensor.dtype not in SAFETENSORS_CODES:
                raise CheckpointError(f"{path}: {name} has dtype {tensor.dtype}, which gated-qwen does not read")
            infos[name] = TensorInfo(tuple(tensor.shape), SAFETENSORS_CODES[tensor.dtype])
        return infos
    try:
        with safe_open(os.fspath(path), framework="pt") as handle:
            slices = {name: handle.get_slice(name) for name in handle.keys()}
            return {name: TensorInfo(tuple(part.get_shape()), part.get_dtype()) for name, part in slices.items()}
    except FileNotFoundError as error:
        raise CheckpointError(f"{path} does not exist") from error
    except Exception as error:  # safetensors raises its own SafetensorError for a bad header
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({error}); it is corrupt or truncated: download or write it again"
        ) from error


def load_pickle_weights(path: str | os.PathLike, map_location: str = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of a ``pytorch_model.bin``, read with ``torch.load(weights_only=True)``, memory-mapped
    (``map_location="meta"``: no data read). A pickle of anything but plain tensors, or a damaged one, is one
    :class:`CheckpointError`.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())  # a tiny pytorch_model.bin, as the released arms have
    >>> torch.save({"model.norm.weight": torch.ones(8, dtype=torch.bfloat16)}, folder / "pytorch_model.bin")
    >>> load_pickle_weights(folder / "pytorch_model.bin", map_location="meta")["model.norm.weight"].shape
    torch.Size([8])
    """
    if not Path(path).is_file():
        raise CheckpointError(f"{path} does not exist")
    try:
        try:
            # mmap: tensors are views of the file; only the pages that are read become resident
            state = torch.load(path, map_location=map_location, weights_only=True, mmap=map_location != "meta")
        except RuntimeError as error:
            if "mmap can only be used" not in str(error):
                raise
            state = torch.load(path, map_location=map_location, weights_only=True)  # the pre-1.6 format
    except pickle.UnpicklingError as error:
        # torch's message is a page long; the line that names what the pickle wanted is the one to keep
        lines = [line.strip() for line in str(error).splitlines() if "GLOBAL" in line or "WeightsUnpickler" in line]
        reason = (lines or ["refused"])[0].removeprefix("WeightsUnpickler error:").strip().rstrip(".")[:200]
        raise CheckpointError(
            f"{path} holds a pickle that is not plain tensors ({reason}); it was refused and nothing in it ran. "
            "Get the weights from a source you trust, preferably as safetensors"
        ) from error
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise CheckpointError(
            f"{path} is not a readable PyTorch weights file ({reason}); it is corrupt or truncated: download it again"
        ) from error
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} does not hold a dict of tensors; it is not a model's weights file")
    return state


HUB_KWARGS = ("subfolder", "revision", "cache_dir", "token", "local_files_only", "force_download", "proxies")


def resolve_weight_files(path_or_repo_id: str | os.PathLike, **hub_kwargs) -> list[str]:
    """Local paths of the weight files ``from_pretrained`` reads (safetensors before pickles, index before single
    file), fetched into the hub cache by transformers' ``cached_file`` and ``get_checkpoint_shard_files`` if need
    be; [] without weights. Takes from_pretrained's hub arguments (``subfolder``, ``revision``, ...).

    >>> from gated_qwen.default_models import default_model_path
    >>> models = default_model_path().parent  # headwise/ and baseline/, as the hub repository holds its arms
    >>> resolve_weight_files(models, subfolder="baseline") == [str(models / "baseline" / "model.safetensors")]
    True
    """
    from transformers.utils.hub import cached_file, get_checkpoint_shard_files

    hub_kwargs = {k: v for k, v in hub_kwargs.items() if k in HUB_KWARGS}
    subfolder = hub_kwargs.get("subfolder") or ""
    for index_name, single_name in WEIGHT_FILES.values():
        for name in (index_name, single_name):
            if not present_files(path_or_repo_id, [name], **hub_kwargs):
                continue
            path = cached_file(path_or_repo_id, name, **hub_kwargs)
            if name == single_name:
                return [path]
            try:
                files, _ = get_checkpoint_shard_files(path_or_repo_id, path, **hub_kwargs)
            except (KeyError, TypeError, ValueError) as error:  # no weight_map or metadata, or not JSON
                raise CheckpointError(f"{path} is not a weights index ({error!r}); the index is corrupt") from error
            missing = [file for file in files if not os.path.isfile(file)]
            if missing:
                raise CheckpointError(f"{path} names the shard {Path(missing[0]).name}, which is missing")
            return [os.path.normpath(file) for file in files] if Path(path_or_repo_id, subfolder).is_dir() else files
    return []


def present_files(
    path_or_repo_id: str | os.PathLike, names: list[str], subfolder: str = "", **hub_kwargs
) -> list[str]:
    """Which of ``names`` a local checkpoint folder or hub repository holds, without downloading them (on the hub,
    transformers' ``has_file``: one request a name, the local cache alone when offline).

    >>> from gated_qwen.default_models import default_model_path
    >>> present_files(default_model_path("headwise"), ["config.json", "pytorch_model.bin"])
    ['config.json']
    """
    from huggingface_hub import constants
    from transformers.utils.hub import has_file

    where = {key: hub_kwargs.get(key) for key in ("revision", "token", "proxies", "cache_dir")}
    where["local_files_only"] = bool(hub_kwargs.get("local_files_only") or constants.HF_HUB_OFFLINE)
    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    repository = str(Path(path_or_repo_id).expanduser())  # a local folder: has_file looks into it
    return [name for name in names if has_file(repository, prefix + name, **where)]


# Where a tensor's bytes lie in a source safetensors file: file[start:end]
StoredTensor = namedtuple("StoredTensor", "file start end")


class CheckpointTensors:
    """The tensors of a local checkpoint's weight files (``infos``: shapes and dtypes), read one at a time in
    bounded memory: from safetensors through a map opened for that tensor alone; from a ``.bin`` through
    ``torch.load(mmap=True)``, remapped after every :attr:`MAPPED_BYTES` read so that read pages do not pile up.

    >>> from gated_qwen.default_models import default_model_path
    >>> CheckpointTensors(resolve_weight_files(default_model_path("headwise"))).get("model.norm.weight").dtype
    torch.bfloat16
    """

    MAPPED_BYTES = 256 * 2**20

    def __init__(self, files: Iterable[str | os.PathLike]):
        self.infos: dict[str, TensorInfo] = {}
        self._file_of: dict[str, Path] = {}
        self._offsets: dict[str, tuple[int, int]] = {}
        for file in map(Path, files):
            infos = read_weight_file_header(file)
            self.infos.update(infos)
            self._file_of.update(dict.fromkeys(infos, file))
            if file.suffix == ".safetensors":  # where each tensor's bytes lie, to copy them unread (stored):
                # safe_open refuses a file whose data is not the tensors' bytes back to back in offset_keys() order
                with safe_open(os.fspath(file), framework="pt") as handle:
                    order = handle.offset_keys()
                offset = os.path.getsize(file) - sum(infos[name].nbytes for name in order)
                for name in order:
                    self._offsets[name], offset = (offset, offset + infos[name].nbytes), offset + infos[name].nbytes
        self._mapped: tuple[Path, dict[str, torch.Tensor]] | None = None
        self._mapped_read = 0

    def stored(self, name: str) -> StoredTensor | None:
        """Where ``name``'s bytes lie in its safetensors file; None for a pickle's tensor."""
        return StoredTensor(self._file_of[name], *self._offsets[name]) if name in self._offsets else None

    def get(self, name: str) -> torch.Tensor:
        """The tensor ``name``, on the CPU, as stored (treat it as read-only: it may be a view of the file)."""
        file = self._file_of[name]
        if file.suffix == ".safetensors":
            try:
                with safe_open(os.fspath(file), framework="pt") as handle:
                    return handle.get_tensor(name)
            except Exception as error:
                raise CheckpointError(
                    f"could not read {name} from {file} ({error}); the file is corrupt or truncated"
                ) from error
        if self._mapped is None or self._mapped[0] != file or self._mapped_read > self.MAPPED_BYTES:
            self._mapped = None  # drop the old map before making the new one
            self._mapped, self._mapped_read = (file, load_pickle_weights(file)), 0
        self._mapped_read += self.infos[name].nbytes
        # A view of the map, not a copy: it keeps its map alive for as long as the caller holds it, so
        # dropping the map above only frees it once the tensors taken from it are gone.
        return self._mapped[1][name]


def write_safetensors_checkpoint(
    folder: str | os.PathLike,
    plan: dict[str, TensorInfo],
    produce: Callable[[str], torch.Tensor | StoredTensor],
    max_shard_size: int | str = "5GB",
    progress: bool = True,
    description: str = "writing",
) -> list[str]:
    """Write the tensors of ``plan`` into the existing ``folder`` as safetensors, sharded by huggingface_hub's plan
    (``max_shard_size``: ``"5GB"`` or bytes) with an index; returns the shard names. ``produce(name)``, called once
    per tensor in order, returns it or a :class:`StoredTensor` copied unread: one tensor in memory at a time.

    >>> import tempfile
    >>> staging = tempfile.mkdtemp()
    >>> write_safetensors_checkpoint(staging, {"a": TensorInfo((2,), "F32")}, lambda name: torch.zeros(2))
    ['model.safetensors']
    """
    from huggingface_hub import split_state_dict_into_shards_factory
    from tqdm.auto import tqdm

    folder = Path(folder)
    if isinstance(max_shard_size, str) and max_shard_size.strip().isdigit():
        max_shard_size = int(max_shard_size)  # a plain number of bytes, as the CLI passes it
    try:
        split = split_state_dict_into_shards_factory(
            plan, get_storage_size=attrgetter("nbytes"), filename_pattern="model{suffix}.safetensors",
            max_shard_size=max_shard_size,
        )  # fmt: skip
    except ValueError as error:
        raise GatedQwenError(
            f"max shard size {max_shard_size!r} is not a size like 5GB, 500MB or a number of bytes"
        ) from error
    total_size = sum(info.nbytes for info in plan.values())
    disable = None if progress else True  # None: on a terminal only
    with tqdm(
        total=total_size, unit="B", unit_scale=True, unit_divisor=1024, desc=description, disable=disable
    ) as bar:
        for filename, names in split.filename_to_tensors.items():
            specs = {name: plan[name] for name in names}
            write_safetensors(folder / filename, specs, map(produce, specs), written=bar.update)
    if split.is_sharded:
        index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(split.tensor_to_filename.items()))}
        (folder / SAFE_WEIGHTS_INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return list(split.filename_to_tensors)


def write_safetensors(
    path: Path,
    specs: dict[str, TensorInfo],
    tensors: Iterable[torch.Tensor | StoredTensor],
    written: Callable[[int], object] = lambda size: None,
) -> None:
    """Write one safetensors file tensor by tensor (a :class:`StoredTensor` copied as it is), its header known from
    ``specs``; ``written(bytes)`` after each. Kept because no library writes a file tensor by tensor: safetensors' writers (``save_file``,
    ``serialize_file``, 0.8), which transformers' and huggingface_hub's savers call, take every tensor at once.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "a.safetensors"
    >>> write_safetensors(path, {"a": TensorInfo((2,), "F32")}, [torch.zeros(2)])
    >>> read_weight_file_header(path)
    {'a': TensorInfo(shape=(2,), dtype='F32')}
    """
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, spec in specs.items():
        size = spec.nbytes
        header[name] = {"dtype": spec.dtype, "shape": list(spec.shape), "data_offsets": [offset, offset + size]}
        offset += size
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # safetensors aligns the data to 8 bytes
    with open(path, "wb") as handle:
        handle.write(len(header_bytes).to_bytes(8, "little"))
        handle.write(header_bytes)
        for (name, spec), tensor in zip(specs.items(), tensors, strict=True):
            if isinstance(tensor, StoredTensor):
                if tensor.end - tensor.start != spec.nbytes:
                    raise CheckpointError(
                        f"{tensor.file}: {name} holds {tensor.end - tensor.start} bytes, not the {spec.nbytes} "
                        f"its shape {spec.shape} and dtype {spec.dtype} need; the file is corrupt"
                    )
                _append_bytes(handle, tensor)
            elif tuple(tensor.shape) != spec.shape or SAFETENSORS_CODES[tensor.dtype] != spec.dtype:
                raise AssertionError(f"{name}: produced {tuple(tensor.shape)} {tensor.dtype}, planned {spec}")
            else:
                handle.write(tensor.contiguous().view(-1).view(torch.uint8).numpy())
            written(spec.nbytes)


COPY_CHUNK_SIZE = 16 * 2**20  # bytes per read where the kernel cannot copy between the files itself


def _append_bytes(target, stored: StoredTensor) -> None:
    """Append ``stored``'s bytes to the open file ``target``: by os.copy_file_range, inside the kernel (the bytes
    never resident here), or where it is missing or refused, in chunks of COPY_CHUNK_SIZE."""
    target.flush()
    start, remaining = stored.start, stored.end - stored.start
    with open(stored.file, "rb") as source:
        try:
            # 0 copied: the source ended early, which the reads below say
            while remaining and (copied := os.copy_file_range(source.fileno(), target.fileno(), remaining, start)):
                start, remaining = start + copied, remaining - copied
        except (AttributeError, OSError):
            pass
        target.seek(0, os.SEEK_END)  # copy_file_range moved the descriptor, not the Python file's idea of it
        source.seek(start)
        while remaining:
            chunk = source.read(min(remaining, COPY_CHUNK_SIZE))
            if not chunk:
                raise CheckpointError(
                    f"{stored.file} ended before the tensor bytes its header names; it is corrupt or truncated"
                )
            target.write(chunk)
            remaining -= len(chunk)
