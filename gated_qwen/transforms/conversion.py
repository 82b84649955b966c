"""Turn stock Qwen3 models and checkpoints into Qwen3Gated ones.

Two forms of one conversion: :func:`convert_qwen3_to_gated` patches a loaded model in memory,
:func:`convert_checkpoint` streams a checkpoint folder (or hub id) into a new folder, tensor by
tensor, so that memory stays near the largest tensor rather than the model.

Only two tensors per layer change. q_proj grows by the gate rows, placed in the released layout
(:func:`gated_qwen.models.layout.merge_query_and_gate`), and with the default ``init="identity"`` o_proj's
weight is doubled:

* the gate rows (weight and bias) are zero, so every gate is ``sigmoid(0) = 0.5`` exactly;
* the attention output is multiplied by 0.5 and o_proj's weight by 2. Both are powers of two: in
  binary floating point they change only the exponent, never the mantissa, so each product
  ``(0.5 * a) * (2 * w)`` equals ``a * w`` bit for bit and the sums that follow are the same sums.

Hence the converted model computes exactly what the source did, in float32 and bfloat16 alike
(the exception would be a value under the smallest normal number, about 1e-38 in both, or 6e-5
in float16, where halving can round). o_proj's bias is added after the product and stays as it
is. ``init="random"`` instead draws the gate rows like the model's own initializer
(normal, std ``initializer_range``; zero bias) and leaves o_proj untouched: the model then starts
with non-trivial gates and no longer matches its source.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import (
    Qwen3ForCausalLM,
    Qwen3ForSequenceClassification,
    Qwen3Model,
    Qwen3MoeForCausalLM,
    Qwen3MoeForSequenceClassification,
    Qwen3MoeModel,
)
from transformers.utils import logging

from ..checkpoint import check_weights_match_config
from ..errors import CheckpointError, GatedQwenError
from ..models.auto import gated_model_class
from ..models.layout import gate_dim, gate_heads_and_width, merge_query_and_gate, split_query_and_gate
from ..models.qwen3_gated.configuration_qwen3_gated import Qwen3GatedConfig
from ..models.qwen3_gated.modeling_qwen3_gated import (
    Qwen3GatedForCausalLM,
    Qwen3GatedForSequenceClassification,
    Qwen3GatedModel,
    Qwen3GatedPreTrainedModel,
)
from ..models.qwen3_moe_gated.configuration_qwen3_moe_gated import Qwen3MoeGatedConfig
from ..models.qwen3_moe_gated.modeling_qwen3_moe_gated import (
    Qwen3MoeGatedForCausalLM,
    Qwen3MoeGatedForSequenceClassification,
    Qwen3MoeGatedModel,
)
from ..utils.names import CHECKPOINT_CONVERSION_GATES, CONVERSION_GATES, CONVERSION_INITS
from .experts import is_fused_experts, saved_shapes, split_fused_experts
from .pipeline import CheckpointTransform, TensorMapping, source_config_from_dict


logger = logging.get_logger(__name__)

# the names live in gated_qwen.utils.names (torch-free, for the command line); convert_checkpoint also takes
# "keep": the source's own gate, re-saved as a clean gated-qwen checkpoint
GATES, CHECKPOINT_GATES, INITS = CONVERSION_GATES, CHECKPOINT_CONVERSION_GATES, CONVERSION_INITS

# stock class -> its gated counterpart; the Qwen3Gated classes subclass these, so order matters
# only in that each model matches exactly one entry.
GATED_CLASSES = {
    Qwen3ForCausalLM: Qwen3GatedForCausalLM,
    Qwen3ForSequenceClassification: Qwen3GatedForSequenceClassification,
    Qwen3Model: Qwen3GatedModel,
    # Qwen3-MoE: the same attention, so the same conversion; router and experts are handed over unchanged.
    Qwen3MoeForCausalLM: Qwen3MoeGatedForCausalLM,
    Qwen3MoeForSequenceClassification: Qwen3MoeGatedForSequenceClassification,
    Qwen3MoeModel: Qwen3MoeGatedModel,
}


def _check_choice(value: str, choices, what: str) -> None:
    if value not in choices:
        raise GatedQwenError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")


def gated_config_from_dict(
    config_dict: dict, gate: str, source: str = "the model", **variant
) -> Qwen3GatedConfig | Qwen3MoeGatedConfig:
    """The gated config of the gated variant of a Qwen3 or Qwen3-MoE config (a config.json's dict):
    a Qwen3GatedConfig, or a Qwen3MoeGatedConfig for a Qwen3-MoE.

    Refuses a config that is neither and one that already has a gate. ``variant``: the keys of the design space
    beside ``gate`` (``gate_position``, ``gate_shared_across_heads``, ``gate_activation``, ``gate_combination``).

    >>> config = gated_config_from_dict({"model_type": "qwen3", "num_attention_heads": 4, "num_key_value_heads": 2}, "headwise")
    >>> config.gate_type, config.model_type
    ('headwise', 'qwen3_gated')
    """
    _check_choice(gate, GATES, "gate")
    source_config = source_config_from_dict(config_dict, source)
    if source_config.gate_type != "none":
        raise CheckpointError(
            f"{source} is already gated ({source_config.gate_type}); there is nothing to convert. "
            "Load it with Qwen3GatedForCausalLM.from_pretrained"
        )
    values = {**source_config.to_dict(), "gate_type": gate, **variant}
    for flag in ("headwise_attn_output_gate", "elementwise_attn_output_gate"):
        values.pop(flag)
    try:
        return type(source_config).from_dict(values)
    except ValueError as error:  # a gate without meaning (headwise at dense_output, ...): one line
        raise GatedQwenError(str(error)) from error


# Where the gate halves a tensor at init "identity" (sigmoid(0) = 0.5), the tensors that are doubled to undo it:
# the first that the model has (QK-norm's weight scales the normalised keys and queries; without it, the projection).
DOUBLED_FOR_IDENTITY = {
    "sdpa_output": ("self_attn.o_proj.weight",),
    "value": ("self_attn.v_proj.weight", "self_attn.v_proj.bias"),
    "key": ("self_attn.k_norm.weight",),
    "query": ("self_attn.q_norm.weight",),
    "dense_output": ("self_attn.o_proj.weight", "self_attn.o_proj.bias"),
}
WITHOUT_QK_NORM = {
    "key": ("self_attn.k_proj.weight", "self_attn.k_proj.bias"),
    "query": ("self_attn.q_proj.weight", "self_attn.q_proj.bias"),
}


# Each activation's gate score at zero logits: what a zero-initialised gate multiplies by or adds.
GATE_AT_ZERO = {"sigmoid": 0.5, "silu": 0.0, "identity": 0.0, "ns_sigmoid": 0.75}


def check_identity_init(config, init: str) -> None:
    """Refuse ``init="identity"`` for a model that no zero-initialised gate makes compute what its source did.

    A sigmoid gate at zero logits is 0.5 (from ``g_proj``, q_proj's rows or input-independent scores alike):
    multiplying, the tensor it halves is doubled, exactly; a SiLU or identity gate at zero is 0: adding, nothing
    changes. A multiplying SiLU or identity gate (0 times the tensor), an adding sigmoid gate (plus 0.5) and an
    NS-sigmoid gate (0.75: undoing it multiplies by 4/3, which rounds) have no exact form; nor has an SDPA-output
    transform or a sandwich norm, which change the outputs whatever the new weights.

    >>> check_identity_init(Qwen3GatedConfig(gate_type="headwise", gate_activation="silu"), "identity")
    Traceback (most recent call last):
    ...
    gated_qwen.errors.GatedQwenError: --init identity has no exact form for a headwise silu multiplicative gate at sdpa_output, head-specific: at zero logits it multiplies by 0; use --init random
    """
    if init != "identity":
        return
    if config.attn_output_transform != "none" or config.sandwich_norm:
        what = "a sandwich norm" if config.sandwich_norm else f"{config.attn_output_transform} on the SDPA output"
        raise GatedQwenError(
            f"--init identity has no exact form for {what}: it changes the outputs whatever its weights; "
            "use --init random"
        )
    if config.gate_type == "none":
        return
    at_zero = GATE_AT_ZERO[config.gate_activation]
    if at_zero != {"multiplicative": 0.5, "additive": 0.0}[config.gate_combination]:
        what = f"multiplies by {at_zero:g}" if config.gate_combination == "multiplicative" else f"adds {at_zero:g}"
        if config.gate_combination == "multiplicative" and at_zero:
            what += f" (undoing it multiplies by {1 / at_zero:.4g}, which rounds)"
        raise GatedQwenError(
            f"--init identity has no exact form for a {config.gate_variant()}: at zero logits it {what}; "
            "use --init random"
        )


def _doubled_for_identity(name: str, config) -> bool:
    if config.gate_activation != "sigmoid" or config.gate_combination != "multiplicative":
        return False  # additive SiLU or identity: zero logits add nothing
    position = config.gate_position
    names = WITHOUT_QK_NORM[position] if position in WITHOUT_QK_NORM and not config.use_qk_norm else None
    return name.endswith(names or DOUBLED_FOR_IDENTITY[position])


def gate_projection(query_weight: torch.Tensor, config, init: str = "identity") -> torch.Tensor:
    """The weight of ``g_proj`` for a gate outside q_proj, ``(heads * width, hidden)``, or an input-independent
    gate's scores, ``(heads, width)``: zero (identity) or drawn like the model's initializer (random), on q_proj's
    device and in its dtype.

    >>> config = Qwen3GatedConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
    ...                           gate_type="elementwise", gate_position="value")
    >>> gate_projection(torch.ones(16, 16), config).shape                   # 2 kv heads x 4 channels
    torch.Size([8, 16])
    """
    heads, width = gate_heads_and_width(config)
    shape = (heads, width) if config.gate_input == "none" else (heads * width, query_weight.shape[-1])
    weight = query_weight.new_zeros(shape)
    return weight.normal_(mean=0.0, std=config.initializer_range) if init == "random" else weight


def new_layer_tensors(q_proj_name: str, query_weight: torch.Tensor, config, init: str = "identity"):
    """The tensors a layer of the gated model has and its source lacks, named after the layer's q_proj weight:
    a gate's own projection or scores (:func:`gate_projection`), and, at ``init="random"``, the RMSNorm weights
    (ones) of an SDPA-output norm and a sandwich norm. On q_proj's device and in its dtype.

    >>> config = Qwen3GatedConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
    ...                           gate_type="headwise", gate_input="none", sandwich_norm=True)
    >>> [name for name, _ in new_layer_tensors("layers.0.self_attn.q_proj.weight", torch.ones(16, 16), config, "random")]
    ['layers.0.self_attn.gate_logits', 'layers.0.attn_output_layernorm.weight', 'layers.0.mlp_output_layernorm.weight']
    """
    prefix = q_proj_name.removesuffix("self_attn.q_proj.weight")
    new = []
    if not config.gate_in_q_proj and config.gate_type != "none":
        own = "self_attn.gate_logits" if config.gate_input == "none" else "self_attn.g_proj.weight"
        new.append((prefix + own, gate_projection(query_weight, config, init)))
    if config.attn_output_transform == "rmsnorm":
        new.append((prefix + "self_attn.attn_output_transform.weight", query_weight.new_ones(config.head_dim)))
    if config.sandwich_norm:
        for norm in NEW_LAYER_NORMS:
            new.append((prefix + norm, query_weight.new_ones(config.hidden_size)))
    return new


NEW_LAYER_NORMS = ("attn_output_layernorm.weight", "mlp_output_layernorm.weight")  # sandwich_norm's
# Names (ends) of the tensors :func:`new_layer_tensors` adds: what a source may lack.
NEW_TENSOR_ENDS = (
    "self_attn.g_proj.weight",
    "self_attn.gate_logits",
    "self_attn.attn_output_transform.weight",
    *NEW_LAYER_NORMS,
)


def grow_q_proj(query: torch.Tensor, config: Qwen3GatedConfig, init: str = "identity") -> torch.Tensor:
    """A stock q_proj weight ``(H*D, hidden)`` or bias ``(H*D,)`` with the gate rows of ``config`` added.

    The result is a new tensor on ``query``'s device and in its dtype, laid out as released:
    per kv head, its G heads' queries, then their gate rows. Gate rows are zero for ``init="identity"``;
    for ``init="random"`` weight rows are drawn from N(0, initializer_range), bias rows stay zero.

    >>> config = Qwen3GatedConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
    ...                           elementwise_attn_output_gate=True)
    >>> grow_q_proj(torch.ones(4 * 4, 16), config).shape                    # 4 heads x (4 query + 4 gate rows)
    torch.Size([32, 16])
    """
    _check_choice(init, INITS, "init")
    head_dim = config.head_dim
    # a view of the stock rows as (K, G, D, *inputs); an empty gate of 0 rows per head
    grouped_query, _ = split_query_and_gate(query, config.num_key_value_heads, head_dim, 0, dim=0)
    num_kv, heads_per_group = grouped_query.shape[:2]
    gate = query.new_zeros(num_kv, heads_per_group, gate_dim(config.gate_type, head_dim), *query.shape[1:])
    if init == "random" and query.ndim > 1:
        gate.normal_(mean=0.0, std=config.initializer_range)
    return merge_query_and_gate(grouped_query, gate, dim=0)  # (H*D + H*g, *inputs)


def convert_tensor(name: str, tensor: torch.Tensor, config: Qwen3GatedConfig, init: str = "identity") -> torch.Tensor:
    """The gated model's tensor of this name: q_proj grown (the released layout), the tensor the gate halves doubled
    (identity: o_proj's weight for the released gate, :data:`DOUBLED_FOR_IDENTITY` for the others), else ``tensor``.

    >>> config = Qwen3GatedConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
    ...                           headwise_attn_output_gate=True)
    >>> convert_tensor("model.layers.0.self_attn.o_proj.weight", torch.ones(8, 8), config)[0, 0].item()
    2.0
    """
    if config.gate_in_q_proj and name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
        return grow_q_proj(tensor, config, init)
    if init == "identity" and _doubled_for_identity(name, config):
        return tensor * 2  # exact: see the module docstring
    return tensor


def converted_tensors(
    name: str, tensor: torch.Tensor, config, init: str = "identity"
) -> list[tuple[str, torch.Tensor]]:
    """The gated model's tensors for the source tensor ``name``: :func:`convert_tensor`'s, and after q_proj's weight
    the layer's new tensors (:func:`new_layer_tensors`: ``g_proj`` of a gate outside q_proj, ...)."""
    converted = [(name, convert_tensor(name, tensor, config, init))]
    if name.endswith("self_attn.q_proj.weight"):
        converted += new_layer_tensors(name, tensor, config, init)
    return converted


# ----------------------------------------------------------------------------------------------
# In memory


def convert_qwen3_to_gated(
    model: nn.Module, gate: str = "headwise", init: str = "identity", **variant
) -> Qwen3GatedPreTrainedModel:
    """The gated variant of a loaded stock Qwen3 model, sharing all its tensors but q_proj and o_proj.

    ``model`` is a transformers ``Qwen3ForCausalLM``, ``Qwen3ForSequenceClassification`` or
    ``Qwen3Model`` (or a Qwen3Gated one without a gate), or the Qwen3-MoE counterpart of one
    (``Qwen3MoeForCausalLM``, ...), in any dtype, on any devices (also with a ``device_map``). Returns the
    matching Qwen3Gated (Qwen3MoeGated) class with a :class:`Qwen3GatedConfig` (``Qwen3MoeGatedConfig``);
    an MoE's router and experts are handed over as they are.

    The input is not consumed, nor modified: it still computes what it did. But no weight is
    copied, so the two models share every tensor except the grown q_proj and the rescaled o_proj
    (new tensors, on the device and in the dtype of the ones they replace). Training the gated model
    therefore changes the input's shared weights too; ``del model`` afterwards frees its old
    q_proj and o_proj. With ``init="identity"`` the logits are bit-identical to the input's (see the
    module docstring for why); ``init="random"`` draws the gate rows with torch's global generator,
    so ``torch.manual_seed`` makes it repeatable. ``variant`` gives the other keys of the design space
    (docs/design-space.md); a gate outside q_proj gets a new ``g_proj``, and identity is refused where none exists.

    >>> from transformers import Qwen3Config, Qwen3ForCausalLM
    >>> stock = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    ...                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8))
    >>> gated = convert_qwen3_to_gated(stock, gate="headwise")
    >>> type(gated).__name__, gated.model.layers[0].self_attn.q_proj.weight.shape
    ('Qwen3GatedForCausalLM', torch.Size([36, 32]))
    >>> ids = torch.tensor([[1, 2, 3]])
    >>> torch.equal(gated(ids).logits, stock(ids).logits)
    True
    """
    _check_choice(gate, GATES, "gate")
    _check_choice(init, INITS, "init")
    gated, tensors = _gated_skeleton(model, gate, variant)
    check_identity_init(gated.config, init)
    for source_name, tensor in tensors.items():
        with torch.no_grad():
            pairs = converted_tensors(source_name, tensor, gated.config, init)
        for name, converted in pairs:
            # An unchanged tensor is handed over as the same object, which keeps ties (lm_head and
            # embed_tokens) and requires_grad; a new one becomes a Parameter like the one it replaces.
            if converted is not tensor and isinstance(tensor, nn.Parameter):
                converted = nn.Parameter(converted, requires_grad=tensor.requires_grad)
            module_name, _, attribute = name.rpartition(".")
            setattr(gated.get_submodule(module_name), attribute, converted)
    return _finish_like(gated, model)


def _gated_skeleton(
    model: nn.Module, gate: str, variant: dict
) -> tuple[Qwen3GatedPreTrainedModel, dict[str, torch.Tensor]]:
    """The gated counterpart of ``model`` on the meta device (nothing allocated), and ``model``'s tensors by name,
    checked to be the skeleton's: refuses a model of another class, one with offloaded weights or adapters."""
    gated_class = next((gated for stock, gated in GATED_CLASSES.items() if isinstance(model, stock)), None)
    if gated_class is None:
        raise GatedQwenError(
            f"cannot convert a {type(model).__name__}; give a Qwen3ForCausalLM, Qwen3ForSequenceClassification or "
            "Qwen3Model, or their Qwen3-MoE counterparts (Qwen3MoeForCausalLM, ...)"
        )
    source = type(model).__name__
    config = gated_config_from_dict(model.config.to_dict(), gate, source, **variant)
    config.architectures = [gated_class.__name__]
    config._attn_implementation = model.config._attn_implementation
    tensors = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))
    offloaded = [name for name, tensor in tensors.items() if tensor.device.type == "meta"]
    if offloaded:
        raise GatedQwenError(
            f"{source} has offloaded weights ({offloaded[0]} is on the meta device); load it without "
            "cpu/disk offload, or convert its checkpoint on disk with `gated-qwen convert`"
        )

    # Build the gated skeleton without allocating anything; the caller hands it the source's tensors.
    with torch.device("meta"):
        gated = gated_class(config)
    expected = dict(gated.named_parameters(remove_duplicate=False)) | dict(gated.named_buffers(remove_duplicate=False))
    new = {name for name in expected if name.endswith(NEW_TENSOR_ENDS)}  # a gate's own projection, ...
    if expected.keys() - new != tensors.keys():
        extra, missing = sorted(tensors.keys() - expected.keys()), sorted(expected.keys() - new - tensors.keys())
        raise GatedQwenError(
            f"{source} does not have the tensors of a stock {'Qwen3-MoE' if isinstance(config, Qwen3MoeGatedConfig) else 'Qwen3'}: "
            + "; ".join(
                f"{what} {', '.join(names[:3])}" for what, names in (("extra", extra), ("missing", missing)) if names
            )
            + " (merge or remove adapters first)"
        )
    return gated, tensors


def _finish_like(gated: Qwen3GatedPreTrainedModel, model: nn.Module) -> Qwen3GatedPreTrainedModel:
    """``gated`` in ``model``'s training mode, with its generation config and, spread over devices, its device map."""
    gated.train(model.training)
    if getattr(model, "generation_config", None) is not None and hasattr(gated, "generation_config"):
        gated.generation_config = copy.deepcopy(model.generation_config)
    # transformers keeps hf_device_map (and accelerate's hooks that move activations between
    # devices) only for a model spread over several devices; the new modules need hooks of their own.
    device_map = getattr(model, "hf_device_map", None)
    if device_map and len(set(device_map.values())) > 1:
        from accelerate import dispatch_model

        gated = dispatch_model(gated, device_map=device_map, skip_keys=gated._skip_keys_device_placement)
    return gated


# ----------------------------------------------------------------------------------------------
# On disk


@dataclass
class ConversionResult:
    """What :func:`convert_checkpoint` wrote."""

    path: Path
    files: list[str]
    total_size: int  # bytes of tensor data written
    max_difference: float | None = None  # largest |logit difference| from --verify, else None
    gate: str = "headwise"
    init: str = "identity"


def convert_checkpoint(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    gate: str = "headwise",
    init: str = "identity",
    dtype: str = "auto",
    max_shard_size: int | str = "5GB",
    overwrite: bool = False,
    revision: str | None = None,
    subfolder: str = "",
    verify: bool = False,
    progress: bool = True,
    **variant,
) -> ConversionResult:
    """Write the gated variant of the Qwen3 checkpoint ``src`` into the folder ``dst``.

    ``src`` is a local folder or a hub id (only the files needed are downloaded: config, weights,
    tokenizer, generation config). Its weights may be safetensors or, as in the released arms,
    ``pytorch_model.bin`` (read with ``torch.load(weights_only=True)``, never a plain unpickle).
    Tensors are read one at a time and written straight into sharded safetensors (at most
    ``max_shard_size`` each, with an index), so peak memory is about the largest tensor, not the
    model. ``dtype`` casts floating tensors ("auto" keeps them as stored). The tokenizer files,
    generation_config.json and chat template are copied; config.json becomes a
    :class:`Qwen3GatedConfig`. ``verify`` loads both on CPU and compares their logits on a short
    probe (0.0 for identity init without a dtype change).

    ``gate="keep"`` keeps the source's own gate (none, headwise or elementwise) and changes no
    tensor: a released arm becomes a clean gated-qwen checkpoint (safetensors, ``model_type
    "qwen3_gated"`` plus the released keys) whose logits equal the source's bit for bit.

    ``src`` is only read. ``dst`` is written through :class:`gated_qwen.checkpoint.outputs.OutputFolder`: into a
    staging folder, put in place only when whole, so a failure leaves ``dst`` as it was; a link is
    followed, an existing non-empty ``dst`` is refused unless ``overwrite``.

    >>> import tempfile
    >>> from transformers import Qwen3Config, Qwen3ForCausalLM
    >>> temporary = tempfile.TemporaryDirectory()
    >>> folder = Path(temporary.name)
    >>> stock = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8))
    >>> stock.save_pretrained(folder / "qwen3")  # a stock Qwen3 checkpoint, without a gate
    >>> result = convert_checkpoint(folder / "qwen3", folder / "headwise", gate="headwise", verify=True,
    ...                             progress=False)
    >>> result.files, result.max_difference  # identity init: the same logits
    (['model.safetensors'], 0.0)
    >>> Qwen3GatedConfig.from_pretrained(folder / "headwise").gate_type
    'headwise'
    >>> convert_checkpoint(  # downloads a released arm  # doctest: +SKIP
    ...     "QwQZh/gated_attention", folder / "headwise-arm", gate="keep", subfolder="1B_gate_headwise")
    >>> temporary.cleanup()
    """
    conversion = Conversion(gate, init, verify, **variant)
    written = conversion.run(
        src,
        dst,
        dtype=dtype,
        max_shard_size=max_shard_size,
        overwrite=overwrite,
        revision=revision,
        subfolder=subfolder,
        progress=progress,
    )
    return ConversionResult(
        path=written.path,
        files=written.files,
        total_size=written.plan.total_size,
        max_difference=written.max_difference,
        gate=conversion.config.gate_type if gate == "keep" else gate,
        init=init,
    )


class Conversion(CheckpointTransform):
    """:func:`convert_checkpoint`'s steps: the target config and class from config.json (:meth:`check_config`),
    the mapping from the header (:meth:`build`), each tensor grown or doubled (:meth:`map_tensor`)."""

    output_name = "converted checkpoint"
    description = "converting"

    def __init__(self, gate: str = "headwise", init: str = "identity", verify: bool = False, **variant):
        _check_choice(gate, CHECKPOINT_GATES, "gate")
        _check_choice(init, INITS, "init")
        self.gate, self.init, self.verifies, self.variant = gate, init, verify, variant
        # set by check_config: the source's config, the target's, and the gated class that reads the target
        self.source_config: Qwen3GatedConfig | Qwen3MoeGatedConfig | None = None
        self.config: Qwen3GatedConfig | Qwen3MoeGatedConfig | None = None
        self.gated_class: type | None = None

    def check_config(self, config_dict: dict, source: str, target_dtype) -> None:  # before any weight is fetched
        source_config = source_config_from_dict(config_dict, source)
        if self.gate == "keep":
            config = source_config
        else:
            config = gated_config_from_dict(config_dict, self.gate, source, **self.variant)
            check_identity_init(config, self.init)
        moe = isinstance(config, Qwen3MoeGatedConfig)
        architecture = (config_dict.get("architectures") or ["Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"])[0]
        gated_class = gated_model_class(config_dict, architecture)
        if gated_class is None:
            raise CheckpointError(
                f"{source} is a {architecture}; only Qwen3ForCausalLM, Qwen3ForSequenceClassification and Qwen3Model "
                "checkpoints, and their Qwen3-MoE counterparts (Qwen3MoeForCausalLM, ...), can be converted"
            )
        config.architectures = [gated_class.__name__]
        if target_dtype is not None:
            config.dtype = target_dtype
        self.source_config, self.config, self.gated_class = source_config, config, gated_class

    def build(self, header, target_dtype) -> TensorMapping:
        check_weights_match_config(self.source_config, header.tensors, header.source)
        with torch.device("meta"):
            skeleton = self.gated_class(self.config)
        # A tied lm_head is not saved by transformers, and is ignored on loading if a checkpoint has it.
        tied = set(skeleton.all_tied_weights_keys)
        return TensorMapping(
            map_tensor=self.map_tensor,
            # as save_pretrained writes them: an MoE's experts one tensor per expert, copied unchanged
            target_shapes=saved_shapes(skeleton, skip=tied),
            not_saved=tied,
            write_config=self.config.save_pretrained,
            advice="check num_hidden_layers, tie_word_embeddings and attention_bias against the weights",
        )

    def map_tensor(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if is_fused_experts(name):  # an MoE saved fused: written as save_pretrained writes experts
            return split_fused_experts(name, tensor)
        return [(name, tensor)] if self.gate == "keep" else converted_tensors(name, tensor, self.config, self.init)

    def verify(self, source: Path, converted: Path) -> float:
        return _max_logit_difference(self.gated_class, source, converted)


def _max_logit_difference(gated_class, source: Path, converted: Path) -> float:
    """Largest absolute difference of the two checkpoints' outputs on a short probe, both on CPU."""
    # The source reads as a Qwen3Gated model without a gate: the same computation as stock Qwen3,
    # and it also reads the released baseline (qkv_bias, no QK-norm), which stock Qwen3 cannot.
    models = [gated_class.from_pretrained(folder, dtype="auto", device_map="cpu") for folder in (source, converted)]
    generator = torch.Generator().manual_seed(0)
    probe = torch.randint(models[0].config.vocab_size, (1, 16), generator=generator)
    with torch.no_grad():
        source_out, converted_out = (model(probe)[0].float() for model in models)
    return (source_out - converted_out).abs().max().item()


__all__ = [
    "Conversion",
    "ConversionResult",
    "convert_checkpoint",
    "convert_qwen3_to_gated",
    "check_identity_init",
    "convert_tensor",
    "converted_tensors",
    "gate_projection",
    "grow_q_proj",
    "new_layer_tensors",
]
