"""Qwen3Gated: configuration and modeling, as transformers lays out a model."""
