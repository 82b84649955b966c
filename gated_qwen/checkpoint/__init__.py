"""Checkpoint I/O: formats and headers, sources on disk and on the hub, strict validation, and the safe
output writer every command that writes goes through (:mod:`~gated_qwen.checkpoint.outputs`)."""
