"""The names the commands accept (devices, dtypes, attention implementations, gate types, conversion inits),
and the label a command gives each model in its tables.

Plain tuples, without torch or transformers, so that building the command line (``gated-qwen --help``)
imports nothing heavy. The modules that act on these names (:mod:`gated_qwen.utils.devices`,
:mod:`gated_qwen.models.layout`, :mod:`gated_qwen.transforms.conversion`) take them from here.

>>> "headwise" in GATE_TYPES and "bfloat16" in DTYPES
True
"""

DEVICES = ("auto", "cpu", "cuda", "mps")  # auto: cuda, then mps, then cpu
DTYPES = ("auto", "float32", "bfloat16", "float16")  # auto: the dtype the checkpoint records
ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2")
GATE_TYPES = ("none", "headwise", "elementwise")
# The paper's design space (docs/design-space.md): where the gate applies, how its scores act, how they combine.
# The first of each is the released point; sdpa_output + head-specific + sigmoid + multiplicative is the only
# variant kept in the released layout (gate rows in q_proj).
GATE_POSITIONS = ("sdpa_output", "value", "key", "query", "dense_output")
# ns_sigmoid: 0.5 + 0.5 * sigmoid, scores in [0.5, 1] (Table 4 row 7); identity: the logits themselves (Table 3 row 7)
GATE_ACTIVATIONS = ("sigmoid", "silu", "ns_sigmoid", "identity")
GATE_COMBINATIONS = ("multiplicative", "additive")
# hidden_states: scores projected from the layer's input; none: learned scores, the same for every token (Table 4 row 6)
GATE_INPUTS = ("hidden_states", "none")
# applied to each head's SDPA output, parameter-free SiLU or RMSNorm (Table 3 rows 6 and 5)
ATTN_OUTPUT_TRANSFORMS = ("none", "silu", "rmsnorm")
# The design-space keys beside gate_type and their defaults: the released point's. The last two change the
# attention and the decoder layer with or without a gate (UNGATED_VARIANT_KEYS); the others describe the gate.
GATE_VARIANT_DEFAULTS = {
    "gate_position": "sdpa_output",
    "gate_shared_across_heads": False,
    "gate_activation": "sigmoid",
    "gate_combination": "multiplicative",
    "gate_input": "hidden_states",
    "attn_output_transform": "none",
    "sandwich_norm": False,
}
UNGATED_VARIANT_KEYS = ("attn_output_transform", "sandwich_norm")
# The values each of those keys takes (the booleans take true and false).
GATE_VARIANT_CHOICES = {
    "gate_position": GATE_POSITIONS,
    "gate_activation": GATE_ACTIVATIONS,
    "gate_combination": GATE_COMBINATIONS,
    "gate_input": GATE_INPUTS,
    "attn_output_transform": ATTN_OUTPUT_TRANSFORMS,
}
# What each of those keys does, as the command lines (convert, train, bench) say it.
GATE_VARIANT_HELP = {
    "gate_position": "the tensor the gate acts on: sdpa_output (released, G1), value (G2), key (G3), query (G4), "
    "dense_output (after o_proj, G5)",
    "gate_shared_across_heads": "one set of gate scores shared by all heads (default: each head its own)",
    "gate_activation": "the gate's activation: ns_sigmoid is 0.5 + 0.5*sigmoid, identity none at all",
    "gate_combination": "multiplicative: Y * act(XW); additive: Y + act(XW)",
    "gate_input": "hidden_states: scores projected from the layer's input; none: learned scores, the same for "
    "every token (input-independent)",
    "attn_output_transform": "parameter-free SiLU or RMSNorm on each head's SDPA output, with or without a gate "
    "(--gate none: the paper's rows without a gate)",
    "sandwich_norm": "RMSNorm on the attention and MLP outputs before each residual add (with or without a gate)",
}
CONVERSION_GATES = ("headwise", "elementwise")  # the gates the converter adds to a stock Qwen3
CHECKPOINT_CONVERSION_GATES = (*CONVERSION_GATES, "keep")  # keep: re-save a gated checkpoint's own gate
CONVERSION_INITS = ("identity", "random")


def model_label(model: str, subfolder: str, taken: set[str]) -> str:
    """A short unique column name for a model: its subfolder, else the last part of its path or hub id.

    >>> taken = set()
    >>> model_label("QwQZh/gated_attention", "1B_baseline", taken), model_label("runs/a/final", "", taken)
    ('1B_baseline', 'final')
    >>> model_label("other/final", "", taken)
    'final-2'
    """
    from pathlib import PurePath

    label = PurePath(subfolder).name if subfolder else PurePath(model.rstrip("/")).name or model
    base, number = label, 2
    while label in taken:
        label, number = f"{base}-{number}", number + 1
    taken.add(label)
    return label


__all__ = [
    "ATTENTION_IMPLEMENTATIONS",
    "ATTN_OUTPUT_TRANSFORMS",
    "CHECKPOINT_CONVERSION_GATES",
    "CONVERSION_GATES",
    "CONVERSION_INITS",
    "DEVICES",
    "DTYPES",
    "GATE_ACTIVATIONS",
    "GATE_COMBINATIONS",
    "GATE_INPUTS",
    "GATE_POSITIONS",
    "GATE_TYPES",
    "GATE_VARIANT_CHOICES",
    "GATE_VARIANT_DEFAULTS",
    "GATE_VARIANT_HELP",
    "UNGATED_VARIANT_KEYS",
    "model_label",
]
