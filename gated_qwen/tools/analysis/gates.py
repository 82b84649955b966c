"""Gate values and gate ablation (arXiv 2505.06708), through hooks removed on exit.

- :func:`record_gates` records the gate (after the sigmoid) of every gated layer during any forward
  or ``generate``; :func:`summarize_gates` turns a record into means, medians and sparsity fractions.
- :func:`override_gates` replaces the gate (constant, scale, per-layer / per-head selection, callable)
  through ``Qwen3GatedAttention.gate_override``, the one hook point the model offers for it.
- :func:`attention_layers`, :func:`gated_attention_layers`, :func:`gate_heads`: the attention modules of a
  model and the heads of a gate, which the other instruments share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

from ...errors import GatedQwenError
from ...models.layout import gate_heads_and_width


HISTOGRAM_BINS = 20


def attention_layers(model: nn.Module) -> list[Qwen3Attention]:
    """The attention modules of a Qwen3 or Qwen3Gated model, in layer order."""
    return sorted((m for m in model.modules() if isinstance(m, Qwen3Attention)), key=lambda m: m.layer_idx)


def gated_attention_layers(model: nn.Module) -> list[Qwen3Attention]:
    """The attention modules that apply a gate (none in a baseline or stock Qwen3 model), whatever its variant."""
    return [m for m in attention_layers(model) if getattr(m, "gate_position", None)]


def gate_heads(attention: Qwen3Attention) -> int:
    """How many sets of gate scores a gated attention has: its heads (query heads, or kv heads for a value or key
    gate), or 1 for a gate shared across heads or on o_proj's output (docs/design-space.md)."""
    if attention.gate_dim:  # the released layout: one set per query head
        return attention.config.num_attention_heads
    return gate_heads_and_width(attention.config)[0]


def _require_gates(model: nn.Module, what: str) -> list[Qwen3Attention]:
    layers = gated_attention_layers(model)
    if not layers:
        raise GatedQwenError(
            f"{what} needs a gated model (headwise or elementwise); this model has no gated attention layer"
        )
    return layers


@dataclass
class GateRecord:
    """Gate values recorded per layer: one (N, H, g) float32 tensor per forward call and the positions of its N tokens."""

    values: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    positions: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    @property
    def layers(self) -> list[int]:
        return sorted(self.values)

    def gates(self, layer: int) -> torch.Tensor:
        """All gates of ``layer`` recorded so far, (N, H, g), tokens of every call and batch row in order."""
        return torch.cat(self.values[layer])

    def token_positions(self, layer: int) -> torch.Tensor:
        """The position of each recorded token of ``layer``, (N,); 0 is the first token of a sequence."""
        return torch.cat(self.positions[layer])


@contextmanager
def record_gates(model: nn.Module) -> Iterator[GateRecord]:
    """Record the gate, after its activation, of every gated layer and token during the forwards inside.

    The gate is read off the output of each attention's activation module (``gate_act_fn``), for every variant of
    the design space: ``(N, heads, width)`` per layer, heads as :func:`gate_heads` counts them. Outputs are
    unchanged. Values are the model's own gates: under :func:`override_gates` they are what the gate *would* have
    been. Works during ``generate`` (each step is one more call).

    >>> from transformers import AutoTokenizer
    >>> from gated_qwen import Qwen3GatedForCausalLM
    >>> from gated_qwen.default_models import default_model_path
    >>> model = Qwen3GatedForCausalLM.from_pretrained(default_model_path("headwise"))  # 4 layers of 4 heads
    >>> tokenizer = AutoTokenizer.from_pretrained(default_model_path("headwise"))
    >>> input_ids = tokenizer("def read_config(path):", return_tensors="pt").input_ids
    >>> with record_gates(model) as record:
    ...     output = model.generate(input_ids, max_new_tokens=8)
    >>> record.layers, record.gates(0).shape[1:]  # per token (heads, width): one gate per head
    ([0, 1, 2, 3], torch.Size([4, 1]))
    >>> len(record.gates(0)) == output.shape[1] - 1  # every token but the last generated one went through
    True
    """
    layers = _require_gates(model, "record_gates")
    record = GateRecord()
    pending_positions: dict[int, torch.Tensor] = {}
    handles = []

    def before_attention(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        position_ids = kwargs.get("position_ids")
        if position_ids is None:
            position_ids = torch.arange(hidden.shape[1], device=hidden.device)[None]
        pending_positions[module.layer_idx] = position_ids.expand(hidden.shape[:2])  # (B, T)

    def make_gate_hook(attention):
        def after_activation(module, args, output):
            gates = output.detach().float()  # (B, T, heads, width)
            positions = pending_positions.pop(attention.layer_idx, None)
            if positions is None:
                positions = torch.arange(gates.shape[1], device=gates.device).expand(gates.shape[:2])
            record.values.setdefault(attention.layer_idx, []).append(gates.flatten(0, 1).cpu())  # (B*T, H, g)
            record.positions.setdefault(attention.layer_idx, []).append(positions.flatten().cpu())

        return after_activation

    try:
        for attention in layers:
            handles.append(attention.register_forward_pre_hook(before_attention, with_kwargs=True))
            handles.append(attention.gate_act_fn.register_forward_hook(make_gate_hook(attention)))
        yield record
    finally:
        for handle in handles:
            handle.remove()


def _gate_stats(values: torch.Tensor) -> dict:
    values = values.flatten().float()
    if not values.numel():
        return {"count": 0}
    return {
        "count": values.numel(),
        "mean": values.mean().item(),
        "median": values.median().item(),
        "below_0.1": (values < 0.1).float().mean().item(),
        "below_0.5": (values < 0.5).float().mean().item(),
    }


def summarize_gates(record: GateRecord, bins: int = HISTOGRAM_BINS) -> dict:
    """Mean, median and fractions below 0.1 and 0.5 of the recorded gates: overall, per layer, per head, first token vs rest.

    Per layer also a histogram over [0, 1] (``bins`` equal bins, counts) for the figures.

    >>> from transformers import AutoTokenizer
    >>> from gated_qwen import Qwen3GatedForCausalLM
    >>> from gated_qwen.default_models import default_model_path
    >>> model = Qwen3GatedForCausalLM.from_pretrained(default_model_path("headwise"))  # 4 layers of 4 heads
    >>> tokenizer = AutoTokenizer.from_pretrained(default_model_path("headwise"))
    >>> input_ids = tokenizer("def read_config(path):", return_tensors="pt").input_ids
    >>> with record_gates(model) as record:
    ...     logits = model(input_ids).logits
    >>> layer = summarize_gates(record)["layers"][0]
    >>> sorted(layer)
    ['below_0.1', 'below_0.5', 'count', 'first_token', 'heads', 'histogram', 'layer', 'mean', 'median', 'rest']
    >>> 0 <= layer["below_0.1"] <= layer["below_0.5"] <= 1, sum(layer["histogram"]) == layer["count"]
    (True, True)
    """
    layers = []
    for layer in record.layers:
        gates, positions = record.gates(layer), record.token_positions(layer)  # (N, H, g), (N,)
        first = positions == 0
        layers.append(
            {
                "layer": layer,
                **_gate_stats(gates),
                "first_token": _gate_stats(gates[first]),
                "rest": _gate_stats(gates[~first]),
                "heads": [_gate_stats(gates[:, head]) for head in range(gates.shape[1])],
                "histogram": torch.histc(gates.flatten(), bins=bins, min=0.0, max=1.0).long().tolist(),
            }
        )
    everything = torch.cat([record.gates(layer).flatten() for layer in record.layers]) if layers else torch.empty(0)
    return {"overall": _gate_stats(everything), "histogram_bins": bins, "layers": layers}


def _head_selection(heads, layer: int, num_heads: int) -> torch.Tensor | None:
    """A (H,) bool mask of the heads to override in ``layer``, or None for all of them."""
    if heads is None:
        return None
    if isinstance(heads, torch.Tensor):
        mask = heads.bool()
        mask = mask[layer] if mask.ndim == 2 else mask
        if mask.shape != (num_heads,):
            raise GatedQwenError(
                f"the head mask has shape {tuple(heads.shape)}; expected ({num_heads},) or (layers, {num_heads})"
            )
        return mask
    mask = torch.zeros(num_heads, dtype=torch.bool)
    for head in heads:
        if not 0 <= head < num_heads:
            raise GatedQwenError(f"head {head} does not exist; the model has heads 0..{num_heads - 1}")
        mask[head] = True
    return mask


@contextmanager
def override_gates(
    model: nn.Module,
    value: float | Callable[[torch.Tensor, int], torch.Tensor] | None = None,
    *,
    scale: float | None = None,
    layers: Iterable[int] | None = None,
    heads: Iterable[int] | torch.Tensor | None = None,
) -> Iterator[None]:
    """Replace the gate the attention applies, for causal ablation; on exit the model is as before.

    ``value`` sets the gate: a constant, or a callable ``value(gate, layer_idx)`` of the gate after its
    activation, (B, T, heads, width), returning the gate to apply; None keeps the model's own gate. ``scale`` then
    multiplies it. Only the ``layers`` given (default all) and, in them, the ``heads`` given (a list,
    or a bool mask of shape (heads,) or (layers, heads); default all) are changed; the rest keep their gate.
    Heads are those of the gate (:func:`gate_heads`). For a multiplicative gate, a constant 1 everywhere gives the
    model without its gate (its query rows alone in a gate "none" model); for an additive one, a constant 0.

    >>> from transformers import AutoTokenizer
    >>> from gated_qwen import Qwen3GatedForCausalLM
    >>> from gated_qwen.default_models import default_model_path
    >>> model = Qwen3GatedForCausalLM.from_pretrained(default_model_path("headwise"))  # 4 layers of 4 heads
    >>> tokenizer = AutoTokenizer.from_pretrained(default_model_path("headwise"))
    >>> input_ids = tokenizer("def read_config(path):", return_tensors="pt").input_ids
    >>> logits = model(input_ids).logits
    >>> with override_gates(model, 0.0, layers=[3], heads=[0, 2]):  # heads 0 and 2 of the last layer closed
    ...     ablated = model(input_ids).logits
    >>> torch.allclose(ablated, logits), torch.allclose(model(input_ids).logits, logits)  # back as before on exit
    (False, True)
    """
    gated = _require_gates(model, "override_gates")
    if value is None and scale is None:
        raise GatedQwenError("override_gates needs a value (constant or callable), a scale, or both")
    chosen = {m.layer_idx: m for m in gated}
    if layers is not None:
        layers = list(layers)
        unknown = [layer for layer in layers if layer not in chosen]
        if unknown:
            raise GatedQwenError(f"layers {unknown} are not gated layers of this model; it has {sorted(chosen)}")
        chosen = {layer: chosen[layer] for layer in layers}

    def make_override(layer_idx: int, head_mask: torch.Tensor | None):
        def override(gate: torch.Tensor) -> torch.Tensor:  # (B, T, H, g)
            if value is None:
                new = gate
            elif callable(value):
                new = value(gate, layer_idx).to(gate.dtype).expand_as(gate)
            else:
                new = torch.full_like(gate, value)
            if scale is not None:
                new = new * scale
            if head_mask is not None:
                new = torch.where(head_mask.to(gate.device)[:, None], new, gate)
            return new

        return override

    previous = {layer: module.gate_override for layer, module in chosen.items()}
    try:
        for layer, module in chosen.items():
            module.gate_override = make_override(layer, _head_selection(heads, layer, gate_heads(module)))
        yield
    finally:
        for layer, module in chosen.items():
            module.gate_override = previous[layer]
