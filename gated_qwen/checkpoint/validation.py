"""Whether a checkpoint's weights are the ones its config describes, the rules of strict ``from_pretrained``,
``inspect``, ``convert``, ``export`` and the vLLM plugin: from the headers before anything is built
(:func:`check_weights_match_config`; what the tensors should be is the config's decoder built on the meta device
with the layers the checkpoint holds).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from ..errors import CheckpointError, WeightShapeMismatchError
from ..models.layout import gate_type_for_rows
from .formats import TensorInfo


_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
FUSED_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
# The config values a tensor's size can come from, in the order messages name them.
SIZE_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_experts",
    "num_attention_heads", "num_key_value_heads", "head_dim",
)  # fmt: skip
# The config values that decide whether a tensor is there (qkv_bias decides the attention biases; the config
# keeps attention_bias equal to it).
PRESENCE_KEYS = ("qkv_bias", "use_qk_norm", "sandwich_norm")


def _split_layer_name(name: str) -> tuple[int | None, str]:
    """``(layer index, name inside the layer)`` of a decoder-layer tensor, else ``(None, name without "model.")``."""
    match = _LAYER.match(name)
    if match:
        return int(match.group(1)), match.group(2)
    return None, name.removeprefix("model.")


def _gate_says(config) -> str:
    keys = ("gate_type",) if config.gate_type == "none" else ("gate_type", "gate_position", "gate_shared_across_heads")
    if config.gate_type != "none" and getattr(config, "gate_input", "hidden_states") != "hidden_states":
        keys += ("gate_input",)
    return " and ".join(f"{key} {getattr(config, key)!r}" for key in keys)


def skeleton_tensors(config, layers: int, **changes) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors of ``config``'s decoder (``layers.0.mlp.up_proj.weight``, ...) with its first
    ``layers`` layers (and ``changes`` to the config), built on the meta device: nothing is allocated.

    >>> from gated_qwen import Qwen3GatedConfig
    >>> config = Qwen3GatedConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=20000,
    ...                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, gate_type="headwise")
    >>> skeleton_tensors(config, 1, vocab_size=500000000)["embed_tokens.weight"]  # one layer built, on meta
    (500000000, 32)
    """
    import torch

    from ..models.qwen3_gated.modeling_qwen3_gated import Qwen3GatedModel
    from ..models.qwen3_moe_gated.modeling_qwen3_moe_gated import Qwen3MoeGatedModel

    aliases = getattr(type(config), "attribute_map", {})  # num_experts is num_local_experts in transformers 5.25
    values = {**config.to_dict(), **{aliases.get(k, k): v for k, v in changes.items()}, "num_hidden_layers": layers}
    for key in ("layer_types", "dtype", "torch_dtype", "quantization_config"):  # no size: layer_types made again
        values.pop(key, None)
    decoder_class = Qwen3MoeGatedModel if config.model_type == "qwen3_moe_gated" else Qwen3GatedModel
    small = type(config).from_dict(values)
    with torch.device("meta"):
        decoder = decoder_class(small)
    return {name: tuple(tensor.shape) for name, tensor in decoder.state_dict().items()}


def expected_shape(skeleton: Mapping[str, tuple[int, ...]], name: str) -> tuple[int, ...] | str | None:
    """The shape ``skeleton`` gives the checkpoint tensor ``name``: None outside the decoder and ``lm_head``; a str
    (what leaves it out, or "") where the config has no place for it. Experts stored one tensor per expert are
    slices of the fused ``mlp.experts.gate_up_proj`` (gate rows, then up rows) and ``mlp.experts.down_proj``."""
    layer, local = _split_layer_name(name)
    if layer is None:
        return skeleton["embed_tokens.weight"] if name == "lm_head.weight" else skeleton.get(local)
    key = f"layers.{layer}.{local}"
    if key in skeleton:
        return skeleton[key]
    expert = _EXPERT.match(local)
    fused = skeleton.get(f"layers.{layer}.{FUSED_EXPERTS[expert.group(2) == 'down_proj']}") if expert else None
    if fused is None:
        return None if local.startswith("self_attn.rotary_emb.") else ""  # a buffer older checkpoints saved
    if int(expert.group(1)) >= fused[0]:
        return f"num_experts {fused[0]}"
    return fused[1:] if expert.group(2) == "down_proj" else (fused[1] // 2, fused[2])


class ConfigTensors:
    """What ``config`` says the tensors of its first ``layers`` decoder layers are (a skeleton on the meta device,
    :func:`skeleton_tensors`), and which config values say so: the ones whose change moves a size, or makes a
    tensor appear or go, found on skeletons built with each changed (only once a message needs them)."""

    def __init__(self, config, layers: int):
        self.config, self.layers = config, layers
        self.skeleton = skeleton_tensors(config, layers)
        self._changed: dict[str, dict | None] = {}

    def shape(self, name: str) -> tuple[int, ...] | str | None:
        return expected_shape(self.skeleton, name)

    def _with_changed(self, key: str) -> dict | None:
        if key not in self._changed:
            value, self._changed[key] = getattr(self.config, key, None), None
            others = (
                (not value,) if isinstance(value, bool) else (value * 2, value // 2) if isinstance(value, int) else ()
            )
            for other in others:
                try:
                    self._changed[key] = skeleton_tensors(self.config, self.layers, **{key: other})
                    break
                except Exception:  # noqa: BLE001 - a value the config refuses (kv heads above heads): the next
                    continue
        return self._changed[key]

    def size_says(self, name: str, dim: int) -> str:
        """The config values that size dimension ``dim`` of ``name``: ``"num_key_value_heads 4 and head_dim 16"``."""
        keys = []
        for key in SIZE_KEYS:
            other = self._with_changed(key) if getattr(self.config, key, 0) not in (0, 1, None) else None
            shape = expected_shape(other, name) if other is not None else None
            if isinstance(shape, tuple) and (len(shape) <= dim or shape[dim] != self.shape(name)[dim]):
                keys.append(key)
        return " and ".join(f"{key} {getattr(self.config, key)}" for key in keys)

    def presence_says(self, name: str) -> str:
        """The config values that put ``name`` there or leave it out: ``"use_qk_norm False"``; "" where none does."""
        layer, local = _split_layer_name(name)
        if local.startswith(("self_attn.g_proj.", "self_attn.gate_logits")):
            return _gate_says(self.config)
        if local.startswith(("mlp.experts.", "mlp.gate.")) and getattr(self.config, "num_experts", 0):
            return f"num_experts {self.config.num_experts}"
        present = isinstance(self.shape(name), tuple)
        keys = [
            key
            for key in PRESENCE_KEYS
            if (other := self._with_changed(key)) is not None
            and isinstance(expected_shape(other, name), tuple) != present
        ]
        return " and ".join(f"{key} {getattr(self.config, key)}" for key in keys)

    def required(self, layer: int, held: set[str]) -> list[str]:
        """The names inside decoder layer ``layer`` it must hold, given the names ``held`` there: an MoE's experts
        fused where it holds them fused, else one tensor per expert (a few missing ones named at most)."""
        prefix = f"layers.{layer}."
        names = [key.removeprefix(prefix) for key in self.skeleton if key.startswith(prefix)]
        if prefix + FUSED_EXPERTS[0] not in self.skeleton or any(local in held for local in FUSED_EXPERTS):
            return names
        names, missing = [local for local in names if local not in FUSED_EXPERTS], 0
        for index in range(self.skeleton[prefix + FUSED_EXPERTS[0]][0]):  # bounded by the experts held
            for projection in ("gate_proj", "up_proj", "down_proj"):
                names.append(f"mlp.experts.{index}.{projection}.weight")
                missing += names[-1] not in held
            if missing >= 6:
                break
        return names


# Each quantizer's safetensors layout, as its save_pretrained writes it. torchao (transformers'
# TorchAoHfQuantizer.serialized_names): "<module>.weight" stored as its tensor subclass's parts,
# "<module>._weight_qdata", "<module>._weight_scale", ... bitsandbytes 4-bit: "<module>.weight" packed
# (two values a byte, as one column) beside its quant state, "<module>.weight.absmax", ".quant_map",
# ".nested_absmax", ".nested_quant_map", ".quant_state.bitsandbytes__nf4" (or __fp4).
_QUANTIZED_PART = re.compile(
    r"^(.+)\._(\w+?)_(?:qdata|scale_and_zero|per_tensor_scale|scale|zero_point|act_pre_scale)$"
    r"|^(.+)\.(weight)\.(?:absmax|quant_map|nested_absmax|nested_quant_map|quant_state\.bitsandbytes__\w+)$"
)
# bitsandbytes 8-bit: "<module>.weight" as int8 in the weight's own shape, beside "<module>.SCB" (a scale per
# row) and "<module>.weight_format": the weight is checked as any other, these two belong to it.
_QUANTIZER_EXTRA = re.compile(r"^(.+)\.(?:SCB|weight_format)$")


def quantized_parameters(tensors: Mapping[str, TensorInfo]) -> tuple[dict[str, TensorInfo], set[str]]:
    """The tensors under the model's parameter names (a quantized weight's parts as the one weight), and the names
    whose stored shape a quantizer owns, to check on the loaded model (:func:`loaded_shapes`).

    >>> qdata, scale = TensorInfo((36, 32), "I8"), TensorInfo((36, 1), "F32")  # int8 weight, one scale per row
    >>> quantized_parameters({"q_proj._weight_qdata": qdata, "q_proj._weight_scale": scale})
    ({'q_proj.weight': TensorInfo(shape=(36, 32), dtype='I8')}, {'q_proj.weight'})
    """
    plain: dict[str, TensorInfo] = {}
    quantized: set[str] = set()
    for name, info in tensors.items():
        part = _QUANTIZED_PART.match(name)
        if part is not None:
            module, parameter = (part.group(1), part.group(2)) if part.group(1) else (part.group(3), part.group(4))
            quantized.add(f"{module}.{parameter}")
            plain.setdefault(f"{module}.{parameter}", info)
        elif not ((extra := _QUANTIZER_EXTRA.match(name)) and f"{extra.group(1)}.weight" in tensors):
            plain[name] = info
    for name in quantized & tensors.keys():  # a bitsandbytes 4-bit weight: the packed bytes, not the weight
        plain[name] = tensors[name]
    return plain, quantized


def loaded_shapes(model, tensors: Mapping[str, TensorInfo], names: set[str]) -> dict[str, TensorInfo]:
    """``tensors`` with the shapes of ``names`` taken from the loaded ``model``: those of the weights they stand for
    (a torchao tensor subclass's own shape, a bitsandbytes 4-bit weight's quant state's).

    >>> from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM
    >>> config = Qwen3GatedConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, gate_type="headwise")
    >>> model, name = Qwen3GatedForCausalLM(config), "model.layers.0.self_attn.q_proj.weight"
    >>> tensors = {name: TensorInfo((36, 16), "U8")}  # two 4-bit values a byte: not the weight's shape
    >>> loaded_shapes(model, tensors, {name})[name].shape  # 4 heads of 8 query rows and 1 gate row, 32 wide
    (36, 32)
    """
    params = dict(model.named_parameters())
    shapes = dict(tensors)
    for name in names:
        # A bare-model checkpoint's names lack the causal LM's prefix.
        param = params.get(name, params.get(f"{model.base_model_prefix}.{name}"))
        if param is not None:  # absent from the model: transformers reports it
            shape = getattr(getattr(param, "quant_state", None), "shape", None) or param.shape
            shapes[name] = TensorInfo(tuple(shape), tensors[name].dtype)
    return shapes


def weight_disagreements(
    config, tensors: Mapping[str, TensorInfo], sizes: bool = True, unchecked: Collection[str] = ()
) -> list[str]:
    """Each way the tensors disagree with ``config``, worst first, one sentence each ([] when they agree): shapes
    (``sizes=False``: only the gates', never silently re-initialised; none of ``unchecked``, a quantizer's), the
    layer count, decoder tensors missing or without a place. Task heads other than ``lm_head`` are transformers'.

    >>> from gated_qwen import Qwen3GatedConfig
    >>> from gated_qwen.checkpoint import read_checkpoint_header
    >>> from gated_qwen.default_models import default_model_path
    >>> arm = default_model_path("headwise")
    >>> config, tensors = Qwen3GatedConfig.from_pretrained(arm), read_checkpoint_header(arm).tensors
    >>> config.vocab_size = 500
    >>> weight_disagreements(config, tensors)
    ['config.json says vocab_size 500, but model.embed_tokens.weight is (4096, 256), not (500, 256)']
    """
    layers, held = _layers_held(tensors)
    # The layers built: those the checkpoint holds (one at least), within the config's count, never that count alone.
    expected = ConfigTensors(config, max(1, min(config.num_hidden_layers, max(layers, default=0) + 1)))
    problems: list[tuple[tuple, str]] = []
    no_place: dict[str, list[str]] = {}
    for name, info in tensors.items():
        layer, local = _split_layer_name(name)
        if layer is not None and layer >= config.num_hidden_layers:
            continue  # reported once, as the layer count, below
        shape = expected.shape(name)
        # q_proj's weight first within its layer: its sentence names the gate type the rows imply.
        order = (layer is not None, layer or 0, local != "self_attn.q_proj.weight", local)
        if isinstance(shape, str):
            no_place.setdefault(shape or expected.presence_says(name), []).append(name)
        elif shape is not None and name not in unchecked and tuple(info.shape) != shape:
            if local == "self_attn.q_proj.weight" and len(info.shape) == 2:
                problems.append((order, _q_proj_sentence(config, name, tuple(info.shape), shape)))
            elif sizes or local.startswith(("self_attn.q_proj.", "self_attn.g_proj.", "self_attn.gate_logits")):
                # gates never re-initialised
                problems.append((order, _size_sentence(expected, name, tuple(info.shape), shape)))
    # Part of the decoder held (a layer, the embedding, the final norm): all of it needed
    prefix = "model." if any(name.startswith("model.") for name in tensors) else ""
    outside = [prefix + key for key in expected.skeleton if not key.startswith("layers.")]
    decoder_held = bool(held or set(outside) & tensors.keys())
    sentences = _layer_count_sentences(config.num_hidden_layers, layers, decoder_held)
    sentences += [sentence for _, sentence in sorted(problems)]
    lacking: dict[str, list[str]] = {"": [name for name in outside if decoder_held and name not in tensors]}
    for layer in sorted(index for index in held if index < config.num_hidden_layers):
        for local in expected.required(layer, held[layer]):
            if local not in held[layer]:
                lacking.setdefault(expected.presence_says(f"layers.{layer}.{local}"), []).append(
                    f"{layers[layer]}.{local}"
                )
    for says, names in lacking.items():
        if names:
            sentences.append(
                (f"config.json says {says}, but " if says else "")
                + f"the checkpoint lacks weights the model needs: {_listed(sorted(names), 4)}"
            )
    for says, names in no_place.items():
        names = sorted(names, key=lambda n: (_split_layer_name(n)[0] or 0, n))
        sentences.append(
            (f"config.json says {says}, but the checkpoint has " if says else "the checkpoint has ")
            + f"{_listed(names, 3)}, which the config has no place for"
        )
    return sentences


def _listed(names: list[str], at_most: int) -> str:
    return ", ".join(names[:at_most]) + (f" and {len(names) - at_most} more" if len(names) > at_most else "")


def _size_sentence(expected: ConfigTensors, name: str, found: tuple[int, ...], shape: tuple[int, ...]) -> str:
    wrong = [expected.size_says(name, i) for i in range(len(shape)) if i >= len(found) or found[i] != shape[i]]
    says = " and ".join(dict.fromkeys(s for s in wrong if s)) or f"{len(shape)} dimensions"
    return f"config.json says {says}, but {name} is {found}, not {shape}"


def _layers_held(tensors: Mapping[str, TensorInfo]) -> tuple[dict[int, str], dict[int, set[str]]]:
    """Each decoder layer the checkpoint holds: its prefix (``model.layers.3``), and the names inside it."""
    layers: dict[int, str] = {}
    held: dict[int, set[str]] = {}
    for name in tensors:
        layer, local = _split_layer_name(name)
        if layer is not None:
            layers.setdefault(layer, name.removesuffix(local).rstrip("."))
            held.setdefault(layer, set()).add(local)
    return layers, held


def _layer_count_sentences(num_hidden_layers: int, layers: dict[int, str], decoder_held: bool = False) -> list[str]:
    """The layer-count disagreement, if any; ``layers`` maps each layer index found to its prefix."""
    if not layers and not decoder_held:  # none of the decoder: not a checkpoint of this model (transformers says)
        return []
    beyond = [index for index in layers if index >= num_hidden_layers]
    if beyond:
        return [
            f"config.json says num_hidden_layers {num_hidden_layers}, but the checkpoint holds {len(layers)} "
            f"layers, up to {layers[max(layers)]}"
        ]
    if len(layers) < num_hidden_layers:
        absent = next(index for index in range(len(layers) + 1) if index not in layers)
        return [
            f"config.json says num_hidden_layers {num_hidden_layers}, but the checkpoint holds {len(layers)} "
            f"layer{'s' * (len(layers) != 1)}" + (f" (none numbered {absent})" if absent < len(layers) else "")
        ]
    return []


def check_layer_count(
    num_hidden_layers: int, tensors: Mapping[str, TensorInfo], source: str = "the checkpoint", advice: str = ""
) -> None:
    """:func:`check_weights_match_config`'s layer-count rule alone, run before the config object is built (whose
    construction grows with ``num_hidden_layers``).

    >>> from gated_qwen.default_models import default_model_path
    >>> from gated_qwen.checkpoint import read_checkpoint_header
    >>> folder = default_model_path("headwise")  # the shipped 4-layer model
    >>> check_layer_count(20000, read_checkpoint_header(folder).tensors, str(folder))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    gated_qwen.errors.CheckpointError: ...says num_hidden_layers 20000, but the checkpoint holds 4 layers...
    """
    _refuse(source, _layer_count_sentences(num_hidden_layers, _layers_held(tensors)[0]), advice)


def _q_proj_sentence(config, name: str, found: tuple[int, ...], expected: tuple[int, ...]) -> str:
    implied = gate_type_for_rows(found[0], config.num_attention_heads, config.head_dim)
    implied_text = f"that is the shape of a {implied!r} gate" if implied else "no gate type has that many rows"
    # A gate with its own projection (g_proj) leaves q_proj with the query rows alone.
    own = config.gate_type != "none" and not getattr(config, "gate_in_q_proj", True)
    gate = f"a {config.gate_variant()}, in g_proj" if own else f"gate type {config.gate_type!r}"
    return (
        f"{name} has shape {found} but the config ({gate}, {config.num_attention_heads} heads of dim {config.head_dim}) "
        f"expects {expected}; {implied_text}{' in q_proj' if own else ''}"
    )


def check_weights_match_config(
    config,
    tensors: Mapping[str, TensorInfo],
    source: str = "the checkpoint",
    sizes: bool = True,
    advice: str = "",
    unchecked: Collection[str] = (),
) -> None:
    """Refuse, from the headers and before anything is built, weights that ``config`` does not describe: one
    :class:`~gated_qwen.errors.WeightShapeMismatchError` with the first of :func:`weight_disagreements`, how many
    more there are, and what to do (``advice`` added to it).

    >>> from gated_qwen import Qwen3GatedConfig
    >>> from gated_qwen.default_models import default_model_path
    >>> from gated_qwen.checkpoint import read_checkpoint_header
    >>> folder = default_model_path("headwise")
    >>> config, tensors = Qwen3GatedConfig.from_pretrained(folder), read_checkpoint_header(folder).tensors
    >>> config.vocab_size = 500000000
    >>> check_weights_match_config(config, tensors, str(folder))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    gated_qwen.errors.WeightShapeMismatchError: ...says vocab_size 500000000, but model.embed_tokens.weight is (4096...
    """
    _refuse(source, weight_disagreements(config, tensors, sizes, unchecked), advice, error=WeightShapeMismatchError)


def _refuse(source: str, sentences: list[str], advice: str, error: type[CheckpointError] = CheckpointError) -> None:
    if sentences:
        more = (
            f" (and {len(sentences) - 1} more disagreement{'s' * (len(sentences) > 2)})" if len(sentences) > 1 else ""
        )
        raise error(
            f"{source}: {sentences[0]}{more}. The config does not describe these weights: use the config.json that "
            f"came with them, or correct the key it names{advice}."
        )
