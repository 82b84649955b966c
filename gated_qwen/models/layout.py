"""The released q_proj row layout: where the gate logits sit among the query rows.

The gate has no tensor of its own in the released checkpoints: it is extra output rows of
``q_proj``, grouped by key/value head (see ``docs/released-format.md``, the released checkpoint format)::

    for each kv head k:  [ queries of its G heads (G*D rows) | gate logits of its G heads (G*g rows) ]

with G query heads per kv head, head dim D, and g = 1 (headwise) or D (elementwise). This is *not*
the per-head ``[query | gate]`` interleave of transformers' Qwen3-Next; the two differ when G > 1.

:func:`split_query_and_gate` and :func:`merge_query_and_gate` are the one pair of functions that
read and write this layout. The model splits activations with them, the converter merges weights,
the analysis splits both.
"""

from __future__ import annotations

import torch

from ..utils.names import GATE_TYPES


def gate_dim(gate_type: str, head_dim: int) -> int:
    """Gate logits per head: 0 (none), 1 (headwise) or ``head_dim`` (elementwise).

    >>> gate_dim("headwise", 128), gate_dim("elementwise", 128), gate_dim("none", 128)
    (1, 128, 0)
    """
    if gate_type not in GATE_TYPES:
        raise ValueError(f"unknown gate type {gate_type!r}; expected one of {', '.join(GATE_TYPES)}")
    return {"none": 0, "headwise": 1, "elementwise": head_dim}[gate_type]


def q_proj_rows(gate_type: str, num_attention_heads: int, head_dim: int) -> int:
    """Output rows of a q_proj for this gate type: ``H*D + H*g``.

    >>> q_proj_rows("headwise", 16, 128)
    2064
    """
    return num_attention_heads * (head_dim + gate_dim(gate_type, head_dim))


def gate_heads_and_width(config) -> tuple[int, int]:
    """The scores a gate outside q_proj (``g_proj``) yields per token, as ``(heads, width)``.

    Heads: one set per query head (SDPA output, query), per kv head (value, key), one shared by all heads
    (``gate_shared_across_heads``) or one for o_proj's output (``dense_output``). Width: 1 (headwise) or
    ``head_dim`` (elementwise; ``hidden_size`` at ``dense_output``). g_proj has ``heads * width`` output rows.

    >>> from types import SimpleNamespace
    >>> config = SimpleNamespace(gate_type="elementwise", gate_position="value", gate_shared_across_heads=False,
    ...                          num_attention_heads=8, num_key_value_heads=2, head_dim=16, hidden_size=128)
    >>> gate_heads_and_width(config)
    (2, 16)
    """
    if config.gate_position == "dense_output":
        return 1, config.hidden_size
    width = gate_dim(config.gate_type, config.head_dim)
    if config.gate_shared_across_heads:
        return 1, width
    per_kv_head = config.gate_position in ("value", "key")
    return (config.num_key_value_heads if per_kv_head else config.num_attention_heads), width


def gate_type_for_rows(rows: int, num_attention_heads: int, head_dim: int) -> str | None:
    """The gate type a q_proj with ``rows`` output rows implies, or None if no gate type fits.

    >>> gate_type_for_rows(4096, 16, 128)
    'elementwise'
    """
    for gate_type in GATE_TYPES:
        if q_proj_rows(gate_type, num_attention_heads, head_dim) == rows:
            return gate_type
    return None


def split_query_and_gate(
    fused: torch.Tensor, num_key_value_heads: int, head_dim: int, gate_dim: int, dim: int = -1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split q_proj rows (or outputs) along ``dim`` into grouped queries and gate logits.

    ``fused`` has ``K * G * (D + g)`` entries along ``dim``. Both results are views of it: the queries
    with ``(K, G, D)`` in place of ``dim``, the gate logits with ``(K, G, g)``. G is derived from the
    size, so a tensor-parallel shard holding whole kv groups splits the same way with its local K.

    >>> fused = torch.arange(2 * (2 * 4 + 2 * 1)).float()      # K=2, G=2, D=4, g=1
    >>> query, gate = split_query_and_gate(fused, num_key_value_heads=2, head_dim=4, gate_dim=1)
    >>> query.shape, gate.flatten().tolist()
    (torch.Size([2, 2, 4]), [8.0, 9.0, 18.0, 19.0])
    """
    dim = dim % fused.ndim
    group_rows = head_dim + gate_dim
    if fused.shape[dim] % (num_key_value_heads * group_rows):
        raise ValueError(
            f"{fused.shape[dim]} q_proj rows do not split into {num_key_value_heads} kv groups of "
            f"heads with {head_dim} query rows and {gate_dim} gate rows each"
        )
    grouped = fused.unflatten(dim, (num_key_value_heads, -1))  # K, G*(D+g) at dim
    heads_per_group = grouped.shape[dim + 1] // group_rows
    query, gate = grouped.split([heads_per_group * head_dim, heads_per_group * gate_dim], dim=dim + 1)
    return (
        query.unflatten(dim + 1, (heads_per_group, head_dim)),  # K, G, D at dim
        gate.unflatten(dim + 1, (heads_per_group, gate_dim)),  # K, G, g at dim
    )


def merge_query_and_gate(query: torch.Tensor, gate: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Inverse of :func:`split_query_and_gate`: ``(K, G, D)`` and ``(K, G, g)`` back to one ``dim``.

    ``dim`` names the position of the merged axis in the result, as in the split.

    >>> query, gate = torch.zeros(2, 3, 4, 8), torch.ones(2, 3, 1, 8)   # K=2, G=3, D=4, g=1; 8 inputs
    >>> merge_query_and_gate(query, gate, dim=0).shape                   # a q_proj weight
    torch.Size([30, 8])
    """
    dim = dim % (query.ndim - 2)
    if query.shape[: dim + 2] != gate.shape[: dim + 2] or query.shape[dim + 3 :] != gate.shape[dim + 3 :]:
        raise ValueError(f"query {tuple(query.shape)} and gate {tuple(gate.shape)} are not of the same heads")
    grouped = torch.cat([query.flatten(dim + 1, dim + 2), gate.flatten(dim + 1, dim + 2)], dim=dim + 1)
    return grouped.flatten(dim, dim + 1)
