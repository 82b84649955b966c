"""PEFT on the attention gate alone, dense and MoE.

Where the gate has a projection of its own (``g_proj``: every gate of the design space but the released one), a
LoRA on ``self_attn.g_proj`` adapts the gate and nothing else. In the released layout the gate logits are extra
rows of ``q_proj`` (:mod:`gated_qwen.models.layout`), which PEFT can only adapt whole: :func:`get_gate_peft_model`
puts LoRA on ``self_attn.q_proj`` and keeps the rows of its ``lora_B`` that write queries at zero (zero from the
start, their gradient masked), so that the adapter's update ``lora_B @ lora_A`` has non-zero rows only where
``q_proj`` writes gate logits: the queries, keys, values, MLP and MoE router compute what the base model computes.
The saved adapter is an ordinary PEFT LoRA; after ``PeftModel.from_pretrained(..., is_trainable=True)``, call
:func:`keep_queries_frozen` again before training further.

The bare name ``gate`` is no way to ask for the attention gate: on a Qwen3-MoE it is the router (``mlp.gate``),
and :mod:`gated_qwen.models.auto` refuses it as a PEFT target on gated models, naming both spellings.
"""

from __future__ import annotations

import torch

from .layout import split_query_and_gate


def gate_target_modules(config) -> list[str]:
    """The module names (PEFT ``target_modules``) that hold the attention gate of a gated model with ``config``.

    >>> from gated_qwen import Qwen3GatedConfig
    >>> gate_target_modules(Qwen3GatedConfig(headwise_attn_output_gate=True))
    ['self_attn.q_proj']
    >>> gate_target_modules(Qwen3GatedConfig(gate_type="headwise", gate_position="value"))
    ['self_attn.g_proj']
    """
    if getattr(config, "gate_type", "none") == "none":
        raise ValueError("this model has no attention gate (gate_type 'none'): there is nothing to adapt")
    return ["self_attn.q_proj"] if config.gate_in_q_proj else ["self_attn.g_proj"]


def get_gate_peft_model(model, **lora_kwargs):
    """``model`` with a LoRA adapter on its attention gate alone (``peft.get_peft_model``); ``lora_kwargs`` go to
    ``peft.LoraConfig`` (``r``, ``lora_alpha``, ``lora_dropout``, ...), its ``target_modules`` excepted.

    >>> from gated_qwen import Qwen3GatedForCausalLM
    >>> from gated_qwen.default_models import default_model_path
    >>> model = get_gate_peft_model(Qwen3GatedForCausalLM.from_pretrained(default_model_path("headwise")), r=2)
    >>> model.print_trainable_parameters()  # doctest: +ELLIPSIS
    trainable params: ...
    """
    from peft import LoraConfig, get_peft_model

    if "target_modules" in lora_kwargs or "target_parameters" in lora_kwargs:
        raise ValueError("get_gate_peft_model chooses the gate's modules itself: leave out target_modules")
    targets = gate_target_modules(model.config)
    if model.config.gate_in_q_proj:
        if lora_kwargs.get("use_dora") or lora_kwargs.get("bias", "none") != "none":
            raise ValueError(
                "use_dora and a trainable bias change q_proj's query rows too: leave them out to adapt the gate alone"
            )
        if lora_kwargs.get("init_lora_weights", True) not in (True, False, "gaussian"):
            raise ValueError("only init_lora_weights True, False or 'gaussian' leave the base q_proj as it is")
    peft_model = get_peft_model(model, LoraConfig(target_modules=targets, **lora_kwargs))
    return keep_queries_frozen(peft_model) if model.config.gate_in_q_proj else peft_model


def keep_queries_frozen(peft_model):
    """Zero the query rows of every LoRA ``lora_B`` on a gated ``q_proj`` of ``peft_model`` and mask their gradient,
    so that training changes only the gate rows' update. Returns ``peft_model``; calling it again does nothing more."""
    config = peft_model.get_base_model().config
    for name, module in peft_model.named_modules():
        if not name.endswith("self_attn.q_proj") or not hasattr(module, "lora_B"):
            continue
        attention = peft_model.get_submodule(name.rsplit(".", 1)[0])
        for lora_b in module.lora_B.values():
            if getattr(lora_b.weight, "_gated_qwen_gate_rows", None) is not None:
                continue
            gate_rows = torch.zeros(lora_b.weight.shape[0], 1, dtype=lora_b.weight.dtype, device=lora_b.weight.device)
            _, gate = split_query_and_gate(
                gate_rows, config.num_key_value_heads, attention.head_dim, attention.gate_dim, dim=0
            )
            gate.fill_(1)  # a view of gate_rows: the rows that write gate logits
            with torch.no_grad():
                lora_b.weight.mul_(gate_rows)
            lora_b.weight.register_hook(lambda grad, rows=gate_rows: grad * rows)
            lora_b.weight._gated_qwen_gate_rows = gate_rows
    return peft_model


__all__ = ["gate_target_modules", "get_gate_peft_model", "keep_queries_frozen"]
