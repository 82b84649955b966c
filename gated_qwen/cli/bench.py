"""``gated-qwen bench``: measure what the gate costs; writes benchmark.md and benchmark.json."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path


OUTPUT_FILES = ("benchmark.md", "benchmark.json")
PARTS = ("models", "loading", "conversion")
STOCK_ARM = "qwen3"  # the arm of transformers' own Qwen3ForCausalLM (gated_qwen.tools.benchmark.measure.STOCK_ARM)
# The project's targets, which this command checks and reports as met or not (docs/benchmarks.md):
TARGET_SLACK = 0.02  # a gated arm within 2% of its floor, the no-gate arm within 2% of Qwen3ForCausalLM
CONVERSION_TIME_TARGET = 2.0  # conversion within 2x the time of copying the files
RSS_ALLOWANCE = 300 * 2**20  # conversion's peak RSS under twice the largest tensor plus 300 MB


def add_parser(subparsers) -> None:
    # The defaults and choices come from the library's torch-free options module, the one place they are defined.
    from ..tools.benchmark.options import DTYPES, SIZES, BenchmarkOptions
    from ._arguments import add_gate_variant_arguments

    defaults = BenchmarkOptions()
    parser = subparsers.add_parser(
        "bench",
        help="benchmark the gate: speed, loading and conversion against their floors",
        description="Prefill and greedy decode tokens/s of transformers' Qwen3ForCausalLM and Qwen3Gated with "
        "gate none/headwise/elementwise at one architecture, interleaved in one process (medians over rounds, "
        "each gated arm's time ratio beside its parameter ratio); from_pretrained of a gated checkpoint beside a "
        "stock one; the converter's throughput and peak RSS beside a plain copy. Prints a markdown table and "
        "writes it with a JSON file of every measurement into --output-dir. --gate picks the gated arms and the "
        "--gate-* options give them a variant of the paper's design space (docs/design-space.md).",
    )
    parser.add_argument(
        "--size",
        choices=list(SIZES),
        default=defaults.size,
        help="architecture (default %(default)s: about 108M parameters)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change one config key of the architecture, e.g. --set num_hidden_layers=12 (VALUE is read as JSON)",
    )
    parser.add_argument(
        "--gate",
        dest="gates",
        choices=defaults.gates,
        action="append",
        default=None,
        help="a gated arm to measure, repeatable (default: both); loading and conversion use the first",
    )
    add_gate_variant_arguments(parser)
    add_workload_arguments(parser, defaults)
    parser.add_argument("--dtype", choices=list(DTYPES), default=defaults.dtype)
    parser.add_argument("--device", default=defaults.device, help="cpu, cuda, cuda:1, ... (default %(default)s)")
    parser.add_argument(
        "--attn-implementation",
        default=defaults.attn_implementation,
        help="sdpa, eager, flash_attention_2, ... (default %(default)s)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--skip", choices=PARTS, action="append", default=[], help="leave out a part; repeatable")
    parser.add_argument(
        "--scratch-dir", default=None, help="where the benchmark checkpoints are written (default: a temporary folder)"
    )
    parser.add_argument(
        "--output-dir",
        default="benchmark-results",
        help="folder for benchmark.md and benchmark.json (default %(default)s)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace benchmark.md/.json already in --output-dir")
    parser.set_defaults(run=run)


def add_workload_arguments(parser, defaults) -> None:
    """What each arm runs: the prefill batch sizes, prompt and decode lengths, and the measured rounds."""
    parser.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        default=list(defaults.batch_sizes),
        metavar="N",
        help="prefill batch sizes (default %(default)s)",
    )
    parser.add_argument(
        "--prompt-length",
        type=int,
        default=defaults.prompt_length,
        metavar="TOKENS",
        help="prompt tokens (default %(default)s)",
    )
    parser.add_argument(
        "--new-tokens",
        type=int,
        default=defaults.new_tokens,
        metavar="TOKENS",
        help="greedy decode tokens (default %(default)s)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=defaults.repeats,
        metavar="N",
        help="measured rounds after one warm-up (default %(default)s)",
    )


def parse_overrides(pairs: list[str]) -> dict:
    """``["num_hidden_layers=12", "hidden_act=gelu"]`` to a dict; values are JSON, else kept as strings.

    >>> parse_overrides(["num_hidden_layers=12", "hidden_act=gelu"])
    {'num_hidden_layers': 12, 'hidden_act': 'gelu'}
    """
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {pair!r} is not KEY=VALUE, e.g. --set num_hidden_layers=12")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def command_line(args) -> str:
    """The ``gated-qwen bench`` command that repeats this run (every option spelled out)."""
    from ..utils.names import GATE_VARIANT_DEFAULTS

    words = ["gated-qwen", "bench", "--size", args.size]
    for pair in args.overrides:
        words += ["--set", pair]
    for gate in args.gates or ():
        words += ["--gate", gate]
    for key, value in gate_variant(args).items():
        flag = "--" + key.replace("_", "-")
        words += [flag] if isinstance(GATE_VARIANT_DEFAULTS[key], bool) else [flag, value]
    words += ["--batch-sizes", *map(str, args.batch_sizes), "--prompt-length", str(args.prompt_length)]
    words += ["--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats), "--dtype", args.dtype]
    words += ["--device", args.device, "--attn-implementation", args.attn_implementation]
    if args.threads is not None:
        words += ["--threads", str(args.threads)]
    for part in args.skip:
        words += ["--skip", part]
    return shlex.join(words)


def gate_variant(args) -> dict:
    """The design-space keys the --gate-* options set away from the released gate's.

    >>> import argparse
    >>> from gated_qwen.utils.names import GATE_VARIANT_DEFAULTS
    >>> gate_variant(argparse.Namespace(**{**GATE_VARIANT_DEFAULTS, "gate_position": "value", "sandwich_norm": True}))
    {'gate_position': 'value', 'sandwich_norm': True}
    """
    from ..utils.names import GATE_VARIANT_DEFAULTS
    from ._arguments import gate_variant_options

    return {key: value for key, value in gate_variant_options(args).items() if value != GATE_VARIANT_DEFAULTS[key]}


def check_targets(result: dict) -> list[dict]:
    """The project's targets against a benchmark result: one row per target with measured, limit and met.

    Time ratios are paired medians (``gated_qwen.tools.benchmark.measure.paired_ratio``). The released headwise
    gate's limit is 1 plus 2%; any other gated arm's (elementwise, or a variant of ``gate_variant``) is its
    parameter share over the no-gate arm plus 2%: of all parameters for decode, which reads every weight each
    step (the floor of a memory-bound step), and of the decoder layers' parameters for prefill, whose compute
    grows with those alone (``layer_parameter_count``). For a mixture of experts, of the parameters a token
    uses (the active ones): the idle experts are neither read nor computed.

    >>> result = {"conversion": {"time_ratio_to_copy": 1.5, "peak_rss": {"convert": 900e6},
    ...                          "largest_tensor_bytes": 200e6}}
    >>> [(row["target"], row["met"]) for row in check_targets(result)]
    [('conversion time / copy time', True), ('conversion peak RSS (MB)', False)]
    """
    rows = []
    moe = "active_parameters" in result
    variant = result.get("options", {}).get("gate_variant")
    stock_label = "Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"

    def add(what, measured, limit, quartiles=None):
        rows.append(
            {"target": what, "measured": measured, "limit": limit, "met": measured <= limit, "quartiles": quartiles}
        )

    if "models" in result:
        for workload, numbers in result["models"]["workloads"].items():
            counted = "layer_parameters" if workload.startswith("prefill") else "parameters"
            parameters = result[f"active_{counted}"] if moe else result["models"][counted]
            ratios, quartiles = numbers["time_ratio_to_none"], numbers["time_ratio_quartiles_to_none"]
            for gate in (arm for arm in ratios if arm not in (STOCK_ARM, "none")):
                # the released headwise gate adds 1 row per head: its floor is 1
                share = 1.0 if gate == "headwise" and not variant else parameters[gate] / parameters["none"]
                add(f"{workload}: {gate} time / none time", ratios[gate], share + TARGET_SLACK, quartiles[gate])
            add(
                f"{workload}: none time / {stock_label} time",
                numbers["none_time_ratio_to_qwen3"],
                1 + TARGET_SLACK,
                numbers["none_time_ratio_quartiles_to_qwen3"],
            )
    if "conversion" in result:
        conversion = result["conversion"]
        add("conversion time / copy time", conversion["time_ratio_to_copy"], CONVERSION_TIME_TARGET)
        add(
            "conversion peak RSS (MB)",
            conversion["peak_rss"]["convert"] / 1e6,
            (2 * conversion["largest_tensor_bytes"] + RSS_ALLOWANCE) / 1e6,
        )
    return rows


def run(args) -> int:
    from ..checkpoint.outputs import OutputFolder
    from ..tools.benchmark.measure import BenchmarkOptions, run_benchmark
    from ..tools.benchmark.report import format_markdown

    # Checked before measuring, not after minutes of it. --output-dir may hold other files: only these two
    # are written, both at once (gated_qwen.checkpoint.outputs), and earlier ones replaced only with --overwrite.
    output_dir = Path(args.output_dir)
    output = OutputFolder(
        output_dir,
        overwrite=args.overwrite,
        merge=True,
        names=OUTPUT_FILES,
        advice="pass --overwrite or another --output-dir",
    )
    options = BenchmarkOptions(
        size=args.size,
        overrides=parse_overrides(args.overrides),
        batch_sizes=tuple(args.batch_sizes),
        prompt_length=args.prompt_length,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        dtype=args.dtype,
        device=args.device,
        attn_implementation=args.attn_implementation,
        threads=args.threads,
        scratch_dir=args.scratch_dir,
        gates=tuple(dict.fromkeys(args.gates)) if args.gates else BenchmarkOptions.gates,
        gate_variant=gate_variant(args),
        **{part: part not in args.skip for part in PARTS},
    )
    result = run_benchmark(
        options, log=lambda message: print(f"gated-qwen bench: {message}", file=sys.stderr, flush=True)
    )
    result["targets"] = check_targets(result)
    result["command"] = command_line(args)
    markdown = format_markdown(result) + f"\nCommand: `{result['command']}`\n"

    with output as staging:
        (staging / "benchmark.json").write_text(json.dumps(result, indent=2) + "\n")
        (staging / "benchmark.md").write_text(markdown)
    print(markdown, end="")
    print(
        f"gated-qwen bench: wrote {output_dir / 'benchmark.md'} and {output_dir / 'benchmark.json'}", file=sys.stderr
    )
    return 0
