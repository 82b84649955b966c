"""Length extrapolation: perplexity at several context lengths, with or without RoPE scaling (YaRN).

- :func:`perplexity_by_context_length`: for each length L, the token stream cut into non-overlapping windows of
  L tokens (the remainder dropped), exp of the mean NLL over every predicted token of every window. A length
  longer than the stream is reported as not measurable (``perplexity`` None), never as a number.
- :func:`with_rope_scaling`: a copy of a config whose ``rope_parameters`` apply YaRN (or linear / dynamic NTK)
  scaling by a factor, the original context being the config's ``max_position_embeddings``.
- :func:`apply_rope_scaling`: the same on a loaded model, whose rotary embedding is rebuilt from the new config.

Works for stock Qwen3 / Qwen3-MoE and the gated models alike: they all take their rotary embedding from
``config.rope_parameters`` (transformers 5).
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

from ...errors import GatedQwenError


ROPE_TYPES = ("yarn", "linear", "dynamic")


@dataclass
class LengthPerplexity:
    """Perplexity at one context length; ``perplexity``/``mean_nll`` are None when the stream is shorter than it."""

    length: int
    windows: int
    tokens: int
    perplexity: float | None
    mean_nll: float | None
    beyond_max_position_embeddings: bool

    def to_json(self) -> dict:
        return asdict(self)


def check_rope_scaling(rope_type: str, factor: float) -> None:
    """Refuse a RoPE scaling this package does not apply, in one line.

    >>> check_rope_scaling("ntk", 2.0)
    Traceback (most recent call last):
    ...
    gated_qwen.errors.GatedQwenError: unknown RoPE scaling 'ntk': supported are yarn, linear, dynamic
    """
    if rope_type not in ROPE_TYPES:
        raise GatedQwenError(f"unknown RoPE scaling {rope_type!r}: supported are {', '.join(ROPE_TYPES)}")
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 1):
        raise GatedQwenError(f"the RoPE scaling factor must be a number above 1, not {factor}")


def with_rope_scaling(config, rope_type: str = "yarn", factor: float = 4.0):
    """A deep copy of ``config`` whose ``rope_parameters`` scale RoPE by ``factor`` (``config`` is left as it was).

    The original context (``original_max_position_embeddings``, which YaRN and dynamic NTK need) is the
    config's ``max_position_embeddings``, the length the model was trained at; ``rope_theta`` is kept.
    ``max_position_embeddings`` itself is not changed, so it still names the trained length.

    >>> from gated_qwen import Qwen3GatedConfig
    >>> config = with_rope_scaling(Qwen3GatedConfig(max_position_embeddings=4096), "yarn", 4)
    >>> {k: config.rope_parameters[k] for k in ("rope_type", "factor", "original_max_position_embeddings")}
    {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 4096}
    """
    check_rope_scaling(rope_type, factor)
    scaled = copy.deepcopy(config)
    current = dict(getattr(scaled, "rope_parameters", None) or {})
    if current.get("rope_type", "default") != "default":
        raise GatedQwenError(
            f"the model already scales RoPE ({current['rope_type']}); scaling it again is not supported"
        )
    theta = current.get("rope_theta", getattr(scaled, "rope_theta", None))
    if theta is None:
        raise GatedQwenError("the config has no rope_theta to scale")
    parameters = {**current, "rope_type": rope_type, "factor": float(factor), "rope_theta": theta}
    if rope_type in ("yarn", "dynamic"):
        parameters["original_max_position_embeddings"] = scaled.max_position_embeddings
    scaled.rope_parameters = parameters
    return scaled


def _rotary_embeddings(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute name, module) of every rotary embedding of ``model`` (one for Qwen3 and its kin)."""
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child).__name__.endswith("RotaryEmbedding"):
                found.append((parent, name, child))
    return found


def apply_rope_scaling(model: nn.Module, rope_type: str = "yarn", factor: float = 4.0) -> nn.Module:
    """Scale the RoPE of a loaded model in place (its config and its rotary embedding); returns the model.

    Loading with ``from_pretrained(config=with_rope_scaling(...))`` gives the same model; this is for a model
    already loaded. It is correct because in Qwen3 (and the gated and MoE models) the rotary embedding is the
    only module that reads ``rope_parameters``: it turns them into ``inv_freq`` and ``attention_scaling`` when
    built, and its ``inv_freq`` is a non-persistent buffer, never read from the checkpoint, so rebuilding it
    from the new config equals building the model with that config. Nothing on disk is touched.

    >>> from gated_qwen import Qwen3GatedForCausalLM
    >>> from gated_qwen.default_models import default_model_path
    >>> model = Qwen3GatedForCausalLM.from_pretrained(default_model_path("headwise"))  # trained at 256 positions
    >>> apply_rope_scaling(model, "yarn", 4).config.rope_parameters["rope_type"]
    'yarn'
    >>> model.config.max_position_embeddings, model.config.rope_parameters["original_max_position_embeddings"]
    (256, 256)
    """
    rotary = _rotary_embeddings(model)
    if not rotary:
        raise GatedQwenError(f"{type(model).__name__} has no rotary embedding to scale")
    scaled = with_rope_scaling(model.config, rope_type, factor)
    model.config.rope_parameters = scaled.rope_parameters
    for parent, name, module in rotary:
        module.config.rope_parameters = scaled.rope_parameters  # the model's config, or a sub-config of it
        setattr(parent, name, type(module)(config=module.config).to(module.inv_freq.device))
    return model


def perplexity_by_context_length(
    model: nn.Module, token_ids: torch.Tensor, lengths, batch_size: int = 1
) -> list[LengthPerplexity]:
    """Perplexity of ``token_ids`` at each context length in ``lengths``, one :class:`LengthPerplexity` per length.

    At length L the stream is cut into ``len(token_ids) // L`` non-overlapping windows of L tokens (the
    remainder dropped); each window predicts its tokens 2..L from the ones before, so L - 1 tokens are
    scored per window, and the perplexity is exp of the mean NLL over all of them. A window starts at position
    0, so at L > ``max_position_embeddings`` the model sees positions it was not trained on (flagged in
    ``beyond_max_position_embeddings``). With fewer than L tokens the length is not measurable: windows 0 and
    perplexity None. ``batch_size`` windows run per forward.

    >>> from transformers import AutoTokenizer
    >>> from gated_qwen import Qwen3GatedForCausalLM
    >>> from gated_qwen.default_models import default_model_path
    >>> model = Qwen3GatedForCausalLM.from_pretrained(default_model_path("headwise"))  # trained at 256 positions
    >>> tokenizer = AutoTokenizer.from_pretrained(default_model_path("headwise"))
    >>> text = "Return the value of the named option, or the default when the section has no such option. " * 8
    >>> ids = tokenizer(text, return_tensors="pt").input_ids[0][:64]  # 64 tokens
    >>> results = perplexity_by_context_length(model, ids, [16, 32, 512])
    >>> [(r.length, r.windows, r.tokens, r.beyond_max_position_embeddings) for r in results]
    [(16, 4, 60, False), (32, 2, 62, False), (512, 0, 0, True)]
    >>> results[0].perplexity > 1, results[-1].perplexity is None  # 64 tokens cannot fill a window of 512
    (True, True)
    """
    token_ids = torch.as_tensor(token_ids).flatten()
    lengths = list(lengths)
    bad = [length for length in lengths if isinstance(length, bool) or not isinstance(length, int) or length < 2]
    if bad:
        raise GatedQwenError(f"context lengths must be integers of at least 2 tokens, not {bad}")
    if batch_size < 1:
        raise GatedQwenError(f"the batch size must be at least 1, not {batch_size}")
    limit = getattr(model.config, "max_position_embeddings", None)
    device = next(model.parameters()).device
    results = []
    for length in lengths:
        count = token_ids.numel() // length
        beyond = limit is not None and length > limit
        if count == 0:
            results.append(LengthPerplexity(length, 0, 0, None, None, beyond))
            continue
        windows = token_ids[: count * length].view(count, length)
        total_nll, total_tokens = 0.0, 0
        with torch.no_grad():
            for first in range(0, count, batch_size):
                batch = windows[first : first + batch_size].to(device)
                logits = model(input_ids=batch).logits.float()  # (B, L, V); logits at i predict token i + 1
                total_nll += nn.functional.cross_entropy(
                    logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten(), reduction="sum"
                ).item()
                total_tokens += batch.shape[0] * (length - 1)
        mean_nll = total_nll / total_tokens
        results.append(LengthPerplexity(length, count, total_tokens, math.exp(mean_nll), mean_nll, beyond))
    return results
