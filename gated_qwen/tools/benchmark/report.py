"""The benchmark's result as markdown tables (:func:`format_markdown`), each arm under its label."""

from __future__ import annotations

from ...utils.names import GATE_VARIANT_DEFAULTS
from .measure import STOCK_ARM


ARM_LABELS = {
    STOCK_ARM: "transformers Qwen3ForCausalLM",
    "none": "Qwen3Gated none",
    "headwise": "Qwen3Gated headwise",
    "elementwise": "Qwen3Gated elementwise",
}
MOE_ARM_LABELS = {
    STOCK_ARM: "transformers Qwen3MoeForCausalLM",
    "none": "Qwen3MoeGated none",
    "headwise": "Qwen3MoeGated headwise",
    "elementwise": "Qwen3MoeGated elementwise",
}


def variant_words(keys: dict) -> list[str]:
    """The design-space keys in ``keys`` that differ from the released gate, as words.

    >>> variant_words({"gate": "headwise", "gate_position": "value", "gate_shared_across_heads": True})
    ['value', 'head-shared']
    >>> variant_words({"gate_input": "none", "attn_output_transform": "rmsnorm", "sandwich_norm": True})
    ['input-independent', 'SDPA rmsnorm', 'sandwich norm']
    """
    words = {
        "gate_shared_across_heads": "head-shared",
        "gate_input": "input-independent",
        "sandwich_norm": "sandwich norm",
    }
    return [
        f"SDPA {value}" if key == "attn_output_transform" else words.get(key, str(value))
        for key, value in keys.items()
        if key in GATE_VARIANT_DEFAULTS and value != GATE_VARIANT_DEFAULTS[key]
    ]


def arm_labels(result: dict) -> dict[str, str]:
    """Each arm's name in the tables; a gated arm's names its variant (``Qwen3Gated headwise (value, silu)``)."""
    labels = dict(MOE_ARM_LABELS if result.get("active_parameters") else ARM_LABELS)
    words = variant_words(result.get("options", {}).get("gate_variant") or {})
    if words:
        for gate in ("headwise", "elementwise"):
            labels[gate] += f" ({', '.join(words)})"
    return labels


def _active_column(result: dict, arm: str) -> list[str]:
    """For a mixture of experts, a token's parameters (the active ones) and their ratio to the no-gate arm's."""
    active = result.get("active_parameters")
    if not active:
        return []
    return [f"{active[arm] / 1e6:.2f}M", f"{active[arm] / active['none']:.4f}"]


def _loading_lines(loading: dict, labels: dict) -> list[str]:
    lines = ["| from_pretrained | checkpoint | median seconds |", "|---|---|---|"]
    gate = loading.get("gate", "headwise")
    for arm in (STOCK_ARM, gate):
        label = f"{labels[arm].removeprefix('transformers ')}, {'stock' if arm == STOCK_ARM else gate} checkpoint"
        lines.append(f"| {label} | {loading['bytes'][arm] / 1e6:.0f} MB | {loading['median_seconds'][arm]:.3f} |")
    return [*lines, f"| gated / stock (paired median) | | {loading['time_ratio_to_qwen3']:.3f} |", ""]


def _conversion_lines(conversion: dict) -> list[str]:
    lines = ["| files | median seconds | MB/s | peak RSS |", "|---|---|---|---|"]
    converter = conversion.get("converter", {"gate": "headwise", "init": "identity"})
    init = [] if converter["init"] == "identity" else [f"{converter['init']} init"]
    described = ", ".join([converter["gate"], *variant_words(converter), *init])
    for kind, label in (("copy", "shutil.copytree"), ("convert", f"convert_checkpoint ({described})")):
        lines.append(
            f"| {label} | {conversion['median_seconds'][kind]:.3f} | {conversion['megabytes_per_second'][kind]:.0f} "
            f"| {conversion['peak_rss'][kind] / 1e6:.0f} MB |"
        )
    return [
        *lines,
        "",
        f"Source checkpoint {conversion['source_bytes'] / 1e6:.0f} MB, largest tensor "
        f"{conversion['largest_tensor_bytes'] / 1e6:.0f} MB. Each child, copying or converting, imports the converter "
        f"before its clock starts: {conversion['import_only_peak_rss'] / 1e6:.0f} MB resident before any work.",
        "",
    ]


def format_markdown(result: dict) -> str:
    """The benchmark's tables as markdown: speed per arm, the targets a result carries (``gated-qwen bench`` adds
    them), loading, conversion, machine.

    >>> from gated_qwen.tools.benchmark.measure import BenchmarkOptions, run_benchmark
    >>> result = run_benchmark(BenchmarkOptions(size="tiny", repeats=1, prompt_length=8, new_tokens=4, batch_sizes=(1,),
    ...                                         loading=False, conversion=False))
    >>> print(format_markdown(result).splitlines()[0])
    | arm | parameters | params / none | layer params / none | prefill b1 tokens/s | time / none | decode b1 tokens/s | time / none |
    """
    lines = []
    labels = arm_labels(result)
    active_header = ["active params", "active / none"] if result.get("active_parameters") else []
    if "models" not in result and "parameters" in result:  # speed skipped: the parameter counts alone
        parameters, layer_parameters = result["parameters"], result["layer_parameters"]
        header = ["arm", "parameters", "params / none", "layer params / none", *active_header]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for arm in parameters:
            row = [
                labels[arm],
                f"{parameters[arm] / 1e6:.2f}M",
                f"{parameters[arm] / parameters['none']:.4f}",
                f"{layer_parameters[arm] / layer_parameters['none']:.4f}",
                *_active_column(result, arm),
            ]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    if "models" in result:
        models = result["models"]
        parameters, layer_parameters, workloads = models["parameters"], models["layer_parameters"], models["workloads"]
        header = ["arm", "parameters", "params / none", "layer params / none", *active_header]
        for workload in workloads:
            header += [f"{workload.replace('_', ' ')} tokens/s", "time / none"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for arm in parameters:
            row = [
                labels[arm],
                f"{parameters[arm] / 1e6:.2f}M",
                f"{parameters[arm] / parameters['none']:.4f}",
                f"{layer_parameters[arm] / layer_parameters['none']:.4f}",
                *_active_column(result, arm),
            ]
            for numbers in workloads.values():
                row += [f"{numbers['tokens_per_second'][arm]:.1f}", f"{numbers['time_ratio_to_none'][arm]:.3f}"]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    if result.get("targets"):
        lines += ["| target | measured | middle half of rounds | limit | met |", "|---|---|---|---|---|"]
        for row in result["targets"]:
            spread = "{:.3f}-{:.3f}".format(*row["quartiles"]) if row.get("quartiles") else ""
            lines.append(
                f"| {row['target']} | {row['measured']:.3f} | {spread} | {row['limit']:.3f} | {'yes' if row['met'] else '**no**'} |"
            )
        lines.append("")
    lines += _loading_lines(result["loading"], labels) if "loading" in result else []
    lines += _conversion_lines(result["conversion"]) if "conversion" in result else []
    machine, options = result["machine"], result["options"]
    lines.append(
        f"Machine: {machine['cpu']}, {machine['cores']} cores"
        + (f", {machine['gpu']}" if "gpu" in machine else "")
        + f"; Python {machine['python']}, torch {machine['torch']} ({machine['torch_threads']} threads), transformers "
        f"{machine['transformers']}. {options['dtype']}, {options['attn_implementation']}, prompt {options['prompt_length']} "
        f"tokens, decode {options['new_tokens']} new tokens (each run's median step); medians over {options['repeats']} interleaved "
        "rounds after one warm-up; a time ratio is the median of the rounds' paired ratios, beside their quartiles."
    )
    return "\n".join(lines) + "\n"
