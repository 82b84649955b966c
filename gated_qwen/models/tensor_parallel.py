"""Tensor parallelism for the gated q_proj: which transformers styles shard it right, and the unit styles' fix.

The gated q_proj's rows are grouped by kv head (:mod:`gated_qwen.models.layout`)::

    for each kv head k:  [ queries of its G heads (G*D rows) | gate logits of its G heads (G*g rows) ]

so a shard is right only if it holds whole kv groups, each with its gate rows, and the same kv groups as
k_proj's shard on that rank (the attention reads the local kv head count off k_proj). How transformers'
styles do on it:

- ``colwise`` (Qwen3's plan): contiguous rows, ``ceil(rows / tp)`` per rank. Whole kv groups exactly when the
  TP size divides ``num_key_value_heads``; otherwise it cuts a group, and the plan is refused.
- ``unit_colwise`` / ``unit_rowwise`` (transformers 5.25): each rank holds whole "units", replicated when there
  are fewer units than ranks; transformers counts the units of a projection as ``rows // head_dim``, which for
  the gated q_proj counts gate rows as extra heads and cuts through a kv group. For this model they are
  replaced by :class:`GatedUnitColwise` / :class:`GatedUnitRowwise`, which count the units of q_proj and
  o_proj by kv group, the same units (and so the same 2-D mesh) as k_proj and v_proj.
- an output gathered on every rank (``colwise_rep``, ``colwise_gather_output``, ``replicate``, or no rule):
  right when k_proj's output is whole too.

Any other style for q_proj, or a q_proj and k_proj that disagree, raises :class:`ValueError` when the plan is
applied (``from_pretrained(..., distributed_config=...)``), naming the rule to change.
"""

from __future__ import annotations

import re


__all__ = ["GATED_UNIT_STYLES", "GatedQProjTensorParallelMixin", "check_and_adapt_tp_plan"]

# transformers' style -> this model's replacement for q_proj / o_proj (registered in ALL_PARALLEL_STYLES under these names)
GATED_UNIT_STYLES = {"unit_colwise": "qwen3_gated_unit_colwise", "unit_rowwise": "qwen3_gated_unit_rowwise"}
# Styles whose output is the whole projection on every rank (no rule at all reads as None).
_WHOLE_OUTPUT = {None, "replicate", "colwise_rep", "colwise_gather_output"}
_PROJECTION = re.compile(r"(?P<attention>.*self_attn)\.(?P<projection>[qkvo]_proj)(?:\.(?:weight|bias))?")


def _attention_styles(plan: dict[str, str]) -> dict[str, dict[str, str | None]]:
    """``{attention module pattern: {"q_proj": style, "k_proj": ..., "v_proj": ..., "o_proj": ...}}`` of a plan."""
    found: dict[str, dict[str, str | None]] = {}
    for key, style in plan.items():
        match = _PROJECTION.fullmatch(key)
        if match:
            styles = found.setdefault(match["attention"], dict.fromkeys(("q_proj", "k_proj", "v_proj", "o_proj")))
            styles[match["projection"]] = style
    return found


def check_and_adapt_tp_plan(plan: dict[str, str], num_key_value_heads: int, tp_size: int) -> dict[str, str]:
    """Check that ``plan`` shards every gated q_proj by whole kv groups; return the rules to change for that.

    The returned rules replace transformers' unit styles on q_proj and o_proj by the ones counting kv groups
    (:data:`GATED_UNIT_STYLES`); an empty dict when nothing needs to change. Raises :class:`ValueError` naming
    the rule when no style does it right.

    >>> plan = {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise"}
    >>> check_and_adapt_tp_plan(plan, num_key_value_heads=4, tp_size=2)
    {}
    >>> check_and_adapt_tp_plan(plan, num_key_value_heads=1, tp_size=2)
    Traceback (most recent call last):
    ...
    ValueError: tensor parallelism of Qwen3Gated: `layers.*.self_attn.q_proj: colwise` would cut a kv group's query and gate rows apart (1 kv heads over 2 ranks); use `unit_colwise` on q_proj, k_proj, v_proj and `unit_rowwise` on o_proj (transformers >= 5.25), or a TP size that divides 1
    """
    changes: dict[str, str] = {}
    for attention, styles in _attention_styles(plan).items():
        q_style, k_style = styles["q_proj"], styles["k_proj"]
        where = f"`{attention}.q_proj: {q_style}`"
        if q_style == "colwise":
            if num_key_value_heads % tp_size:
                raise ValueError(
                    f"tensor parallelism of Qwen3Gated: {where} would cut a kv group's query and gate rows apart "
                    f"({num_key_value_heads} kv heads over {tp_size} ranks); use `unit_colwise` on q_proj, k_proj, "
                    f"v_proj and `unit_rowwise` on o_proj (transformers >= 5.25), or a TP size that divides "
                    f"{num_key_value_heads}"
                )
            if k_style != "colwise":
                raise ValueError(
                    f"tensor parallelism of Qwen3Gated: {where} needs k_proj sharded the same way (it is "
                    f"`{k_style}`): each rank's q_proj rows are those of its own kv heads; make k_proj `colwise` too"
                )
        elif q_style == "unit_colwise":
            if k_style != "unit_colwise" or styles["v_proj"] != "unit_colwise" or styles["o_proj"] != "unit_rowwise":
                raise ValueError(
                    f"tensor parallelism of Qwen3Gated: {where} needs `unit_colwise` on k_proj and v_proj and "
                    f"`unit_rowwise` on o_proj (they are {k_style}, {styles['v_proj']}, {styles['o_proj']}): "
                    "the four share one split of the kv groups"
                )
            for key, style in plan.items():
                match = _PROJECTION.fullmatch(key)
                if match and match["attention"] == attention and match["projection"] in ("q_proj", "o_proj"):
                    changes[key] = GATED_UNIT_STYLES[style]
        elif q_style in _WHOLE_OUTPUT:
            if k_style not in _WHOLE_OUTPUT:
                raise ValueError(
                    f"tensor parallelism of Qwen3Gated: `{attention}.q_proj` keeps all its rows on every rank but "
                    f"k_proj is `{k_style}`: the gate rows would be read against a share of the kv heads; shard "
                    "q_proj like k_proj (`colwise`, or `unit_colwise` on all four projections)"
                )
        else:
            raise ValueError(
                f"tensor parallelism of Qwen3Gated: {where} is not supported: q_proj carries gate rows after each "
                "kv group's queries, which that style does not keep together; use `colwise` or `unit_colwise`"
            )
    return changes


def register_gated_unit_styles() -> bool:
    """Register :data:`GATED_UNIT_STYLES` in transformers' parallel styles, where transformers has unit styles.

    False on transformers before 5.25 (no ``UnitColwiseParallel``): nothing is registered, and a plan naming
    ``unit_colwise`` is refused there by transformers itself.
    """
    from transformers.distributed import tensor_parallel

    if not hasattr(tensor_parallel, "UnitColwiseParallel"):
        return False
    if GATED_UNIT_STYLES["unit_colwise"] in tensor_parallel.ALL_PARALLEL_STYLES:
        return True
    from torch.distributed.tensor import Replicate, Shard

    class _KvGroupUnits:
        """transformers' mesh manager, asked for the unit mesh of this many kv groups whatever the style counted."""

        def __init__(self, mesh_manager, num_key_value_heads: int):
            self._mesh_manager = mesh_manager
            self._num_key_value_heads = num_key_value_heads

        def get_unit_mesh(self, _unit_number: int):
            return self._mesh_manager.get_unit_mesh(self._num_key_value_heads)

    class GatedUnitColwise(tensor_parallel.UnitColwiseParallel):
        """``unit_colwise`` for the gated q_proj: units are kv groups (queries and gate rows), as k_proj's."""

        def shard_param(self, module, param, mesh, *, config=None, mesh_manager=None):
            units = _KvGroupUnits(mesh_manager, config.num_key_value_heads)
            super().shard_param(module, param, mesh, config=config, mesh_manager=units)

    class GatedUnitRowwise(tensor_parallel.UnitRowwiseParallel):
        """``unit_rowwise`` for o_proj behind the gated q_proj: the same kv-group units, so its inputs match."""

        def shard_param(self, module, param, mesh, *, config=None, mesh_manager=None):
            units = _KvGroupUnits(mesh_manager, config.num_key_value_heads)
            super().shard_param(module, param, mesh, config=config, mesh_manager=units)

    tensor_parallel.ALL_PARALLEL_STYLES.register(
        GATED_UNIT_STYLES["unit_colwise"], GatedUnitColwise(input_layouts=Replicate(), output_layouts=Shard(-1))
    )
    tensor_parallel.ALL_PARALLEL_STYLES.register(
        GATED_UNIT_STYLES["unit_rowwise"], GatedUnitRowwise(input_layouts=Shard(-1), output_layouts=Replicate())
    )
    return True


def adapt_distributed_config(model, distributed_config):
    """The ``distributed_config`` to shard ``model`` (a Qwen3Gated) with: checked, unit styles replaced.

    Called by the model's ``maybe_distribute_model`` before transformers resolves and applies the plan. The
    effective plan is the model's ``tp_plan`` with ``distributed_config.tp_plan``'s rules on top, as transformers
    merges them; the replacements are added to those rules (a copy of the config; the caller's is not changed).
    """
    import copy

    if distributed_config is None or (distributed_config.tp_size or 1) <= 1:
        return distributed_config
    override = distributed_config.tp_plan
    if override == {}:  # an explicit "no TP rules"
        return distributed_config
    config = model.config
    if config.gate_type != "none" and not config.gate_in_q_proj:
        raise ValueError(
            f"tensor parallelism shards the released gate layout only (gate rows in q_proj); this model has a "
            f"{config.gate_variant()} with a projection or scores of its own (g_proj, gate_logits), which have no sharding plan: load it "
            "without tp_plan/distributed_config"
        )
    plan = dict(model.tp_plan) | (override if isinstance(override, dict) else {})
    changes = check_and_adapt_tp_plan(plan, model.config.num_key_value_heads, distributed_config.tp_size)
    if not changes or not register_gated_unit_styles():  # (before 5.25 transformers refuses the unit styles itself)
        return distributed_config
    adapted = copy.copy(distributed_config)
    adapted.tp_plan = (override if isinstance(override, dict) else {}) | changes
    return adapted


class GatedQProjTensorParallelMixin:
    """For the PreTrainedModel classes of models with the gated attention (dense and MoE), before transformers' base.

    q_proj's gate rows must stay with their kv group on each rank: the plan is checked, and transformers' unit
    styles (which count gate rows as heads) are swapped for ones counting kv groups, before transformers applies it.
    ``maybe_distribute_model`` is the classmethod of transformers' ``DistributedMixin`` that ``from_pretrained``
    calls to shard a model (transformers 5.19 - 5.25, docs/compatibility.md).
    """

    @classmethod
    def maybe_distribute_model(cls, model, distributed_config, mesh_manager):
        if mesh_manager is not None:
            distributed_config = adapt_distributed_config(model, distributed_config)
        return super().maybe_distribute_model(model, distributed_config, mesh_manager)
