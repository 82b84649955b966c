"""The one streaming pipeline behind ``gated-qwen convert`` and ``gated-qwen export``.

A transform of a checkpoint contributes only its plan, a :class:`TensorMapping`: how each source tensor
becomes output tensors, the tensors the target model holds, and how to write the target's config.
:func:`transform_checkpoint` does everything else, the same way for every transform:

1. refuses a bad destination before anything is read (:class:`~gated_qwen.checkpoint.outputs.OutputFolder`);
2. reads the source's header: a local folder, or a hub snapshot of only the files needed, never code;
3. runs the mapping on meta tensors to get every output's shape, and checks the result against the
   target model (missing, unexpected or misshapen tensors are one error naming them), before any data;
4. streams: each tensor is read, cast, mapped and written into sharded safetensors one at a time, and a
   tensor the mapping leaves as it is (same name, shape and dtype) is copied byte for byte, unread; so
   peak memory stays near the largest tensor, not the model;
5. writes the config, copies the tokenizer and generation config, optionally verifies the logits, and
   puts the folder in place whole (a failure leaves the destination as it was).

>>> from gated_qwen.transforms.pipeline import TensorMapping
>>> identity = TensorMapping(map_tensor=lambda name, t: [(name, t)], target_shapes={"w": (2, 3)}, write_config=print)
>>> plan_tensors({"w": TensorInfo((2, 3), "F32")}, identity, None, "src").unchanged
{'w'}
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers.utils import logging

from ..checkpoint import (
    AUXILIARY_FILES,
    SAFETENSORS_CODES,
    SAFETENSORS_DTYPES,
    CheckpointHeader,
    CheckpointTensors,
    TensorInfo,
    read_config_json,
    read_source_checkpoint,
    write_safetensors_checkpoint,
)
from ..checkpoint.outputs import OutputFolder
from ..errors import CheckpointError
from ..models.qwen3_gated.configuration_qwen3_gated import Qwen3GatedConfig, normalize_config_dict
from ..models.qwen3_moe_gated.configuration_qwen3_moe_gated import (
    MOE_MODEL_TYPES,
    Qwen3MoeGatedConfig,
    normalize_moe_config_dict,
)
from ..utils.devices import resolve_dtype


logger = logging.get_logger(__name__)


@dataclass
class TensorMapping:
    """A transform's plan: what each source tensor becomes, and what the target model holds.

    ``map_tensor(name, tensor)`` returns the ``(output name, tensor)`` pairs one source tensor becomes (none
    to drop it; several to split it or add tensors beside it); it must work on meta tensors (shapes only) and
    return ``tensor`` itself, under its own name, for a tensor it leaves unchanged (copied byte for byte). ``target_shapes`` are the tensors the target model saves (from a skeleton on the meta
    device); ``not_saved`` those it holds but does not save (a tied ``lm_head``), dropped with a note.
    ``observe(source_name, source_tensor, output_name, output)`` sees each real tensor written (export counts
    the norm weights that round). ``advice`` ends the error for a source that does not fit.
    """

    map_tensor: Callable[[str, torch.Tensor], list[tuple[str, torch.Tensor]]]
    target_shapes: dict[str, tuple[int, ...]]
    write_config: Callable[[Path], None]
    not_saved: set[str] = field(default_factory=set)
    observe: Callable[[str, torch.Tensor, str, torch.Tensor], None] | None = None
    advice: str = "check num_hidden_layers and tie_word_embeddings against the weights"


@dataclass
class TensorPlan:
    """Every output tensor's shape and dtype, the source tensor it comes from, and the sources copied as stored."""

    specs: dict[str, TensorInfo]
    origin: dict[str, str]
    unchanged: set[str]

    @property
    def total_size(self) -> int:
        return sum(info.nbytes for info in self.specs.values())


@dataclass
class TransformedCheckpoint:
    """What :func:`transform_checkpoint` wrote, and the source header it read."""

    path: Path
    files: list[str]
    plan: TensorPlan
    header: CheckpointHeader
    max_difference: float | None = None


def source_config_from_dict(config_dict: dict, source: str = "the model") -> Qwen3GatedConfig | Qwen3MoeGatedConfig:
    """Read a config dict as its family's gated config, with one clear error otherwise: a Qwen3 or Qwen3Gated
    one as a Qwen3GatedConfig, a Qwen3-MoE or Qwen3MoeGated one as a Qwen3MoeGatedConfig."""
    if config_dict.get("model_type") in MOE_MODEL_TYPES:
        config_class, family, config_dict = (
            Qwen3MoeGatedConfig,
            "Qwen3-MoE",
            normalize_moe_config_dict(config_dict, source),
        )
    else:
        config_class, family, config_dict = Qwen3GatedConfig, "Qwen3", normalize_config_dict(config_dict, source)
    try:
        return config_class.from_dict(config_dict)
    except (StrictDataclassError, TypeError, ValueError) as error:  # strict validation, the config's own checks
        reason = " ".join(str(error).split())  # validation messages span lines; the CLI prints one
        raise CheckpointError(f"the config of {source} is not a valid {family} config: {reason}") from error


def _listed(found: list[str]) -> str:
    return ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")


def plan_tensors(
    source_tensors: dict[str, TensorInfo], mapping: TensorMapping, target_dtype: torch.dtype | None, source: str
) -> TensorPlan:
    """Run ``mapping`` on meta tensors: the plan of every output tensor, checked against ``mapping.target_shapes``.

    Raises :class:`~gated_qwen.errors.CheckpointError` for a non-floating tensor, a tensor the mapping cannot
    take, and outputs missing, unexpected or of the wrong shape; nothing is read but the header.
    """
    specs, origin, unchanged = {}, {}, set()
    dropped = []
    for name, info in source_tensors.items():
        dtype = SAFETENSORS_DTYPES.get(info.dtype)
        if dtype is None or not dtype.is_floating_point:
            raise CheckpointError(
                f"{source}: {name} is stored as {info.dtype}; only floating-point weights can be transformed"
            )
        probe = torch.empty(info.shape, dtype=target_dtype or dtype, device="meta")
        try:
            outputs = mapping.map_tensor(name, probe)
        except ValueError as error:
            raise CheckpointError(
                f"{source}: {name} has shape {tuple(info.shape)}, which does not fit its config ({error})"
            ) from error
        for out_name, out in outputs:
            if out_name in mapping.not_saved:
                dropped.append(out_name)
                continue
            specs[out_name] = TensorInfo(tuple(out.shape), SAFETENSORS_CODES[out.dtype])
            origin[out_name] = name
            if out is probe and out_name == name and out.dtype == dtype:
                unchanged.add(name)
    if dropped:
        logger.info(f"{source}: not writing {', '.join(sorted(dropped))}, tied to the embedding")
    expected = mapping.target_shapes
    missing, extra = sorted(expected.keys() - specs.keys()), sorted(specs.keys() - expected.keys())
    wrong = sorted(n for n in expected.keys() & specs.keys() if specs[n].shape != tuple(expected[n]))
    if missing or extra or wrong:
        problems = "; ".join(
            f"{what}: {_listed(found)}"
            for what, found in (("missing", missing), ("unexpected", extra), ("wrong shape", wrong))
            if found
        )
        raise CheckpointError(
            f"{source} does not hold the weights its config describes ({problems}); {mapping.advice}"
        )
    return TensorPlan(specs, origin, unchanged)


def copy_auxiliary_files(source: Path, target: Path) -> None:
    """Copy the tokenizer, generation config and chat templates (:data:`~gated_qwen.checkpoint.AUXILIARY_FILES`) that ``source`` has."""
    for name in AUXILIARY_FILES:
        if (source / name).is_dir():
            shutil.copytree(source / name, target / name)
        elif (source / name).is_file():
            shutil.copyfile(source / name, target / name)


def transform_checkpoint(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    build: Callable[[CheckpointHeader, torch.dtype | None], TensorMapping],
    *,
    output_name: str,
    description: str,
    check_config: Callable[[dict, str, torch.dtype | None], None] | None = None,
    verify: Callable[[Path, Path], float] | None = None,
    dtype: str = "auto",
    max_shard_size: int | str = "5GB",
    overwrite: bool = False,
    revision: str | None = None,
    subfolder: str = "",
    progress: bool = True,
) -> TransformedCheckpoint:
    """Stream the checkpoint ``src`` (folder or hub id) through the mapping ``build`` makes, into the folder ``dst``.

    ``check_config(config_dict, source, target_dtype)`` may refuse from config.json alone (on the hub, before
    any weight is downloaded); ``build(header, target_dtype)`` makes the :class:`TensorMapping` from the
    source's header; ``verify(source_folder, staging_folder)`` returns the largest logit difference.
    ``output_name`` says what is written (in the error for overlapping folders), ``description`` labels the
    progress bar. ``dtype`` casts floating tensors before they are mapped ("auto" keeps them).

    >>> import tempfile
    >>> from gated_qwen.default_models import default_model_path
    >>> def build(header, target_dtype):
    ...     return TensorMapping(lambda n, t: [(n, t)], {n: i.shape for n, i in header.tensors.items()},
    ...                          write_config=lambda folder: (folder / "config.json").write_text("{}"))
    >>> folder = tempfile.TemporaryDirectory()
    >>> dst = Path(folder.name) / "copy"
    >>> transform_checkpoint(default_model_path("headwise"), dst, build, output_name="copy", description="copying",
    ...                      progress=False).files
    ['model.safetensors']
    >>> (dst / "config.json").read_text()
    '{}'
    >>> folder.cleanup()
    """
    target_dtype = resolve_dtype(dtype)
    target_dtype = None if target_dtype == "auto" else target_dtype  # None: keep each tensor's dtype
    output = OutputFolder(dst, overwrite=overwrite)  # refuses a bad DST now, before any reading
    destination = output.destination
    if check_config is not None:  # config.json alone first (from the hub: that file only)
        source = str(Path(src) / subfolder) if subfolder else str(src)
        check_config(read_config_json(src, subfolder, revision), source, target_dtype)
    header = read_source_checkpoint(src, subfolder, revision, destination, output_name)
    folder = Path(header.source)
    mapping = build(header, target_dtype)
    plan = plan_tensors(header.tensors, mapping, target_dtype, header.source)
    tensors = CheckpointTensors(header.files)

    def produce(name: str):
        source_name = plan.origin[name]
        # A source kept as it is may yield further tensors too (export: the router and a zero shared expert).
        stored = tensors.stored(source_name) if name == source_name and source_name in plan.unchanged else None
        if stored is not None:
            return stored  # copied byte for byte, unread
        tensor = tensors.get(source_name)
        if target_dtype is not None:
            tensor = tensor.to(target_dtype)  # before the mapping, so it computes in the stored dtype
        (out,) = [t for n, t in mapping.map_tensor(source_name, tensor) if n == name]
        if mapping.observe is not None:
            mapping.observe(source_name, tensor, name, out)
        return out

    with output as staging:  # written whole into a staging folder, put in place at the end
        files = write_safetensors_checkpoint(
            staging, plan.specs, produce, max_shard_size, progress, description=description
        )
        mapping.write_config(staging)
        copy_auxiliary_files(folder, staging)
        max_difference = verify(folder, staging) if verify is not None else None
    return TransformedCheckpoint(destination, files, plan, header, max_difference)


class CheckpointTransform:
    """One transform of a checkpoint (conversion, export) as an object: its steps are the methods that
    :func:`transform_checkpoint` calls in turn, and what one step learns for a later one is an attribute.

    A subclass sets ``output_name`` and ``description`` and defines :meth:`build`; it may define
    :meth:`check_config` (refuse from config.json alone) and :meth:`verify` (used when ``verifies``).
    :meth:`run` streams ``src`` into ``dst`` through them.
    """

    output_name: str = "transformed checkpoint"
    description: str = "transforming"
    verifies: bool = False

    def check_config(self, config_dict: dict, source: str, target_dtype: torch.dtype | None) -> None:
        """Refuse the source from its config.json dict alone, before any weight is fetched (nothing by default)."""

    def build(self, header: CheckpointHeader, target_dtype: torch.dtype | None) -> TensorMapping:
        """The :class:`TensorMapping` for the source whose header is ``header``."""
        raise NotImplementedError

    def verify(self, source: Path, staging: Path) -> float:
        """The largest logit difference between the source folder and the written one."""
        raise NotImplementedError

    def run(self, src: str | os.PathLike, dst: str | os.PathLike, **options) -> TransformedCheckpoint:
        """:func:`transform_checkpoint` with this transform's steps; ``options`` are its keyword options."""
        return transform_checkpoint(
            src,
            dst,
            self.build,
            output_name=self.output_name,
            description=self.description,
            check_config=self.check_config,
            verify=self.verify if self.verifies else None,
            **options,
        )


__all__ = [
    "CheckpointTransform",
    "TensorMapping",
    "TensorPlan",
    "TransformedCheckpoint",
    "copy_auxiliary_files",
    "plan_tensors",
    "source_config_from_dict",
    "transform_checkpoint",
]
