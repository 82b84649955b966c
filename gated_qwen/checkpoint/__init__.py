"""Checkpoint I/O: formats and headers, sources on disk and on the hub, strict validation, and the safe
output writer every command that writes goes through (:mod:`~gated_qwen.checkpoint.outputs`)."""

from .formats import (
    AUXILIARY_FILES,
    CONFIG_NAME,
    PICKLE_WEIGHTS_INDEX_NAME,
    PICKLE_WEIGHTS_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SAFETENSORS_CODES,
    SAFETENSORS_DTYPES,
    CheckpointHeader,
    CheckpointTensors,
    StoredTensor,
    TensorInfo,
    load_pickle_weights,
    local_weight_files,
    read_json,
    read_weight_file_header,
    split_into_shards,
    weights_format,
    write_safetensors,
    write_safetensors_checkpoint,
)
from .sources import (
    HUB_KWARGS,
    checkpoint_folder,
    hub_weight_files,
    read_checkpoint_header,
    read_config_json,
    read_source_checkpoint,
    resolve_weight_files,
)
from .validation import (
    check_layer_count,
    check_loaded_weights,
    check_q_proj_layout,
    check_weights_match_config,
    weight_disagreements,
)
from .outputs import OutputError, OutputFolder, output_file, scratch_folder, write_text

__all__ = [
    "AUXILIARY_FILES", "CONFIG_NAME", "HUB_KWARGS", "PICKLE_WEIGHTS_INDEX_NAME", "PICKLE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_INDEX_NAME", "SAFE_WEIGHTS_NAME", "SAFETENSORS_CODES", "SAFETENSORS_DTYPES", "CheckpointHeader", "CheckpointTensors",
    "OutputError", "OutputFolder", "StoredTensor", "TensorInfo", "check_layer_count", "check_loaded_weights", "check_q_proj_layout", "check_weights_match_config", "checkpoint_folder",
    "load_pickle_weights", "local_weight_files", "output_file", "read_checkpoint_header", "read_config_json",
    "read_json", "hub_weight_files", "read_source_checkpoint", "read_weight_file_header", "resolve_weight_files", "scratch_folder",
    "split_into_shards", "weight_disagreements", "weights_format", "write_safetensors", "write_safetensors_checkpoint", "write_text",
]
