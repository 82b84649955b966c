"""Devices, dtypes and attention implementations by name, checked with one clear message each.

Shared by the commands that load a model (generate, analyze, convert, eval); the names themselves live in
:mod:`gated_qwen.utils.names`, which the command line's parsers import without torch.
"""

from __future__ import annotations

import torch
from transformers.utils import is_flash_attn_2_available, is_torch_flex_attn_available

from ..errors import GatedQwenError
from .names import ATTENTION_IMPLEMENTATIONS, DEVICES, DTYPES


def resolve_device(name: str = "auto") -> torch.device:
    """The torch device for ``name`` (auto: cuda, then mps, then cpu), or an error saying why it is unavailable.

    >>> resolve_device("cpu")
    device(type='cpu')
    """
    if name not in DEVICES:
        raise GatedQwenError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)}")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if torch.backends.mps.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        reason = "this torch build has no CUDA support" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise GatedQwenError(f"device cuda is unavailable: {reason}; use --device cpu (or auto)")
    if name == "mps" and not torch.backends.mps.is_available():
        raise GatedQwenError(
            "device mps is unavailable: it needs Apple silicon and a torch built with MPS; use --device cpu"
        )
    return torch.device(name)


def resolve_dtype(name: str = "auto") -> torch.dtype | str:
    """The torch dtype for ``name``; ``"auto"`` stays ``"auto"`` (the checkpoint's own dtype).

    >>> resolve_dtype("bfloat16")
    torch.bfloat16
    """
    if name not in DTYPES:
        raise GatedQwenError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return "auto" if name == "auto" else getattr(torch, name)


def check_attention(attn_implementation: str | None, device: torch.device, dtype: torch.dtype | str) -> None:
    """Refuse an attention implementation that cannot run here, saying what it needs.

    ``None`` lets transformers choose (sdpa where it can).

    >>> check_attention("flash_attention_2", torch.device("cpu"), torch.bfloat16)
    Traceback (most recent call last):
    ...
    gated_qwen.errors.GatedQwenError: attention flash_attention_2 needs a CUDA device, not cpu; use --attn sdpa
    """
    if attn_implementation is None:
        return
    if attn_implementation not in ATTENTION_IMPLEMENTATIONS:
        raise GatedQwenError(
            f"unknown attention {attn_implementation!r}; choose one of {', '.join(ATTENTION_IMPLEMENTATIONS)}"
        )
    if attn_implementation == "flash_attention_2":
        if device.type != "cuda":
            raise GatedQwenError(
                f"attention flash_attention_2 needs a CUDA device, not {device.type}; use --attn sdpa"
            )
        if not is_flash_attn_2_available():
            raise GatedQwenError(
                "attention flash_attention_2 needs the flash-attn package (>= 2.3.3), which is not installed: "
                "pip install flash-attn, or use --attn sdpa"
            )
        if dtype == torch.float32:
            raise GatedQwenError("attention flash_attention_2 runs in float16 or bfloat16 only; pass --dtype bfloat16")
    if attn_implementation == "flex_attention" and not is_torch_flex_attn_available():
        raise GatedQwenError("attention flex_attention is unavailable with this torch or device; use --attn sdpa")
