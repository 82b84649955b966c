"""The gate rows of q_proj as a parameter of their own, and optimizer parameter groups built on them.

Trainer (or any optimizer) knows nothing of the gate: in a Qwen3Gated checkpoint the gate rows are
interleaved with the query rows of one ``q_proj`` weight. :func:`separate_gate_rows` registers a
``torch.nn.utils.parametrize`` parametrization that keeps q_proj computing with the same fused
weight while its query rows and its gate rows become two Parameters; :func:`gate_parameter_groups`
then returns parameter groups any ``torch.optim`` optimizer accepts: the rest of the model, and the
gate rows at their own learning rate (or alone, the rest frozen).
"""

from __future__ import annotations

import torch

from .arguments import TrainingError


class QueryAndGateRows(torch.nn.Module):
    """A ``torch.nn.utils.parametrize`` parametrization of q_proj's weight (or bias) as two tensors.

    ``right_inverse`` splits the fused rows into the query rows and the gate rows (each flattened to
    ``(rows, *inputs)``, so a weight stays a matrix and a bias a vector); ``forward`` merges them back
    in the released layout. Both go through :mod:`gated_qwen.models.layout`. The gate rows so become a
    Parameter of their own, which an optimizer can treat apart from the rest of q_proj.

    >>> rows = QueryAndGateRows(num_key_value_heads=2, head_dim=4, gate_dim=1)
    >>> fused = torch.arange(20.0)                            # K=2 groups of G=2 heads: 16 query + 4 gate rows
    >>> query, gate = rows.right_inverse(fused)
    >>> gate.tolist(), torch.equal(rows(query, gate), fused)
    ([8.0, 9.0, 18.0, 19.0], True)
    """

    def __init__(self, num_key_value_heads: int, head_dim: int, gate_dim: int):
        super().__init__()
        self.num_key_value_heads, self.head_dim, self.gate_dim = num_key_value_heads, head_dim, gate_dim

    def forward(self, query_rows: torch.Tensor, gate_rows: torch.Tensor) -> torch.Tensor:
        from ...models.layout import merge_query_and_gate

        query = query_rows.unflatten(0, (self.num_key_value_heads, -1, self.head_dim))  # (K, G, D, *inputs)
        gate = gate_rows.unflatten(0, (self.num_key_value_heads, -1, self.gate_dim))  # (K, G, g, *inputs)
        return merge_query_and_gate(query, gate, dim=0)

    def right_inverse(self, fused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from ...models.layout import split_query_and_gate

        query, gate = split_query_and_gate(fused, self.num_key_value_heads, self.head_dim, self.gate_dim, dim=0)
        return query.flatten(0, 2).clone(), gate.flatten(0, 2).clone()


def _gated_q_projs(model) -> list[tuple[torch.nn.Module, QueryAndGateRows]]:
    from ...models.qwen3_gated.modeling_qwen3_gated import Qwen3GatedAttention

    return [
        # K from the key projection, as the attention itself reads it
        (
            module.q_proj,
            QueryAndGateRows(module.k_proj.out_features // module.head_dim, module.head_dim, module.gate_dim),
        )
        for module in model.modules()
        if isinstance(module, Qwen3GatedAttention) and module.gate_dim
    ]


def separate_gate_rows(model) -> list[torch.nn.Parameter]:
    """Give the gate rows of every gated q_proj (weight and bias) a Parameter of their own; returns them, with the
    weight of every ``g_proj`` (the projection of a gate outside q_proj, already a Parameter of its own).

    Registers :class:`QueryAndGateRows` on q_proj's ``weight`` and ``bias``: q_proj then computes with
    the merged rows as before (same values, same layout), while its query rows and its gate rows are
    two Parameters (``q_proj.parametrizations.weight.original0`` and ``original1``).
    :func:`merge_gate_rows` undoes it. A model without a gate is left as it is; a model whose gate rows
    are already apart returns them again.

    >>> from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM
    >>> config = Qwen3GatedConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, gate_type="headwise")
    >>> model = Qwen3GatedForCausalLM(config)
    >>> ids = torch.tensor([[1, 2, 3]])
    >>> before = model(ids).logits
    >>> gate_rows = separate_gate_rows(model)  # per layer: one gate row per head, of hidden_size inputs
    >>> [tuple(p.shape) for p in gate_rows], torch.equal(model(ids).logits, before)
    ([(4, 32), (4, 32)], True)
    >>> merge_gate_rows(model)
    >>> [name for name, _ in model.model.layers[0].self_attn.q_proj.named_parameters()]
    ['weight']
    """
    from torch.nn.utils import parametrize

    gate_rows = []
    for q_proj, rows in _gated_q_projs(model):
        for name in ("weight", "bias"):
            if getattr(q_proj, name) is None:
                continue
            if not (parametrize.is_parametrized(q_proj, name)):
                parametrize.register_parametrization(q_proj, name, rows)
            gate_rows.append(q_proj.parametrizations[name].original1)
    # A gate outside q_proj (docs/design-space.md) has its own projection, a Parameter already.
    gate_rows += [
        module.g_proj.weight
        for module in model.modules()
        if isinstance(getattr(module, "g_proj", None), torch.nn.Linear)
    ]
    return gate_rows


def merge_gate_rows(model) -> None:
    """Undo :func:`separate_gate_rows`: each q_proj holds one plain weight (and bias) again, as saved."""
    from torch.nn.utils import parametrize

    for module in model.modules():
        if parametrize.is_parametrized(module):
            for name in list(module.parametrizations):
                parametrize.remove_parametrizations(module, name, leave_parametrized=True)


TRAINABLE = ("all", "gate")


def gate_parameter_groups(
    model, lr: float, gate_lr_scale: float = 1.0, weight_decay: float = 0.0, trainable: str = "all"
) -> list[dict]:
    """Parameter groups for any ``torch.optim`` optimizer, with the gate rows of q_proj as their own parameter.

    Matrices get ``weight_decay``, vectors (norms, biases) none. With ``trainable="gate"`` only the gate
    rows of q_proj (weight and bias) are in the groups and every other parameter is frozen
    (``requires_grad=False``), the rest of q_proj included; with a ``gate_lr_scale`` other than 1 the
    gate rows form groups of their own at ``lr * gate_lr_scale``. Either way :func:`separate_gate_rows`
    first gives the gate rows a Parameter of their own (the model's outputs do not change): an
    optimizer, weight decay included, then never touches what it does not hold, so every frozen value
    stays bit for bit as it was (zeroing gradients would not: AdamW's decoupled decay and its momentum
    move a parameter whose gradient is zero). Each group carries its ``lr`` and its ``lr_scale``; a
    learning-rate scheduler (``LambdaLR`` and all of transformers' schedules) multiplies each group's
    own rate. Call it before the model is wrapped (DDP, FSDP) and before a checkpoint is loaded into it.

    >>> from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM
    >>> model = Qwen3GatedForCausalLM(Qwen3GatedConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, gate_type="headwise",
    ...     qkv_bias=True))
    >>> groups = gate_parameter_groups(model, lr=1e-4, gate_lr_scale=10.0, weight_decay=0.1)
    >>> optimizer = torch.optim.AdamW(groups, betas=(0.9, 0.95))
    >>> [(group["lr"], group["weight_decay"]) for group in groups]  # the rest, its vectors, gate rows, gate biases
    [(0.0001, 0.1), (0.0001, 0.0), (0.001, 0.1), (0.001, 0.0)]
    """
    if trainable not in TRAINABLE:
        raise TrainingError(f"unknown trainable {trainable!r}; expected one of {', '.join(TRAINABLE)}")
    apart = trainable == "gate" or gate_lr_scale != 1.0
    gate_rows = separate_gate_rows(model) if apart else []
    if apart and not gate_rows:
        raise TrainingError("the model has no gate rows to train apart; convert it with a gate first")
    gate_ids = {id(p) for p in gate_rows}
    others = [p for p in model.parameters() if id(p) not in gate_ids]
    if trainable == "gate":
        for p in others:
            p.requires_grad_(False)
        others = []
    else:
        others = [p for p in others if p.requires_grad]
    groups = [
        {"params": [p for p in others if p.dim() >= 2], "weight_decay": weight_decay, "lr_scale": 1.0},
        {"params": [p for p in others if p.dim() < 2], "weight_decay": 0.0, "lr_scale": 1.0},
        {"params": [p for p in gate_rows if p.dim() >= 2], "weight_decay": weight_decay, "lr_scale": gate_lr_scale},
        {"params": [p for p in gate_rows if p.dim() < 2], "weight_decay": 0.0, "lr_scale": gate_lr_scale},
    ]
    groups = [group for group in groups if group["params"]]
    for group in groups:
        group["lr"] = lr * group["lr_scale"]
    return groups


def parameter_groups(model, args) -> list[dict]:
    """:func:`gate_parameter_groups` with the options of a :class:`~gated_qwen.tools.training.arguments.TrainRunArguments`.

    >>> from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM
    >>> from gated_qwen.tools.training.arguments import TrainRunArguments
    >>> model = Qwen3GatedForCausalLM(Qwen3GatedConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, gate_type="headwise",
    ...     qkv_bias=True))
    >>> args = TrainRunArguments(train_file="t", output_dir="o", max_steps=1, trainable="gate")
    >>> groups = parameter_groups(model, args)  # the gate rows of q_proj's weight and bias, nothing else
    >>> [(group["lr_scale"], len(group["params"])) for group in groups]
    [(1.0, 2), (1.0, 2)]
    >>> sum(p.requires_grad for p in model.parameters())
    4
    """
    return gate_parameter_groups(model, args.learning_rate, args.gate_lr_scale, args.weight_decay, args.trainable)


__all__ = ["QueryAndGateRows", "gate_parameter_groups", "merge_gate_rows", "parameter_groups", "separate_gate_rows"]
