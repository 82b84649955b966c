"""Export a gated checkpoint to transformers' stock Qwen3.5 architecture (``Qwen3_5ForCausalLM``).

transformers 5 ships a dense model with the same output gate: Qwen3.5's full-attention layer
computes ``o_proj(attention * sigmoid(gate))`` with an elementwise gate that q_proj yields beside the
queries. Configured with every layer ``full_attention``, a dense MLP and full (not partial) RoPE, it
computes what a Qwen3Gated model computes, up to float rounding, and every tool that reads Qwen3.5
(transformers without this package, and serving engines that implement Qwen3.5) can read the export.
What changes on the way, tensor by tensor (:func:`export_tensor`):

* q_proj: the released rows are split per kv group (:func:`gated_qwen.models.layout.split_query_and_gate`)
  and laid out per head as ``[query_h (D rows) | gate_h (D rows)]``, Qwen3.5's layout. A headwise
  gate becomes elementwise by repeating its one row D times: exact, since every channel of the head
  then gets the same logit, but q_proj grows from ``H*(D+1)`` to ``2*H*D`` rows (+6.8% parameters
  on the released 1.7B headwise arm).
* Norm weights (input, post-attention, q_norm, k_norm, final): Qwen3.5's RMSNorm multiplies by
  ``1 + w``, so each weight is stored as ``w - 1``. That is exact when ``0.5 <= w < 2**p`` (p the
  mantissa bits: 8 in bfloat16, 24 in float32); :class:`NormRounding` counts the weights that round.
* RoPE: Qwen3.5 applies multimodal RoPE, three position streams (time, height, width) that for text
  are all equal, so it is plain RoPE with full rotary dims (``partial_rotary_factor`` 1.0) as long as
  every frequency follows one of them. :func:`mrope_section` splits the ``D/2`` frequencies evenly
  (``[22, 21, 21]`` for D=128), which llama.cpp needs too, and ``mrope_interleaved`` says how they are
  laid out; rope theta and rope scaling are carried over.

Everything else (embeddings, k/v/o projections, MLP, lm_head) is copied unchanged. What Qwen3.5
cannot compute is refused with the reason: a model without QK-norm (Qwen3.5 always normalizes
queries and keys), attention biases (the engines' Qwen3.5 has no o_proj bias), sliding-window layers,
and gate "none" (a stock Qwen3, which serves as it is).

A gated Qwen3-MoE (:class:`~gated_qwen.models.qwen3_moe_gated.configuration_qwen3_moe_gated.Qwen3MoeGatedConfig`)
becomes transformers' Qwen3.5-MoE text model (``Qwen3_5MoeForCausalLM``, ``model_type "qwen3_5_moe_text"``), with
the attention and norms mapped as above. Its MoE is Qwen3-MoE's (a softmax router choosing the top k experts,
the same SwiGLU experts, stored one tensor per expert under the same names), plus a shared expert that
Qwen3-MoE lacks: the export gives it zero weights, so it adds exactly 0 (``sigmoid(gate) * 0``), at the
smallest size that shards like the experts (:func:`zero_shared_expert_size`). Router and experts are copied
unchanged. Qwen3.5-MoE cannot express two things, refused with the reason: dense layers among the sparse ones
(``mlp_only_layers``, ``decoder_sparse_step`` > 1: every Qwen3.5-MoE layer is sparse) and ``norm_topk_prob``
false (its router always renormalises the top-k weights).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.utils import logging

from ..checkpoint import CONFIG_NAME, check_weights_match_config
from ..errors import CheckpointError, GatedQwenError
from ..models.auto import causal_lm_class
from ..models.layout import gate_dim, split_query_and_gate
from ..models.qwen3_gated.configuration_qwen3_gated import Qwen3GatedConfig
from ..models.qwen3_moe_gated.configuration_qwen3_moe_gated import Qwen3MoeGatedConfig
from .experts import is_fused_experts, saved_shapes, split_fused_experts
from .pipeline import CheckpointTransform, TensorMapping, source_config_from_dict


logger = logging.get_logger(__name__)

TARGETS = ("qwen3_5",)
NORM_SUFFIXES = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight")
FINAL_NORM = "model.norm.weight"


# ----------------------------------------------------------------------------------------------
# The mapping, config and tensors (pure: no files)


def mrope_section(rotary_dim: int) -> list[int]:
    """Qwen3.5's ``mrope_section`` for plain text RoPE: the ``rotary_dim / 2`` frequencies split evenly in three.

    transformers computes the same RoPE with any split (its three position streams are equal for text).
    llama.cpp does not: its interleaved M-RoPE gives frequency i the stream ``s % 3`` of its sector
    ``s = i % sum(sections)`` only while ``s < 3 * sections[s % 3]``, and otherwise a fourth stream whose
    text position is 0, so that frequency is not rotated at all (unbalanced sections such as
    ``[24, 20, 20]`` for D=128 leave two frequencies so). Balanced sections that add up to every
    frequency rotate each one with the text position.

    >>> mrope_section(128), mrope_section(64), mrope_section(8)
    ([22, 21, 21], [11, 11, 10], [2, 1, 1])
    """
    frequencies = rotary_dim // 2
    return [frequencies // 3 + (1 if i < frequencies % 3 else 0) for i in range(3)]


def check_exportable(config: Qwen3GatedConfig, source: str = "the model") -> None:
    """Refuse, with the reason, a model that Qwen3.5 cannot compute exactly.

    >>> check_exportable(Qwen3GatedConfig(num_attention_heads=4, num_key_value_heads=2))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    gated_qwen.errors.CheckpointError: the model has no gate (gate type 'none'): it is a stock Qwen3, ...
    """
    if config.gate_type == "none":
        raise CheckpointError(
            f"{source} has no gate (gate type 'none'): it is a stock Qwen3, which every engine serves as it is "
            "(as model_type 'qwen3', Qwen3ForCausalLM); there is nothing to export"
        )
    if not config.is_released_gate:
        raise CheckpointError(
            f"{source} has a {config.gate_variant()}; Qwen3.5's gate is the released one (sigmoid, multiplying the "
            "SDPA output of each head), so no Qwen3.5 checkpoint computes this model; load it with gated_qwen's "
            "Qwen3GatedForCausalLM instead"
        )
    if not config.use_qk_norm:
        raise CheckpointError(
            f"{source} has no QK-norm (use_qk_norm false), and Qwen3.5 always normalizes queries and keys, so no "
            "Qwen3.5 checkpoint computes this model; load it with gated_qwen's Qwen3GatedForCausalLM instead"
        )
    if config.qkv_bias:
        raise CheckpointError(
            f"{source} has attention biases (qkv_bias true: on q/k/v_proj and o_proj); the serving engines' Qwen3.5 "
            "(vLLM, llama.cpp) has no o_proj bias, so an export would not compute this model there; load it with "
            "gated_qwen's Qwen3GatedForCausalLM instead"
        )
    moe = isinstance(config, Qwen3MoeGatedConfig)
    # Qwen3 says per layer type; Qwen3-MoE applies its window (None unless use_sliding_window) to every layer.
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()) or (
        moe and config.sliding_window
    ):
        raise CheckpointError(
            f"{source} has sliding-window layers (use_sliding_window), which Qwen3.5 does not have; "
            "load it with gated_qwen's Qwen3GatedForCausalLM instead"
        )
    rope = config.rope_parameters or {}
    if "rope_type" not in rope or "rope_theta" not in rope:
        raise CheckpointError(
            f"{source} has per-layer-type RoPE parameters ({sorted(rope)}), which Qwen3.5's one rotary embedding "
            "cannot express"
        )
    if moe:
        check_moe_exportable(config, source)


def check_moe_exportable(config: Qwen3MoeGatedConfig, source: str = "the model") -> None:
    """Refuse, with the reason, the mixture-of-experts layouts that Qwen3.5-MoE cannot express.

    >>> check_moe_exportable(Qwen3MoeGatedConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    ...                                          num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    gated_qwen.errors.CheckpointError: the model has dense layers among the sparse ones (layer 1: mlp_only_layers [1], ...
    """
    dense = [layer for layer in range(config.num_hidden_layers) if layer not in config.sparse_layers()]
    if dense:
        shown = ", ".join(map(str, dense[:8])) + (" ..." if len(dense) > 8 else "")
        raise CheckpointError(
            f"{source} has dense layers among the sparse ones (layer{'s' * (len(dense) > 1)} {shown}: mlp_only_layers "
            f"{config.mlp_only_layers}, decoder_sparse_step {config.decoder_sparse_step}), and every Qwen3.5-MoE layer "
            "has routed experts, so no Qwen3.5-MoE checkpoint computes this model; load it with gated_qwen's "
            "Qwen3MoeGatedForCausalLM instead"
        )
    if not config.norm_topk_prob:
        raise CheckpointError(
            f"{source} has norm_topk_prob false (the top-k routing weights are not renormalised to sum to 1), and "
            "Qwen3.5-MoE's router always renormalises them, so no Qwen3.5-MoE checkpoint computes this model; load it "
            "with gated_qwen's Qwen3MoeGatedForCausalLM instead"
        )


def zero_shared_expert_size(moe_intermediate_size: int) -> int:
    """The width of the export's zero shared expert: small (at most 64), and dividing the experts' width, so that
    any tensor-parallel size that shards the experts evenly and is a power of two shards it evenly too.

    >>> zero_shared_expert_size(768), zero_shared_expert_size(16), zero_shared_expert_size(1536)
    (64, 16, 64)
    """
    return math.gcd(moe_intermediate_size, 64)


def qwen3_5_config(config_dict: dict, source: str = "the model", dtype: torch.dtype | None = None) -> dict:
    """The Qwen3.5 ``config.json`` dict that computes what the gated ``config_dict`` computes.

    ``config_dict`` is a gated checkpoint's config.json (a released arm, or one saved by gated-qwen).
    The result has ``model_type "qwen3_5_text"`` (``"qwen3_5_moe_text"`` for a gated Qwen3-MoE, with its experts
    and a zero shared expert), every layer ``full_attention`` (also as
    ``full_attention_interval: 1``, the key some engines read instead), ``partial_rotary_factor`` 1.0,
    a balanced ``mrope_section`` and the source's rope theta and scaling. ``dtype`` overrides the
    recorded dtype. Refuses what Qwen3.5 cannot compute (:func:`check_exportable`).

    >>> cfg = qwen3_5_config({"model_type": "qwen3", "num_attention_heads": 16, "num_key_value_heads": 8,
    ...                       "head_dim": 128, "num_hidden_layers": 2, "headwise_attn_output_gate": True})
    >>> cfg["model_type"], cfg["layer_types"], cfg["rope_parameters"]["mrope_section"]
    ('qwen3_5_text', ['full_attention', 'full_attention'], [22, 21, 21])
    """
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    config = source_config_from_dict(config_dict, source)
    check_exportable(config, source)
    moe = isinstance(config, Qwen3MoeGatedConfig)
    head_dim = config.head_dim
    rope_parameters = {
        **config.rope_parameters,
        "partial_rotary_factor": 1.0,
        "mrope_section": mrope_section(head_dim),
        "mrope_interleaved": True,
    }
    recorded_dtype = dtype if dtype is not None else config.dtype
    if moe:
        config_class, architecture = Qwen3_5MoeTextConfig, "Qwen3_5MoeForCausalLM"
        mlp = {
            "moe_intermediate_size": config.moe_intermediate_size,
            "shared_expert_intermediate_size": zero_shared_expert_size(config.moe_intermediate_size),
            "num_experts": config.num_experts,
            "num_experts_per_tok": config.num_experts_per_tok,
            "output_router_logits": config.output_router_logits,
            "router_aux_loss_coef": config.router_aux_loss_coef,
        }
    else:
        config_class, architecture = Qwen3_5TextConfig, "Qwen3_5ForCausalLM"
        mlp = {"intermediate_size": config.intermediate_size}
    exported = config_class(
        **mlp,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=head_dim,
        hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.initializer_range,
        rms_norm_eps=config.rms_norm_eps,
        use_cache=config.use_cache,
        tie_word_embeddings=config.tie_word_embeddings,
        rope_parameters=rope_parameters,
        attention_bias=False,
        attention_dropout=config.attention_dropout,
        layer_types=["full_attention"] * config.num_hidden_layers,
        full_attention_interval=1,  # what some engines read instead of layer_types
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        architectures=[architecture],
        dtype=recorded_dtype,
    )
    # The linear_* keys this writes describe linear-attention layers the export does not have;
    # llama.cpp's converter reads them all the same.
    return exported.to_diff_dict()


def is_norm_weight(name: str) -> bool:
    """Whether ``name`` is an RMSNorm weight, which Qwen3.5 stores as ``w - 1``.

    >>> is_norm_weight("model.layers.3.self_attn.q_norm.weight"), is_norm_weight("model.norm.weight")
    (True, True)
    """
    return name == FINAL_NORM or name.endswith(NORM_SUFFIXES)


def export_tensor(name: str, tensor: torch.Tensor, config: Qwen3GatedConfig) -> list[tuple[str, torch.Tensor]]:
    """The Qwen3.5 tensors, as ``(name, tensor)`` pairs, that stand for one tensor of the gated checkpoint.

    q_proj is laid out per head as ``[query_h | gate_h]`` with a headwise gate row repeated D times;
    a norm weight ``w`` becomes ``w - 1`` (computed in float32, stored in ``tensor``'s dtype);
    a tied ``lm_head.weight`` is dropped (Qwen3.5 ties it to the embedding too); an MoE's router is kept and
    brings the zero shared expert (:func:`zero_shared_expert`), fused experts are split one tensor per expert;
    everything else is returned as it is (the same object). ``config`` is the source's Qwen3GatedConfig. Works on meta
    tensors, so a plan of the output's shapes costs nothing.

    >>> config = Qwen3GatedConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
    ...                           headwise_attn_output_gate=True)
    >>> [(n, tuple(t.shape)) for n, t in export_tensor("model.layers.0.self_attn.q_proj.weight", torch.zeros(10, 8), config)]
    [('model.layers.0.self_attn.q_proj.weight', (16, 8))]
    >>> export_tensor("model.norm.weight", torch.tensor([1.0, 0.75, 2.0]), config)[0][1].tolist()
    [0.0, -0.25, 1.0]
    """
    if name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
        head_dim = config.head_dim
        query, gate = split_query_and_gate(
            tensor, config.num_key_value_heads, head_dim, gate_dim(config.gate_type, head_dim), dim=0
        )  # (K, G, D, *inputs), (K, G, g, *inputs)
        gate = gate.expand(*query.shape)  # headwise: the one logit for each of the head's D channels
        return [(name, torch.cat([query, gate], dim=2).flatten(0, 2))]  # per head h = k*G + j: [query_h | gate_h]
    if is_norm_weight(name):
        return [(name, (tensor.float() - 1).to(tensor.dtype))]
    if name == "lm_head.weight" and config.tie_word_embeddings:
        return []
    if is_fused_experts(name):  # an MoE saved fused: written as save_pretrained writes experts
        return split_fused_experts(name, tensor)
    if name.endswith("mlp.gate.weight") and isinstance(config, Qwen3MoeGatedConfig):
        return [(name, tensor), *zero_shared_expert(name.removesuffix("gate.weight"), tensor, config)]
    return [(name, tensor)]


def zero_shared_expert(
    prefix: str, router: torch.Tensor, config: Qwen3MoeGatedConfig
) -> list[tuple[str, torch.Tensor]]:
    """Qwen3.5-MoE's shared expert and its gate for the layer whose MLP is ``prefix`` (``"model.layers.3.mlp."``),
    all zero: the expert's output is 0 and ``sigmoid(0) * 0`` adds exactly nothing. Made beside the router, in its
    dtype and on its device (meta in a plan).

    >>> config = Qwen3MoeGatedConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, num_experts=2,
    ...                              num_experts_per_tok=1, moe_intermediate_size=4)
    >>> [(n, tuple(t.shape)) for n, t in zero_shared_expert("mlp.", torch.zeros(2, 8), config)][-1]
    ('mlp.shared_expert_gate.weight', (1, 8))
    """
    hidden, width = config.hidden_size, zero_shared_expert_size(config.moe_intermediate_size)
    shapes = {
        "shared_expert.gate_proj.weight": (width, hidden),
        "shared_expert.up_proj.weight": (width, hidden),
        "shared_expert.down_proj.weight": (hidden, width),
        "shared_expert_gate.weight": (1, hidden),
    }
    return [(prefix + name, router.new_zeros(shape)) for name, shape in shapes.items()]


@dataclass
class NormRounding:
    """How many norm weights ``w`` Qwen3.5 does not get back exactly as ``1 + (w - 1)`` in the stored dtype."""

    rounded: int = 0
    total: int = 0
    worst_relative_error: float = 0.0
    worst_name: str | None = None

    def add(self, name: str, weight: torch.Tensor, exported: torch.Tensor) -> None:
        """Count ``weight``'s elements against their export; ``1 + w`` is what Qwen3.5's forward computes (in float32)."""
        restored, original = 1.0 + exported.float(), weight.float()
        error = ((restored - original).abs() / original.abs().clamp_min(torch.finfo(torch.float32).tiny)).flatten()
        self.total += error.numel()
        self.rounded += int((restored != original).sum())
        worst = float(error.max()) if error.numel() else 0.0
        if worst > self.worst_relative_error:
            self.worst_relative_error, self.worst_name = worst, name

    def message(self, source: str, dtype) -> str:
        return (
            f"warning: {source}: {self.rounded} of {self.total} norm weights round when stored as w - 1 in {dtype} "
            f"(worst relative error {self.worst_relative_error:.3g}, in {self.worst_name}); weights under 0.5 "
            "lose low bits, so the export computes a slightly different model"
        )


# ----------------------------------------------------------------------------------------------
# On disk


@dataclass
class ExportResult:
    """What :func:`export_checkpoint` wrote."""

    path: Path
    files: list[str]
    total_size: int  # bytes of tensor data written
    source_parameters: int
    exported_parameters: int
    norm_rounding: NormRounding
    max_difference: float | None = None  # largest |logit difference| from verify, else None
    to: str = "qwen3_5"

    @property
    def parameter_growth(self) -> float:
        """Exported parameters over source parameters, minus 1 (0.068 on the released headwise arm)."""
        return self.exported_parameters / self.source_parameters - 1


def export_checkpoint(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    to: str = "qwen3_5",
    dtype: str = "auto",
    max_shard_size: int | str = "5GB",
    overwrite: bool = False,
    revision: str | None = None,
    subfolder: str = "",
    verify: bool = False,
    progress: bool = True,
) -> ExportResult:
    """Write the gated checkpoint ``src`` into ``dst`` as a stock transformers Qwen3.5 (``Qwen3_5ForCausalLM``), or
    Qwen3.5-MoE (``Qwen3_5MoeForCausalLM``) for a gated Qwen3-MoE.

    ``src`` is a gated checkpoint folder or hub id (a released arm, or one saved by gated-qwen); from the
    hub only config, weights, tokenizer and generation config are downloaded, never code. Tensors
    are read, mapped (:func:`export_tensor`) and written one at a time into sharded safetensors (at
    most ``max_shard_size`` each); tensors that need no change are copied byte for byte. ``dtype``
    casts floating tensors first ("auto" keeps them). Tokenizer files and generation_config.json
    are copied; config.json is :func:`qwen3_5_config`'s. Norm weights that round when stored as
    ``w - 1`` are counted in ``result.norm_rounding`` and logged as a warning. ``verify`` loads the
    source (its gated class) and the export (transformers' Qwen3.5 or Qwen3.5-MoE) in float32 on CPU
    and records their largest logit difference on a short probe.

    ``src`` is only read. ``dst`` is written through :class:`gated_qwen.checkpoint.outputs.OutputFolder`: whole or
    not at all, a link followed, an existing non-empty ``dst`` refused unless ``overwrite``.

    >>> import tempfile
    >>> from gated_qwen.default_models import default_model_path
    >>> folder = tempfile.TemporaryDirectory()
    >>> result = export_checkpoint(default_model_path("headwise"), Path(folder.name) / "headwise-qwen3_5",
    ...                            to="qwen3_5", progress=False)
    >>> result.files, result.exported_parameters > result.source_parameters  # Qwen3.5 adds its own gate parameters
    (['model.safetensors'], True)
    >>> json.loads((result.path / "config.json").read_text())["model_type"]
    'qwen3_5_text'
    >>> folder.cleanup()
    """
    if to not in TARGETS:
        raise GatedQwenError(f"unknown export target {to!r}; choose one of {', '.join(TARGETS)}")
    export = Export(verify)
    written = export.run(
        src,
        dst,
        dtype=dtype,
        max_shard_size=max_shard_size,
        overwrite=overwrite,
        revision=revision,
        subfolder=subfolder,
        progress=progress,
    )
    rounding = export.rounding
    if rounding.rounded:
        logger.warning(rounding.message(written.header.source, export.exported_config["dtype"]))
    tied = export.source_config.tie_word_embeddings
    return ExportResult(
        path=written.path,
        files=written.files,
        total_size=written.plan.total_size,
        source_parameters=sum(
            info.numel for name, info in written.header.tensors.items() if not (name == "lm_head.weight" and tied)
        ),
        exported_parameters=sum(info.numel for info in written.plan.specs.values()),
        norm_rounding=rounding,
        max_difference=written.max_difference,
        to=to,
    )


class Export(CheckpointTransform):
    """:func:`export_checkpoint`'s steps: the Qwen3.5 config from config.json (:meth:`check_config`), the mapping
    from the header (:meth:`build`), and the norm weights that round counted as they are written (:meth:`observe`)."""

    output_name = "export"
    description = "exporting"

    def __init__(self, verify: bool = False):
        self.verifies = verify
        self.rounding = NormRounding()
        # set by check_config: the exported config.json dict and the source's gated config
        self.exported_config: dict | None = None
        self.source_config: Qwen3GatedConfig | Qwen3MoeGatedConfig | None = None

    def check_config(self, config_dict: dict, source: str, target_dtype) -> None:  # before any weight is fetched
        self.exported_config = qwen3_5_config(config_dict, source, target_dtype)
        architecture = (config_dict.get("architectures") or ["Qwen3ForCausalLM"])[0]
        if not architecture.endswith("ForCausalLM"):
            raise CheckpointError(
                f"{source} is a {architecture}; only causal language models (...ForCausalLM) can be exported"
            )
        self.source_config = source_config_from_dict(config_dict, source)

    def build(self, header, target_dtype) -> TensorMapping:
        check_weights_match_config(self.source_config, header.tensors, header.source)
        target = qwen3_5_skeleton(self.exported_config)
        not_saved = {"lm_head.weight"} if self.exported_config["tie_word_embeddings"] else set()
        return TensorMapping(
            map_tensor=self.map_tensor,
            target_shapes=saved_shapes(target, skip=not_saved),  # experts one tensor per expert, as saved
            not_saved=not_saved,
            write_config=self.write_config,
            observe=self.observe,
            advice="check num_hidden_layers, tie_word_embeddings and the gate keys against the weights",
        )

    def map_tensor(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        return export_tensor(name, tensor, self.source_config)

    def write_config(self, folder: Path) -> None:
        (folder / CONFIG_NAME).write_text(json.dumps(self.exported_config, indent=2, sort_keys=True) + "\n")

    def observe(self, source_name: str, tensor: torch.Tensor, name: str, out: torch.Tensor) -> None:
        if is_norm_weight(source_name):
            self.rounding.add(source_name, tensor, out)

    def verify(self, source: Path, exported: Path) -> float:
        return max_logit_difference(source, exported)


def max_logit_difference(source: str | os.PathLike, exported: str | os.PathLike) -> float:
    """Largest |logit difference| between a gated checkpoint and its Qwen3.5 export, both float32 on CPU.

    >>> import tempfile
    >>> from gated_qwen.default_models import default_model_path
    >>> folder = tempfile.TemporaryDirectory()
    >>> exported = export_checkpoint(default_model_path("headwise"), Path(folder.name) / "export", progress=False).path
    >>> max_logit_difference(default_model_path("headwise"), exported) < 1e-4  # the same model, up to rounding
    True
    >>> folder.cleanup()
    """
    from transformers import AutoModelForCausalLM

    source_class, _ = model_classes(json.loads((Path(source) / CONFIG_NAME).read_text()))
    models = [
        model_class.from_pretrained(folder, dtype=torch.float32, device_map="cpu")
        for model_class, folder in ((source_class, source), (AutoModelForCausalLM, exported))
    ]
    probe = torch.randint(models[0].config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        source_logits, exported_logits = (model(probe).logits for model in models)
    return (source_logits - exported_logits).abs().max().item()


def parameter_counts(config_dict: dict) -> tuple[int, int]:
    """Parameters of a gated model and of its Qwen3.5 export, from its config alone (built on the meta device).

    >>> parameter_counts({"model_type": "qwen3", "vocab_size": 152064, "hidden_size": 2048, "intermediate_size": 6144,
    ...                   "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    ...                   "tie_word_embeddings": True, "headwise_attn_output_gate": True})
    (1721754624, 1838277632)
    """
    gated_class, source_config = model_classes(config_dict)
    with torch.device("meta"):
        gated = gated_class(source_config)
    return gated.num_parameters(), qwen3_5_skeleton(qwen3_5_config(config_dict)).num_parameters()


def model_classes(config_dict: dict):
    """The gated causal-LM class for a gated checkpoint's config.json dict (:func:`gated_qwen.models.auto.causal_lm_class`
    decides), and its config object."""
    return causal_lm_class(config_dict), source_config_from_dict(config_dict)


def qwen3_5_skeleton(exported_config: dict):
    """transformers' Qwen3.5 (or Qwen3.5-MoE) causal LM for an exported config dict, on the meta device."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    moe = exported_config.get("model_type") == Qwen3_5MoeTextConfig.model_type
    model_class, config_class = (
        (Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig) if moe else (Qwen3_5ForCausalLM, Qwen3_5TextConfig)
    )
    with torch.device("meta"):
        return model_class(config_class.from_dict(exported_config))


__all__ = [
    "Export",
    "ExportResult",
    "NormRounding",
    "check_exportable",
    "check_moe_exportable",
    "export_checkpoint",
    "export_tensor",
    "max_logit_difference",
    "mrope_section",
    "parameter_counts",
    "qwen3_5_config",
    "zero_shared_expert",
    "zero_shared_expert_size",
]
