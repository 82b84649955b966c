"""Checkpoint I/O: formats and headers, sources on disk and on the hub, strict validation, and the safe
output writer every command that writes goes through (:mod:`~gated_qwen.checkpoint.outputs`)."""

from .formats import (
    AUXILIARY_FILES,
    CONFIG_NAME,
    SAFETENSORS_CODES,
    SAFETENSORS_DTYPES,
    CheckpointHeader,
    CheckpointTensors,
    TensorInfo,
    load_pickle_weights,
    read_json,
    read_weight_file_header,
    resolve_weight_files,
    write_safetensors_checkpoint,
)
from .outputs import OutputError, OutputFolder, output_file, scratch_folder, write_text
from .sources import read_checkpoint_header, read_config_json, read_source_checkpoint
from .validation import check_layer_count, check_weights_match_config, weight_disagreements
