"""``gated-qwen analyze``: gates, attention sink, massive activations and perplexity of one or more models."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def add_parser(subparsers) -> None:
    from ._arguments import add_device_and_dtype, add_model_source, number

    parser = subparsers.add_parser(
        "analyze",
        help="measure gates, attention sinks, massive activations and perplexity",
        description="Run the paper's instruments on a Qwen3 or Qwen3Gated model, dense or mixture of experts (and, "
        "with --compare, on others): gate statistics, first-token attention per layer and head, massive activations, "
        "the router's load per layer (MoE), and perplexity (--text). Writes analysis.json with every number and PNG figures to --out.",
    )
    parser.add_argument("model", metavar="MODEL", help="a checkpoint folder or a hub id")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--text",
        metavar="FILE",
        help="a UTF-8 text file: perplexity over all of it, the other measures on its first --max-tokens tokens",
    )
    source.add_argument("--prompt", metavar="TEXT", help="a text to analyze (its perplexity too)")
    parser.add_argument(
        "--compare", nargs="+", default=[], metavar="MODEL", help="more models to put in the same table and figures"
    )
    add_model_source(parser, several=True)
    parser.add_argument(
        "--out",
        default="analysis",
        metavar="DIR",
        help="output folder: missing or empty unless --overwrite (default: ./analysis)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the contents of a non-empty --out")
    parser.add_argument(
        "--layers",
        type=int,
        nargs="+",
        metavar="L",
        help="layers whose attention maps to draw (default: first, middle, last)",
    )
    parser.add_argument(
        "--max-tokens",
        type=number(int, 1),
        default=256,
        help="tokens of the text the gates, sinks and activations are measured on (default 256)",
    )
    parser.add_argument(
        "--skip-queries",
        type=number(int, 0),
        default=0,
        help="leave the first N queries out of the first-token attention (default 0)",
    )
    parser.add_argument(
        "--context", type=number(int, 2), default=512, help="perplexity window in tokens (default 512)"
    )
    parser.add_argument(
        "--stride", type=number(int, 1), default=None, help="perplexity window step (default context/2)"
    )
    parser.add_argument(
        "--batch-size", type=number(int, 1), default=4, help="perplexity windows per forward (default 4)"
    )
    add_device_and_dtype(parser, dtype_default="float32", dtype_help="dtype to run in (default float32)")
    parser.add_argument(
        "--context-lengths",
        type=_context_lengths,
        default=None,
        metavar="L,L,...",
        help="length extrapolation (needs --text): perplexity over non-overlapping windows of each length, "
        "also beyond the model's max_position_embeddings, e.g. 256,512,1024,2048",
    )
    parser.add_argument(
        "--rope-scaling",
        type=_rope_scaling,
        default=None,
        metavar="TYPE:FACTOR",
        help="scale RoPE for this run (the checkpoint is not changed): yarn:FACTOR, linear:FACTOR or "
        "dynamic:FACTOR, FACTOR above 1, the original context being max_position_embeddings",
    )
    parser.add_argument("--no-plots", action="store_true", help="write the JSON only (no matplotlib needed)")
    parser.add_argument("--verbose", action="store_true", help="show transformers' log messages and progress bars")
    parser.set_defaults(run=run)


def _context_lengths(text: str) -> list[int]:
    """``--context-lengths``: comma-separated integers of at least 2.

    >>> _context_lengths("256,512")
    [256, 512]
    """
    import argparse

    lengths = []
    for part in text.split(","):
        try:
            value = int(part)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"{part!r} is not an integer (give lengths like 256,512,1024)") from error
        if value < 2:
            raise argparse.ArgumentTypeError(f"{value} is not a context length: each must be at least 2")
        lengths.append(value)
    return lengths


def _rope_scaling(text: str) -> tuple[str, float]:
    """``--rope-scaling TYPE:FACTOR``.

    >>> _rope_scaling("yarn:4")
    ('yarn', 4.0)
    """
    import argparse

    supported = (
        "yarn",
        "linear",
        "dynamic",
    )  # gated_qwen.tools.analysis.extrapolation.ROPE_TYPES (not imported: torch)
    kind, _, factor = text.partition(":")
    if kind not in supported:
        raise argparse.ArgumentTypeError(f"unknown RoPE scaling {kind!r}: supported are {', '.join(supported)}")
    try:
        value = float(factor)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not TYPE:FACTOR, e.g. yarn:4") from error
    if not value > 1 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"the RoPE scaling factor must be above 1, not {factor}")
    return kind, value


def analyze_model(model, tokenizer, text: str, args) -> tuple[dict, dict]:
    """All measures of one loaded model on ``text``: (the JSON-ready numbers, the tensors the figures need)."""
    import torch

    from ..errors import GatedQwenError
    from ..tools.analysis.gates import gated_attention_layers, record_gates, summarize_gates
    from ..tools.analysis.perplexity import perplexity
    from ..tools.analysis.routing import router_load
    from ..tools.analysis.sinks import massive_activations, record_attention

    device = next(model.parameters()).device
    ids = tokenizer(text, return_tensors="pt").input_ids[0]
    if ids.numel() < 2:
        raise GatedQwenError("the text is shorter than 2 tokens; give a longer --prompt or --text")
    probe = ids[: args.max_tokens][None].to(device)  # (1, T)
    layers = model.config.num_hidden_layers
    map_layers = args.layers if args.layers is not None else sorted({0, layers // 2, layers - 1})
    wrong = [layer for layer in map_layers if not 0 <= layer < layers]
    if wrong:
        raise GatedQwenError(f"--layers {wrong} do not exist; the model has layers 0..{layers - 1}")
    if args.skip_queries >= probe.shape[1]:
        raise GatedQwenError(
            f"--skip-queries {args.skip_queries} leaves no query of the {probe.shape[1]} tokens analyzed"
        )

    gated = bool(gated_attention_layers(model))
    with torch.no_grad(), record_attention(model, args.skip_queries, map_layers=map_layers) as attention:
        if gated:
            with record_gates(model) as gates:
                model(input_ids=probe)
            gate_summary = summarize_gates(gates)
        else:
            model(input_ids=probe)
            gate_summary = None
    first_token = attention.first_token()  # (L, H)
    ppl = perplexity(model, ids, args.context, args.stride, args.batch_size, progress=sys.stderr.isatty())
    numbers = {
        "gate_type": getattr(model.config, "gate_type", "none"),
        "analyzed_tokens": probe.shape[1],
        "first_token_attention": {
            "mean": first_token.mean().item(),
            "per_layer": first_token.mean(1).tolist(),
            "per_layer_and_head": first_token.tolist(),
            "skip_queries": args.skip_queries,
        },
        "gates": gate_summary,
        # a mixture of experts: the router's load per sparse layer, beside the gates (None for a dense model)
        "router_load": router_load(model, probe),
        "massive_activations": massive_activations(model, probe),
        "perplexity": {
            "perplexity": ppl.perplexity,
            "mean_nll": ppl.mean_nll,
            "tokens": ppl.tokens,
            "windows": ppl.windows,
            "context": args.context,
            "stride": args.stride or max(1, args.context // 2),
        },
    }
    if getattr(args, "context_lengths", None):
        from ..tools.analysis.extrapolation import perplexity_by_context_length

        by_length = perplexity_by_context_length(model, ids, args.context_lengths, batch_size=args.batch_size)
        numbers["context_lengths"] = {
            "max_position_embeddings": model.config.max_position_embeddings,
            "rope_parameters": dict(model.config.rope_parameters or {}),
            "lengths": [result.to_json() for result in by_length],
        }
    tokens = [tokenizer.decode([t]) for t in probe[0].tolist()]
    return numbers, {"maps": attention.maps, "tokens": tokens}


def _write_figures(folder: Path, numbers: dict, tensors: dict) -> list[str]:
    from ..tools.analysis.figures import plot_attention_maps, plot_first_token_attention, plot_gate_histograms

    written = []
    plot_attention_maps(
        {label: t["maps"] for label, t in tensors.items()},
        {label: t["tokens"] for label, t in tensors.items()},
        folder / "attention_maps.png",
    )
    written.append("attention_maps.png")
    plot_first_token_attention(
        {label: n["first_token_attention"]["per_layer"] for label, n in numbers.items()},
        folder / "first_token_attention.png",
    )
    written.append("first_token_attention.png")
    histograms = {
        label: [layer["histogram"] for layer in n["gates"]["layers"]] for label, n in numbers.items() if n["gates"]
    }
    if histograms:
        plot_gate_histograms(histograms, folder / "gate_histograms.png")
        written.append("gate_histograms.png")
    return written


def _print_table(numbers: dict) -> None:
    header = (
        "model",
        "gate",
        "first-token attn",
        "gate mean",
        "gate<0.1",
        "max |h| / median",
        "router max/even",
        "ppl",
    )
    rows = []
    for label, n in numbers.items():
        gates = n["gates"]["overall"] if n["gates"] else None
        ratio = max(layer["ratio"] for layer in n["massive_activations"])
        routers = n.get("router_load")
        rows.append(
            (
                label,
                n["gate_type"],
                f"{n['first_token_attention']['mean']:.3f}",
                f"{gates['mean']:.3f}" if gates else "-",
                f"{gates['below_0.1']:.3f}" if gates else "-",
                f"{ratio:.1f}",
                f"{max(layer['max_over_even'] for layer in routers):.2f}" if routers else "-",
                f"{n['perplexity']['perplexity']:.2f}",
            )
        )
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)))


def _print_length_table(numbers: dict) -> None:
    """One row per model and context length: windows, tokens scored, perplexity; * past max_position_embeddings."""
    header = ("model", "length", "windows", "tokens", "ppl", "")
    rows, notes = [], []
    for label, n in numbers.items():
        lengths = n.get("context_lengths")
        if not lengths:
            continue
        for result in lengths["lengths"]:
            measured = result["perplexity"] is not None
            rows.append(
                (
                    label,
                    result["length"],
                    result["windows"],
                    result["tokens"],
                    f"{result['perplexity']:.2f}" if measured else "not measurable",
                    "*" if result["beyond_max_position_embeddings"] else "",
                )
            )
            if not measured:
                notes.append(
                    f"{label}: length {result['length']} is not measurable: the text has fewer tokens than that"
                )
    if not rows:
        return
    print()
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
    limits = sorted(
        {n["context_lengths"]["max_position_embeddings"] for n in numbers.values() if n.get("context_lengths")}
    )
    print(f"* longer than max_position_embeddings ({', '.join(map(str, limits))})")
    for note in notes:
        print(note)


def run(args) -> int:
    from ..checkpoint.outputs import OutputFolder
    from ..errors import GatedQwenError
    from ..tools.generation import check_tokenizer_files, load_model_and_tokenizer, local_checkpoint_folder
    from ..utils.devices import resolve_device, resolve_dtype
    from ..utils.names import model_label
    from ..utils.verbosity import quiet_transformers
    from ._arguments import subfolders_per_model

    if args.context_lengths and args.text is None:
        raise GatedQwenError("--context-lengths needs --text FILE: the lengths are measured on a file's tokens")
    models = [args.model, *args.compare]
    subfolders = subfolders_per_model(args.subfolder, models)
    if args.text is not None:
        try:
            text = Path(args.text).read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise GatedQwenError(f"{args.text} is not UTF-8 text") from error
    else:
        text = args.prompt
    for model_name, subfolder in zip(models, subfolders):  # every source checked before any model is loaded
        local_checkpoint_folder(model_name, subfolder, args.revision)
        check_tokenizer_files(model_name, subfolder, args.revision)
    output = OutputFolder(args.out, overwrite=args.overwrite)  # checked before any model is loaded
    if not args.no_plots:
        from ..tools.analysis.figures import _pyplot

        _pyplot()  # fail before any model is loaded when matplotlib is missing
    (
        resolve_device(args.device),
        resolve_dtype(args.dtype),
    )  # an unavailable device or dtype: refused before any loading

    numbers, tensors, taken = {}, {}, set()
    for model_name, subfolder in zip(models, subfolders):
        label = model_label(model_name, subfolder, taken)
        print(f"analyzing {label} ({model_name}{' / ' + subfolder if subfolder else ''})", file=sys.stderr)
        with quiet_transformers(args.verbose):
            model, tokenizer = load_model_and_tokenizer(
                model_name, subfolder=subfolder, revision=args.revision, device=args.device, dtype=args.dtype
            )
        if args.rope_scaling is not None:
            from ..tools.analysis.extrapolation import apply_rope_scaling

            # on the loaded model: its config and rotary embedding (the only reader of rope_parameters, whose inv_freq
            # is never in the checkpoint) are rebuilt, which equals from_pretrained(config=scaled); the disk is untouched
            apply_rope_scaling(model, *args.rope_scaling)
        numbers[label], tensors[label] = analyze_model(model, tokenizer, text, args)
        numbers[label]["source"] = {"model": model_name, "subfolder": subfolder, "revision": args.revision}
        del model

    with (
        output as staging
    ):  # --out is put in place whole at the end, or left as it was (gated_qwen.checkpoint.outputs)
        figures = [] if args.no_plots else _write_figures(staging, numbers, tensors)
        arguments = {key: value for key, value in vars(args).items() if key != "run"}
        report = {"arguments": arguments, "figures": figures, "models": numbers}
        (staging / "analysis.json").write_text(json.dumps(report, indent=2))
    out = Path(args.out)
    _print_table(numbers)
    _print_length_table(numbers)
    print(f"wrote {out / 'analysis.json'}" + (f" and {', '.join(figures)}" if figures else ""), file=sys.stderr)
    return 0
