"""Serving integrations: the vLLM plugin (:mod:`~gated_qwen.serving.vllm_plugin`)."""
