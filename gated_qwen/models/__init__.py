"""The model layer: Qwen3Gated's configuration and modeling (a diff over transformers' Qwen3), the q_proj
row layout they share with every other layer (:mod:`~gated_qwen.models.layout`), and registration with
transformers' Auto classes and PEFT (:mod:`~gated_qwen.models.auto`).

Nothing here reads or writes files beyond what transformers' own ``from_pretrained`` does: loading rules
live in :mod:`gated_qwen.checkpoint`.
"""
