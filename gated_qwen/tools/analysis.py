"""The paper's instruments (arXiv 2505.06708): gate values, gate ablation, attention sinks, massive activations, perplexity.

Everything here works on a model as it is, through forward hooks that are removed on exit:

- :func:`record_gates` records the gate (after the sigmoid) of every gated layer during any forward
  or ``generate``; :func:`summarize_gates` turns a record into means, medians and sparsity fractions.
- :func:`override_gates` replaces the gate (constant, scale, per-layer / per-head selection, callable)
  through ``Qwen3GatedAttention.gate_override``, the one hook point the model offers for it.
- :func:`record_attention` / :func:`attention_sink` measure the first-token attention mass per layer
  and head. Attention probabilities exist only in the eager backend, so the model is switched to
  ``"eager"`` for the duration and back after; the probabilities are reduced inside a hook on each
  attention module as they are produced, so memory stays O(T^2) for one layer rather than all of
  them (``output_attentions=True`` would keep every layer). Works for stock transformers Qwen3 too.
- :func:`massive_activations`: per layer, the largest |hidden state| and its ratio to the median.
- :func:`perplexity`: sliding-window perplexity of a token stream.
- :func:`plot_attention_maps`, :func:`plot_gate_histograms`, :func:`plot_first_token_attention`:
  PNG figures (matplotlib, the optional extra ``plot``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3DecoderLayer
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeDecoderLayer

from ..errors import GatedQwenError
from ..models.layout import gate_heads_and_width


FIGURE_DPI = 100
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


# ----------------------------------------------------------------------------------------------------------------- gates


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


# ------------------------------------------------------------------------------------------------------------- attention


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


# ---------------------------------------------------------------------------------------------------------- router load


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


# ------------------------------------------------------------------------------------------------------------ perplexity


@dataclass
class Perplexity:
    perplexity: float
    mean_nll: float
    tokens: int  # scored tokens: all but the first of the stream
    windows: int


@torch.no_grad()
def perplexity(
    model: nn.Module,
    input_ids: torch.Tensor,
    context: int = 512,
    stride: int | None = None,
    batch_size: int = 4,
    progress: bool = True,
) -> Perplexity:
    """Sliding-window perplexity of one token stream: exp of the mean NLL of every token after the first.

    Each token is scored exactly once. Windows of at most ``context`` tokens advance by ``stride``
    (default ``context // 2``, at most ``context - 1``) and score only their last ``stride`` tokens, so
    every token but those of the first window sees at least ``context - stride`` tokens before it.
    Windows run ``batch_size`` at a time (the last, shorter one padded on the right).

    >>> from transformers import AutoTokenizer
    >>> from gated_qwen import Qwen3GatedForCausalLM
    >>> from gated_qwen.default_models import default_model_path
    >>> model = Qwen3GatedForCausalLM.from_pretrained(default_model_path("headwise"))  # 4 layers of 4 heads
    >>> tokenizer = AutoTokenizer.from_pretrained(default_model_path("headwise"))
    >>> text = "Return the value of the named option, or the default when the section has no such option."
    >>> ids = tokenizer(text, return_tensors="pt").input_ids[0]
    >>> result = perplexity(model, ids, context=8, progress=False)
    >>> result.tokens == len(ids) - 1, result.windows > 1, math.isclose(result.perplexity, math.exp(result.mean_nll))
    (True, True, True)
    >>> result.perplexity < len(tokenizer)  # better than a uniform guess over the vocabulary
    True
    """
    from tqdm.auto import tqdm

    input_ids = input_ids.flatten()
    stride = stride or max(1, context // 2)
    if context < 2:
        raise GatedQwenError(f"the context must hold at least 2 tokens, not {context}")
    if not 0 < stride < context:
        raise GatedQwenError(f"the stride ({stride}) must be at least 1 and smaller than the context ({context})")
    if input_ids.numel() < 2:
        raise GatedQwenError(f"the text has {input_ids.numel()} token(s); perplexity needs at least 2")
    if batch_size < 1:
        raise GatedQwenError(f"the batch size must be at least 1, not {batch_size}")
    # Window w scores targets [start, end); its input is ids[begin:end], begin = max(0, end - context).
    windows, start = [], 1
    while start < input_ids.numel():
        end = min(start + stride if windows else context, input_ids.numel())
        windows.append((max(0, end - context), start, end))
        start = end
    device = next(model.parameters()).device
    total_nll, total_tokens = 0.0, 0
    for first in tqdm(range(0, len(windows), batch_size), desc="perplexity", unit="batch", disable=not progress):
        batch = windows[first : first + batch_size]
        length = max(end - begin for begin, _, end in batch)
        ids = torch.zeros(len(batch), length, dtype=torch.long)
        mask = torch.zeros(len(batch), length, dtype=torch.long)
        labels = torch.full((len(batch), length), -100)
        for row, (begin, start, end) in enumerate(batch):
            ids[row, : end - begin] = input_ids[begin:end]
            mask[row, : end - begin] = 1
            labels[row, start - begin : end - begin] = input_ids[start:end]
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()  # (W, T, V)
        # logits at i predict token i + 1
        nll = nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten().to(device), ignore_index=-100, reduction="sum"
        )
        total_nll += nll.item()
        total_tokens += int((labels[:, 1:] != -100).sum())
    mean_nll = total_nll / total_tokens
    return Perplexity(math.exp(mean_nll), mean_nll, total_tokens, len(windows))


# --------------------------------------------------------------------------------------------------------------- figures


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise GatedQwenError("figures need matplotlib: pip install 'gated-qwen[plot]' (or skip figures)") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(figure, path) -> None:
    # no bbox_inches="tight": the PNG keeps the pixel size figsize * dpi
    figure.savefig(path, dpi=FIGURE_DPI)
    figure.clf()
    _pyplot().close(figure)


def plot_attention_maps(
    maps: dict[str, dict[int, torch.Tensor]], tokens: dict[str, list[str]], path
) -> tuple[int, int]:
    """One heat map per model (rows) and layer (columns), averaged over heads, tokens on both axes; returns (width, height) px.

    Not run as a test (it needs matplotlib, the ``plot`` extra, which the tests may lack):

    >>> plot_attention_maps({"headwise": {0: map0}}, {"headwise": ["The", " fox"]}, "maps.png")  # doctest: +SKIP
    (400, 400)
    """
    plt = _pyplot()
    rows, columns = len(maps), max(len(layer_maps) for layer_maps in maps.values())
    size = (4 * columns, 4 * rows)
    figure, axes = plt.subplots(rows, columns, figsize=size, squeeze=False)
    for row, (label, layer_maps) in enumerate(maps.items()):
        for column, (layer, attention) in enumerate(sorted(layer_maps.items())):
            axis = axes[row][column]
            axis.imshow(attention.numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            names = [token.replace("\n", "\\n") for token in tokens[label]]
            step = math.ceil(len(names) / 48)  # at most 48 labels per axis stay legible
            positions = range(0, len(names), step)
            axis.set_xticks(positions, names[::step], rotation=90, fontsize=5)
            axis.set_yticks(positions, names[::step], fontsize=5)
            axis.set_xlabel("key", fontsize=8)
            axis.set_ylabel("query", fontsize=8)
            axis.set_title(f"{label}: layer {layer}", fontsize=9)
    figure.tight_layout()
    _save(figure, path)
    return size[0] * FIGURE_DPI, size[1] * FIGURE_DPI


def plot_gate_histograms(histograms: dict[str, list[list[int]]], path) -> tuple[int, int]:
    """Gate histograms per layer (one panel each), one bar series per gated model; returns (width, height) px."""
    plt = _pyplot()
    layers = max(len(h) for h in histograms.values())
    columns = min(layers, 4)
    rows = math.ceil(layers / columns)
    size = (3 * columns, 2.5 * rows)
    figure, axes = plt.subplots(rows, columns, figsize=size, squeeze=False)
    for layer in range(rows * columns):
        axis = axes[layer // columns][layer % columns]
        if layer >= layers:
            axis.axis("off")
            continue
        for label, per_layer in histograms.items():
            counts = torch.tensor(per_layer[layer], dtype=torch.float)
            edges = torch.linspace(0, 1, len(counts) + 1)
            axis.stairs((counts / counts.sum().clamp(min=1)).numpy(), edges.numpy(), label=label)
        axis.set_title(f"layer {layer}", fontsize=9)
        axis.set_xlim(0, 1)
    axes[0][0].legend(fontsize=7)
    figure.supxlabel("gate value")
    figure.tight_layout()
    _save(figure, path)
    return int(size[0] * FIGURE_DPI), int(size[1] * FIGURE_DPI)


def plot_first_token_attention(first_token: dict[str, list[float]], path) -> tuple[int, int]:
    """First-token attention mass per layer, one line per model; returns (width, height) px."""
    plt = _pyplot()
    size = (8, 5)
    figure, axis = plt.subplots(figsize=size)
    for label, per_layer in first_token.items():
        axis.plot(
            range(len(per_layer)), per_layer, marker="o", label=f"{label} (mean {sum(per_layer) / len(per_layer):.3f})"
        )
    axis.xaxis.get_major_locator().set_params(integer=True)  # layers are whole numbers
    axis.set_xlabel("layer")
    axis.set_ylabel("attention on the first token")
    axis.set_ylim(0, 1)
    axis.legend()
    figure.tight_layout()
    _save(figure, path)
    return size[0] * FIGURE_DPI, size[1] * FIGURE_DPI


__all__ = [
    "AttentionRecord",
    "GateRecord",
    "Perplexity",
    "attention_sink",
    "first_token_attention",
    "massive_activations",
    "override_gates",
    "perplexity",
    "plot_attention_maps",
    "plot_first_token_attention",
    "plot_gate_histograms",
    "record_attention",
    "record_gates",
    "summarize_gates",
]
