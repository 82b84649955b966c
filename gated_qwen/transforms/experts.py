"""What a mixture-of-experts checkpoint needs on its way through the transforms: its experts' two storages.

transformers 5 holds a Qwen3-MoE layer's experts as two fused tensors, ``mlp.experts.gate_up_proj``
``(E, 2*I, hidden)`` (each expert's gate rows, then its up rows) and ``mlp.experts.down_proj`` ``(E, hidden, I)``,
and converts them on ``save_pretrained`` to the storage of the released checkpoints, one tensor per expert and
projection: ``mlp.experts.{e}.gate_proj.weight`` ``(I, hidden)``, ``up_proj`` likewise, ``down_proj``
``(hidden, I)`` (transformers 5.19 and 5.25 alike; Qwen3.5-MoE the same). The transforms write that storage,
the one every reader takes (transformers, vLLM, the released models): :func:`saved_shapes` gives a model's
tensors as ``save_pretrained`` writes them, and :func:`split_fused_experts` turns a source saved fused
(``save_original_format=False``) into it; :func:`fuse_experts` is its inverse, back to the model's storage. The
values are never changed, only where they are stored.

>>> import torch
>>> [(name, tuple(t.shape)) for name, t in split_fused_experts("model.layers.0.mlp.experts.down_proj", torch.zeros(2, 8, 4))]
[('model.layers.0.mlp.experts.0.down_proj.weight', (8, 4)), ('model.layers.0.mlp.experts.1.down_proj.weight', (8, 4))]
"""

from __future__ import annotations

import torch


FUSED_GATE_UP = "mlp.experts.gate_up_proj"
FUSED_DOWN = "mlp.experts.down_proj"


def is_fused_experts(name: str) -> bool:
    """Whether ``name`` is one of transformers' fused expert tensors.

    >>> is_fused_experts("model.layers.3.mlp.experts.gate_up_proj"), is_fused_experts("model.layers.3.mlp.experts.0.up_proj.weight")
    (True, False)
    """
    return name.endswith((FUSED_GATE_UP, FUSED_DOWN))


def piece_names(name: str, num_experts: int) -> list[str]:
    """The names of the per-expert tensors the fused expert tensor ``name`` holds, in the order
    :func:`split_fused_experts` gives them and :func:`fuse_experts` takes them.

    >>> piece_names("model.layers.0.mlp.experts.gate_up_proj", 2)  # doctest: +NORMALIZE_WHITESPACE
    ['model.layers.0.mlp.experts.0.gate_proj.weight', 'model.layers.0.mlp.experts.0.up_proj.weight',
     'model.layers.0.mlp.experts.1.gate_proj.weight', 'model.layers.0.mlp.experts.1.up_proj.weight']
    """
    gate_up = name.endswith(FUSED_GATE_UP)
    prefix = name[: -len(FUSED_GATE_UP if gate_up else FUSED_DOWN)] + "mlp.experts."
    projections = ("gate_proj", "up_proj") if gate_up else ("down_proj",)
    return [f"{prefix}{expert}.{projection}.weight" for expert in range(num_experts) for projection in projections]


def split_fused_experts(name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The per-expert tensors, as ``(name, tensor)`` views, that a fused expert tensor holds.

    ``gate_up_proj`` ``(E, 2*I, hidden)`` gives each expert's ``gate_proj`` (its first I rows) and ``up_proj``
    (the next I), as transformers concatenates them; ``down_proj`` ``(E, hidden, I)`` each expert's
    ``down_proj``. Works on meta tensors.
    """
    if name.endswith(FUSED_GATE_UP):
        if tensor.ndim != 3 or tensor.shape[1] % 2:
            raise ValueError(f"a fused gate_up_proj is (experts, 2 * intermediate, hidden), not {tuple(tensor.shape)}")
        gate, up = tensor.chunk(2, dim=1)
        parts = [part[expert] for expert in range(tensor.shape[0]) for part in (gate, up)]
    else:
        if tensor.ndim != 3:
            raise ValueError(f"a fused down_proj is (experts, hidden, intermediate), not {tuple(tensor.shape)}")
        parts = [tensor[expert] for expert in range(tensor.shape[0])]
    return list(zip(piece_names(name, tensor.shape[0]), parts))


def fuse_experts(name: str, pieces: list[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """The fused expert tensor ``name`` from its per-expert ``(name, tensor)`` pieces, in the order
    :func:`split_fused_experts` gives them: its inverse, so ``fuse_experts(name, split_fused_experts(name, t))``
    equals ``t``. A piece named otherwise than that order says is refused.

    >>> fused = torch.arange(2 * 6 * 3.0).reshape(2, 6, 3)  # 2 experts, intermediate 3, hidden 3
    >>> name = "model.layers.0.mlp.experts.gate_up_proj"
    >>> torch.equal(fuse_experts(name, split_fused_experts(name, fused)), fused)
    True
    """
    per_expert = 2 if name.endswith(FUSED_GATE_UP) else 1
    names = [piece_name for piece_name, _ in pieces]
    expected = piece_names(name, len(pieces) // per_expert)
    if not pieces or names != expected:
        raise ValueError(f"the pieces of {name} are {expected}, not {names}")
    tensors = [tensor for _, tensor in pieces]
    if per_expert == 1:
        return torch.stack(tensors)  # (E, hidden, I)
    return torch.cat([torch.stack(tensors[0::2]), torch.stack(tensors[1::2])], dim=1)  # (E, 2*I, hidden)


def saved_shapes(model: torch.nn.Module, skip: set[str] = frozenset()) -> dict[str, tuple[int, ...]]:
    """The tensors ``model`` saves (``save_pretrained``'s names and shapes): its state dict with each fused
    expert tensor as one tensor per expert and projection. ``model`` may be a skeleton on the meta device;
    names in ``skip`` (a tied ``lm_head``) are left out.

    >>> from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    >>> with torch.device("meta"):
    ...     model = Qwen3MoeForCausalLM(Qwen3MoeConfig(num_hidden_layers=1, num_experts=2, moe_intermediate_size=4, hidden_size=8,
    ...                                                num_attention_heads=2, num_key_value_heads=1, vocab_size=16))
    >>> saved_shapes(model)["model.layers.0.mlp.experts.1.up_proj.weight"]
    (4, 8)
    """
    shapes = {}
    for name, tensor in model.state_dict().items():
        if name in skip:
            continue
        pieces = split_fused_experts(name, tensor) if is_fused_experts(name) else [(name, tensor)]
        shapes.update((piece_name, tuple(piece.shape)) for piece_name, piece in pieces)
    return shapes


__all__ = ["fuse_experts", "is_fused_experts", "piece_names", "saved_shapes", "split_fused_experts"]
