"""How the router of a mixture of experts spreads the tokens over its experts (:func:`router_load`)."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def router_load(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> list[dict] | None:
    """Per sparse layer of a mixture of experts, how the router spreads the tokens: None for a dense model.

    From the router logits the model returns (``output_router_logits=True``, transformers' Qwen3-MoE): each
    expert's share of the top-k choices (``load``, summing to 1; an even spread is ``1 / num_experts`` each),
    the largest share over the even one (``max_over_even``, 1.0 when perfectly balanced), the experts that no
    token chose (``unused``), and the mean routing probability each expert gets (``mean_probability``), the two
    factors of the auxiliary load-balancing loss. Padded positions are left out.

    >>> from gated_qwen import Qwen3MoeGatedConfig, Qwen3MoeGatedForCausalLM
    >>> config = Qwen3MoeGatedConfig(
    ...     vocab_size=64, hidden_size=32, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    ... )  # a tiny mixture of experts, randomly initialized
    >>> rows = router_load(Qwen3MoeGatedForCausalLM(config), torch.randint(64, (1, 16)))
    >>> [row["layer"] for row in rows], [len(row["load"]) for row in rows], round(sum(rows[0]["load"]), 6)
    ([0, 1], [4, 4], 1.0)
    >>> 1 <= rows[0]["max_over_even"] <= 2  # 2 distinct experts of 4 per token: no expert gets over half
    True
    """
    config = model.config
    if not getattr(config, "num_experts", 0):
        return None
    router_logits = model(input_ids=input_ids, attention_mask=attention_mask, output_router_logits=True).router_logits
    layers = [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")]
    keep = None if attention_mask is None else attention_mask.bool().flatten()
    rows = []
    for layer, logits in zip(layers, router_logits, strict=True):
        logits = logits.float()
        if keep is not None:
            logits = logits[keep.to(logits.device)]
        probabilities = logits.softmax(-1)  # (N, E)
        chosen = probabilities.topk(config.num_experts_per_tok, dim=-1).indices.flatten()
        counts = torch.bincount(chosen, minlength=config.num_experts).float()
        load = counts / counts.sum()
        rows.append(
            {
                "layer": layer,
                "load": load.tolist(),
                "max_over_even": load.max().item() * config.num_experts,
                "unused": int((counts == 0).sum()),
                "mean_probability": probabilities.mean(0).tolist(),
            }
        )
    return rows
