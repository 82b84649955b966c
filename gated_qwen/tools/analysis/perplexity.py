"""Sliding-window perplexity of a token stream (:func:`perplexity`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ...errors import GatedQwenError


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
