"""Attention sinks and massive activations (arXiv 2505.06708), measured through hooks removed on exit.

- :func:`record_attention` / :func:`attention_sink` measure the first-token attention mass per layer
  and head. Attention probabilities exist only in the eager backend, so the model is switched to
  ``"eager"`` for the duration and back after; the probabilities are reduced inside a hook on each
  attention module as they are produced, so memory stays O(T^2) for one layer rather than all of
  them (``output_attentions=True`` would keep every layer). Works for stock transformers Qwen3 too.
- :func:`massive_activations`: per layer, the largest |hidden state| and its ratio to the median.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeDecoderLayer

from ...errors import GatedQwenError
from .gates import attention_layers


def first_token_attention(
    attention: torch.Tensor, skip_first: int = 0, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The share of each query's attention on the first token, averaged over batch and queries, per head: (H,).

    ``attention`` holds probabilities, (B, H, T, S), the last T of S keys being the queries. Queries
    at positions below ``skip_first`` are left out (position 0 always puts all its attention on itself).
    With a 2D ``attention_mask`` (B, S) of 1 for real tokens, the first token of each row is its first
    real one and padded queries are left out.

    >>> uniform = torch.tril(torch.ones(3, 3)) / torch.arange(1, 4)[:, None]   # query i: 1/(i+1) on each key
    >>> first_token_attention(uniform[None, None]).tolist()                     # (1 + 1/2 + 1/3) / 3
    [0.6111111044883728]
    """
    batch, _, queries, keys = attention.shape
    if attention_mask is None:
        attention_mask = torch.ones(batch, keys, dtype=torch.long, device=attention.device)
    attention_mask = attention_mask.to(attention.device).bool()[:, -keys:]  # (B, S)
    first_key = attention_mask.long().argmax(-1)  # (B,)
    on_first = attention.gather(-1, first_key[:, None, None, None].expand(-1, attention.shape[1], queries, 1))[
        ..., 0
    ]  # (B, H, T)
    positions = attention_mask.long().cumsum(-1)[:, -queries:] - 1  # (B, T): 0 at the first real token
    keep = attention_mask[:, -queries:] & (positions >= skip_first)  # (B, T)
    if not keep.any():
        raise GatedQwenError(f"no query is left after skipping the first {skip_first}; give a longer input")
    weights = keep[:, None, :].float()
    return (on_first.float() * weights).sum((0, 2)) / weights.sum((0, 2))


@dataclass
class AttentionRecord:
    """First-token attention per layer and head, and head-averaged attention maps of chosen layers."""

    first_token_sum: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (H,) mass summed over calls
    calls: dict[int, int] = field(default_factory=dict)
    maps: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (T, S), batch row 0 of the last call

    def first_token(self) -> torch.Tensor:
        """(L, H): first-token mass per layer and head, averaged over the recorded calls."""
        return torch.stack([self.first_token_sum[layer] / self.calls[layer] for layer in sorted(self.first_token_sum)])


@contextmanager
def record_attention(
    model: nn.Module, skip_first: int = 0, attention_mask: torch.Tensor | None = None, map_layers: Iterable[int] = ()
) -> Iterator[AttentionRecord]:
    """Measure first-token attention per layer and head during the forwards inside (eager attention meanwhile).

    The probabilities are reduced with :func:`first_token_attention` in a hook on each attention module
    and then dropped, except the head average of ``map_layers`` (first batch row). ``attention_mask`` is
    the 2D padding mask of the inputs, if any.

    >>> from transformers import AutoTokenizer
    >>> from gated_qwen import Qwen3GatedForCausalLM
    >>> from gated_qwen.default_models import default_model_path
    >>> model = Qwen3GatedForCausalLM.from_pretrained(default_model_path("headwise"))  # 4 layers of 4 heads
    >>> tokenizer = AutoTokenizer.from_pretrained(default_model_path("headwise"))
    >>> input_ids = tokenizer("def read_config(path):", return_tensors="pt").input_ids
    >>> with record_attention(model, map_layers=[0]) as record:
    ...     logits = model(input_ids).logits
    >>> record.first_token().shape  # (layers, heads)
    torch.Size([4, 4])
    >>> 0 < record.first_token().mean().item() < 1, record.maps[0].shape == (input_ids.shape[1],) * 2
    (True, True)
    """
    record = AttentionRecord()
    map_layers = set(map_layers)
    previous_implementation = model.config._attn_implementation
    handles = []

    def after_attention(module, args, output):
        probabilities = output[1]  # (B, H, T, S)
        if probabilities is None:
            raise GatedQwenError(
                f"{type(module).__name__} returned no attention probabilities; it must run the eager backend"
            )
        layer = module.layer_idx
        mass = first_token_attention(probabilities.detach(), skip_first, attention_mask).cpu()
        record.first_token_sum[layer] = record.first_token_sum.get(layer, 0) + mass
        record.calls[layer] = record.calls.get(layer, 0) + 1
        if layer in map_layers:
            record.maps[layer] = probabilities[0].detach().float().mean(0).cpu()  # (T, S)

    try:
        if previous_implementation != "eager":
            model.set_attn_implementation("eager")
        for module in attention_layers(model):
            handles.append(module.register_forward_hook(after_attention))
        yield record
    finally:
        for handle in handles:
            handle.remove()
        if model.config._attn_implementation != previous_implementation:
            model.set_attn_implementation(previous_implementation)


@torch.no_grad()
def attention_sink(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, skip_first: int = 0
) -> torch.Tensor:
    """First-token attention mass per layer and head, (L, H), of one forward over ``input_ids``.

    The paper reports its mean over layers and heads: about 0.47 for the baseline, 0.05 with a gate.

    >>> from transformers import AutoTokenizer
    >>> from gated_qwen import Qwen3GatedForCausalLM
    >>> from gated_qwen.default_models import default_model_path
    >>> model = Qwen3GatedForCausalLM.from_pretrained(default_model_path("headwise"))  # 4 layers of 4 heads
    >>> tokenizer = AutoTokenizer.from_pretrained(default_model_path("headwise"))
    >>> sink = attention_sink(model, tokenizer("The quick brown fox", return_tensors="pt").input_ids)
    >>> sink.shape, 0 < sink.mean().item() < 1
    (torch.Size([4, 4]), True)
    """
    with record_attention(model, skip_first, attention_mask) as record:
        model(input_ids=input_ids, attention_mask=attention_mask)
    return record.first_token()


@torch.no_grad()
def massive_activations(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> list[dict]:
    """Per decoder layer, the largest |hidden state| of its output, where it is, and its ratio to the median |value|.

    Padded positions (``attention_mask`` 0) are left out.

    >>> from transformers import AutoTokenizer
    >>> from gated_qwen import Qwen3GatedForCausalLM
    >>> from gated_qwen.default_models import default_model_path
    >>> model = Qwen3GatedForCausalLM.from_pretrained(default_model_path("headwise"))  # 4 layers of 4 heads
    >>> tokenizer = AutoTokenizer.from_pretrained(default_model_path("headwise"))
    >>> input_ids = tokenizer("def read_config(path):", return_tensors="pt").input_ids
    >>> rows = massive_activations(model, input_ids)
    >>> len(rows), sorted(rows[-1])  # one row per decoder layer
    (4, ['channel', 'layer', 'max_abs', 'median_abs', 'ratio', 'token'])
    >>> all(row["max_abs"] >= row["median_abs"] > 0 and row["token"] < input_ids.shape[1] for row in rows)
    True
    """
    rows = []
    keep = None if attention_mask is None else attention_mask.bool()

    def after_layer(module, args, output):
        hidden = (output[0] if isinstance(output, tuple) else output).detach().float().abs()  # (B, T, C)
        if keep is not None:
            hidden = hidden * keep.to(hidden.device)[..., None]
        values = hidden[keep.to(hidden.device)] if keep is not None else hidden.flatten(0, 1)  # (N, C)
        flat_index = hidden.flatten().argmax().item()
        _, token, channel = torch.unravel_index(torch.tensor(flat_index), hidden.shape)
        max_abs, median_abs = hidden.max().item(), values.median().item()
        rows.append(
            {
                "layer": len(rows),
                "max_abs": max_abs,
                "median_abs": median_abs,
                "ratio": max_abs / median_abs if median_abs > 0 else math.inf,
                "token": token.item(),
                "channel": channel.item(),
            }
        )

    decoder_layers = [m for m in model.modules() if isinstance(m, (Qwen3DecoderLayer, Qwen3MoeDecoderLayer))]
    handles = [layer.register_forward_hook(after_layer) for layer in decoder_layers]
    try:
        model(input_ids=input_ids, attention_mask=attention_mask)
    finally:
        for handle in handles:
            handle.remove()
    return rows
