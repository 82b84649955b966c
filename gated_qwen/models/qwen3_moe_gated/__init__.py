"""Qwen3MoeGated: transformers' Qwen3-MoE with the gated attention of the dense model."""
