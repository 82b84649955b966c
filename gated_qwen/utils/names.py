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
GATE_ACTIVATIONS = ("sigmoid", "silu")
GATE_COMBINATIONS = ("multiplicative", "additive")
# The design-space keys beside gate_type and their defaults: the released gate's.
GATE_VARIANT_DEFAULTS = {
    "gate_position": "sdpa_output",
    "gate_shared_across_heads": False,
    "gate_activation": "sigmoid",
    "gate_combination": "multiplicative",
}
# What each of those keys does, as the command lines (convert, train, bench) say it.
GATE_VARIANT_HELP = {
    "gate_position": "the tensor the gate acts on: sdpa_output (released, G1), value (G2), key (G3), query (G4), "
    "dense_output (after o_proj, G5)",
    "gate_shared_across_heads": "one set of gate scores shared by all heads (default: each head its own)",
    "gate_activation": "the gate's activation",
    "gate_combination": "multiplicative: Y * act(XW); additive: Y + act(XW)",
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
    "CHECKPOINT_CONVERSION_GATES",
    "CONVERSION_GATES",
    "CONVERSION_INITS",
    "DEVICES",
    "DTYPES",
    "GATE_ACTIVATIONS",
    "GATE_COMBINATIONS",
    "GATE_POSITIONS",
    "GATE_TYPES",
    "GATE_VARIANT_DEFAULTS",
    "GATE_VARIANT_HELP",
    "model_label",
]
