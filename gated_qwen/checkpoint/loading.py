"""Strict loading: transformers' ``from_pretrained``, refusing a checkpoint its config does not describe.

transformers (5.x) has no hook that sees both the config and the checkpoint's files before the model is built, so
:func:`install_strict_loading` wraps the inherited ``from_pretrained`` on a model family's base class.
``import gated_qwen`` installs it as soon as the family's modeling module is imported (a post-import hook), however
the class is reached; a family gets it by one entry of ``STRICT_LOADING`` in ``gated_qwen/__init__.py``.
"""

from __future__ import annotations

import functools

from ..errors import CheckpointError

# From the modules that define them, not the package: a transformers import inside the package's __init__ can
# import this module (through the registration hook) while the package is half initialised.
from .formats import HUB_KWARGS, read_weight_file_header, resolve_weight_files
from .validation import (
    check_layer_count,
    check_weights_match_config,
    loaded_shapes,
    quantized_parameters,
)


# The attribute that marks a from_pretrained installed here (installing twice changes nothing).
_STRICT_MARK = "_gated_qwen_strict_loading"


def strict_from_pretrained(
    cls, inherited, family: str, pretrained_model_name_or_path, *model_args, strict: bool = True, **kwargs
):
    """transformers' ``from_pretrained`` (``inherited``, bound to ``cls``; ``family`` names it in messages), refusing
    unless ``strict=False`` a checkpoint its config does not describe: from the headers, before the model is built
    (:func:`~gated_qwen.checkpoint.validation.check_weights_match_config`), then from the load report (part of the
    decoder missing, a causal-LM checkpoint without its untied ``lm_head``). Reads the released arms, stock Qwen3
    and quantized checkpoints; task heads, ``state_dict`` and ``ignore_mismatched_sizes`` (but for q_proj's gate
    rows) are as in transformers. ``trust_remote_code=True`` is refused.

    >>> from gated_qwen import Qwen3GatedForCausalLM, default_models
    >>> folder = default_models.default_model_path("headwise")
    >>> Qwen3GatedForCausalLM.from_pretrained(folder).config.gate_type
    'headwise'
    >>> Qwen3GatedForCausalLM.from_pretrained(folder, use_qk_norm=False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    gated_qwen.errors.WeightShapeMismatchError: ...use_qk_norm False, but the checkpoint has ...k_norm.weight...
    >>> Qwen3GatedForCausalLM.from_pretrained(folder, use_qk_norm=False, strict=False).config.use_qk_norm  # drops QK-norm
    False
    """
    from transformers.configuration_utils import PreTrainedConfig

    output_loading_info = kwargs.pop("output_loading_info", False)
    if kwargs.get("trust_remote_code"):
        raise CheckpointError(
            f"trust_remote_code is not needed for {family} and is refused: this class never runs code from a checkpoint"
        )
    config = kwargs.get("config")
    checkable = (
        strict
        and pretrained_model_name_or_path is not None
        and not (kwargs.get("state_dict") is not None or kwargs.get("gguf_file") or kwargs.get("from_tf"))
    )
    if checkable:
        source, advice = str(pretrained_model_name_or_path), ", or pass strict=False to load it as transformers would"
        tensors = {}
        for file in resolve_weight_files(pretrained_model_name_or_path, **kwargs):
            tensors.update(read_weight_file_header(file))
        if not isinstance(config, PreTrainedConfig):
            config = _checked_config(cls, config or pretrained_model_name_or_path, tensors, source, advice, kwargs)
        # A quantized weight is stored as the quantizer's parts: read as the weight, its shape checked once loaded
        quantized = set()
        if getattr(config, "quantization_config", None) or kwargs.get("quantization_config"):
            tensors, quantized = quantized_parameters(tensors)
        # Under ignore_mismatched_sizes transformers re-initialises differing sizes: only the gate rows stay checked
        sizes = not kwargs.get("ignore_mismatched_sizes")
        check_weights_match_config(config, tensors, source, sizes=sizes, advice=advice, unchecked=quantized)

    model, loading_info = inherited(pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs)
    unpack_uneven_4bit_weights(model)
    if checkable:
        if quantized:  # transformers sets a quantized weight whatever its shape: check the shapes it stands for
            check_weights_match_config(config, loaded_shapes(model, tensors, quantized), source, sizes, advice)
        # A checkpoint of a model with a head (every name under the decoder's prefix) carries its untied lm_head;
        # a bare model's gets a fresh head, as in transformers
        if (
            tensors
            and "lm_head.weight" in loading_info["missing_keys"]
            and all(name.startswith(f"{model.base_model_prefix}.") for name in tensors)
        ):
            raise CheckpointError(
                f"{source}: config.json says tie_word_embeddings False, but the checkpoint lacks weights the model "
                f"needs: lm_head.weight. Use the config.json that came with the weights{advice}."
            )
    return (model, loading_info) if output_loading_info else model


def unpack_uneven_4bit_weights(model) -> list[str]:
    """Keep bitsandbytes' 4-bit CPU kernel (AVX512-BF16, which asserts ``N must be divisible by block_n``) off the
    weights whose rows are not a multiple of 32, as a headwise q_proj's; they take its plain 4-bit path (the same
    values). Returns the modules changed.

    >>> import torch
    >>> unpack_uneven_4bit_weights(torch.nn.Linear(4, 68))  # not a bitsandbytes module: nothing to do
    []
    """
    changed = []
    for name, module in model.named_modules():
        if type(module).__name__ == "Linear4bit" and getattr(module, "support_avx512bf16_for_cpu", False):
            if module.out_features % 32:
                module.support_avx512bf16_for_cpu = False
                changed.append(name)
    return changed


def _checked_config(cls, config_source, tensors, source: str, advice: str, kwargs: dict):
    """The config ``from_pretrained`` will build, with the keys given to it; the layer count checked first."""
    hub_kwargs = {k: v for k, v in kwargs.items() if k in HUB_KWARGS}
    # Config keys given to from_pretrained: the dataclass fields, and the released flags (properties)
    keys = {*cls.config_class.__dataclass_fields__, "headwise_attn_output_gate", "elementwise_attn_output_gate"}
    overrides = {k: v for k, v in kwargs.items() if k in keys}
    # The layer count first: building the config object costs time in proportion to it (per-layer attention types)
    config_dict, _ = cls.config_class.get_config_dict(config_source, **hub_kwargs)
    layers = overrides.get("num_hidden_layers", config_dict.get("num_hidden_layers"))
    if isinstance(layers, int) and not isinstance(layers, bool):
        check_layer_count(layers, tensors, source, advice)
    return cls.config_class.from_pretrained(config_source, **hub_kwargs, **overrides)


def install_strict_loading(model_class: type) -> None:
    """Make ``model_class.from_pretrained`` (and its subclasses') :func:`strict_from_pretrained`; idempotent.

    >>> from gated_qwen.models.qwen3_gated.modeling_qwen3_gated import Qwen3GatedForCausalLM, Qwen3GatedPreTrainedModel
    >>> install_strict_loading(Qwen3GatedPreTrainedModel)  # import gated_qwen has already: this changes nothing
    >>> Qwen3GatedForCausalLM.from_pretrained.__module__  # the subclasses inherit the strict loader
    'gated_qwen.checkpoint.loading'
    """
    installed = vars(model_class).get("from_pretrained")
    if getattr(getattr(installed, "__func__", None), _STRICT_MARK, False):
        return
    family = model_class.__name__.removesuffix("PreTrainedModel")

    @functools.wraps(strict_from_pretrained, assigned=("__doc__",))
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, strict: bool = True, **kwargs):
        # The next from_pretrained after model_class in cls's MRO: transformers' own (PreTrainedModel's).
        inherited = super(model_class, cls).from_pretrained
        return strict_from_pretrained(
            cls, inherited, family, pretrained_model_name_or_path, *model_args, strict=strict, **kwargs
        )

    from_pretrained.__qualname__ = f"{model_class.__qualname__}.from_pretrained"
    from_pretrained.__module__ = __name__
    setattr(from_pretrained, _STRICT_MARK, True)
    model_class.from_pretrained = classmethod(from_pretrained)
