"""Whether a checkpoint's weights are the ones its config describes.

The rules every way of reading a checkpoint applies (strict ``from_pretrained``
(:mod:`~gated_qwen.checkpoint.loading`), ``inspect``, ``convert``, ``export``):

- :func:`check_q_proj_layout`, before any weight is read: q_proj's rows must fit the config's gate type;
- :func:`check_loaded_weights`, after transformers has loaded: no part of the decoder missing, nothing the
  config has no place for, and a causal-LM checkpoint carries its language-model head.
"""

from __future__ import annotations

from ..errors import CheckpointError
from ..models.layout import gate_type_for_rows, q_proj_rows
from .formats import TensorInfo


def check_q_proj_layout(config, tensors: dict[str, TensorInfo], source: str = "the checkpoint") -> None:
    """Refuse a checkpoint whose q_proj rows do not match ``config``'s gate type.

    Raises :class:`CheckpointError` naming the layer, the expected and found shapes, and the gate type
    the found shape implies, so that gate rows are never silently dropped or initialised at random.

    >>> check_q_proj_layout(config, read_checkpoint_header(folder).tensors)  # doctest: +SKIP
    """
    head_dim = config.head_dim
    expected_rows = q_proj_rows(config.gate_type, config.num_attention_heads, head_dim)
    for layer in range(config.num_hidden_layers):
        name = f"model.layers.{layer}.self_attn.q_proj.weight"
        info = tensors.get(name) or tensors.get(name.removeprefix("model."))
        if info is None:
            continue
        expected = (expected_rows, config.hidden_size)
        if tuple(info.shape) != expected:
            implied = gate_type_for_rows(info.shape[0], config.num_attention_heads, head_dim)
            implied_text = (
                f"that is the shape of a {implied!r} gate" if implied else "no gate type has that many rows"
            )
            raise CheckpointError(
                f"{source}: {name} has shape {tuple(info.shape)} but the config (gate type {config.gate_type!r}, "
                f"{config.num_attention_heads} heads of dim {head_dim}) expects {expected}; {implied_text}. "
                "Use the config.json that came with these weights."
            )


def required_head_keys(model) -> set[str]:
    """The head weights a checkpoint of ``model``'s own class must hold: its language-model head (transformers'
    ``get_output_embeddings``), if it has one. A classifier's ``score`` is not among them: a fresh one is normal.

    >>> required_head_keys(Qwen3GatedForCausalLM(config))  # doctest: +SKIP
    {'lm_head.weight'}
    """
    head = model.get_output_embeddings()
    return {f"{name}.weight" for name, module in model.named_children() if head is not None and module is head}


def check_loaded_weights(model, loading_info: dict, checkpoint_keys: set[str] | None, source: str) -> None:
    """Refuse a load whose missing or unexpected weights show that the config does not describe the checkpoint.

    ``loading_info`` is ``from_pretrained``'s (``output_loading_info=True``); ``checkpoint_keys`` the weight
    names in the checkpoint (None when unknown). The rule is strict ``from_pretrained``'s
    (:func:`gated_qwen.checkpoint.loading.strict_from_pretrained`).

    >>> model, info = Qwen3GatedForCausalLM.from_pretrained(folder, strict=False, output_loading_info=True)  # doctest: +SKIP
    >>> check_loaded_weights(model, info, set(read_weight_file_header(folder / "model.safetensors")), str(folder))  # doctest: +SKIP
    """
    base = model.base_model
    prefix = "" if base is model else f"{model.base_model_prefix}."
    decoder_modules = {name for name, _ in base.named_children()}

    def in_decoder(key: str) -> bool:  # a key of the bare decoder, with or without the head's prefix
        return key.removeprefix(f"{model.base_model_prefix}.").split(".", 1)[0] in decoder_modules

    missing, unexpected = set(loading_info.get("missing_keys") or ()), set(loading_info.get("unexpected_keys") or ())
    decoder_keys = {key for key in model.state_dict() if key.startswith(prefix) and in_decoder(key)}
    missing_decoder = sorted(missing & decoder_keys)
    problems = []
    # All of the decoder missing: the checkpoint is not of this model at all, which transformers reports.
    if missing_decoder and len(missing_decoder) < len(decoder_keys):
        problems.append(("lacks weights the model needs", missing_decoder))
    unexpected_decoder = sorted(key for key in unexpected if in_decoder(key))
    if unexpected_decoder:
        problems.append(("has weights the model has no place for", unexpected_decoder))
    # A checkpoint of this same head (its decoder under the prefix, no other head) must carry the head too;
    # a bare-model checkpoint gets a fresh head, as in transformers.
    head_checkpoint = bool(prefix) and checkpoint_keys is not None and any(k.startswith(prefix) for k in checkpoint_keys)
    other_heads = [key for key in unexpected if not in_decoder(key)]
    missing_heads = sorted(missing & required_head_keys(model))
    if head_checkpoint and not other_heads and missing_heads:
        problems.append(("lacks weights the model needs", missing_heads))
    for what, keys in problems:
        shown = ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
        raise CheckpointError(
            f"{source} {what}: {shown}. The config does not describe these weights (check use_qk_norm, qkv_bias, "
            "tie_word_embeddings, num_hidden_layers against the checkpoint), or pass strict=False to load it as "
            "transformers would."
        )


__all__ = ["check_loaded_weights", "check_q_proj_layout", "required_head_keys"]
