"""``gated-qwen export``: write a gated checkpoint as a stock architecture that engines read without gated-qwen."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    # No torch or transformers here: building the parser must stay instant (choices are checked in run).
    parser = subparsers.add_parser(
        "export",
        help="export a gated checkpoint to transformers' stock Qwen3.5 architecture",
        description="Stream a gated checkpoint (a released arm or one saved by gated-qwen; a folder or a hub id) "
        "tensor by tensor into a stock transformers Qwen3_5ForCausalLM checkpoint (model_type qwen3_5_text, "
        "every layer full attention), which computes the same model and loads without gated-qwen. A headwise "
        "gate is stored elementwise (+6.8%% parameters on the released 1.7B arm). SRC is only read; DST is "
        "written atomically.",
    )
    parser.add_argument("src", metavar="SRC", help="a gated checkpoint folder or a hub id")
    parser.add_argument("dst", metavar="DST", help="the folder to write (must not exist or be empty, unless --overwrite)")
    parser.add_argument("--to", required=True, metavar="ARCH", help="target architecture: qwen3_5")
    parser.add_argument(
        "--dtype", default="auto", metavar="DTYPE", help="auto (as stored, default), float32, bfloat16 or float16"
    )
    parser.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard, e.g. 5GB or 500MB (default: 5GB)")
    parser.add_argument("--overwrite", action="store_true", help="replace DST if it exists and is not empty")
    parser.add_argument("--revision", default=None, help="hub branch, tag or commit of SRC")
    parser.add_argument("--subfolder", default="", help="folder inside SRC holding the checkpoint, e.g. 1B_gate_headwise")
    parser.add_argument(
        "--verify", action="store_true",
        help="load SRC (gated-qwen) and DST (transformers' Qwen3_5ForCausalLM) in float32 on CPU and print the "
        "largest logit difference",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def run(args) -> int:
    from ..export import export_checkpoint

    result = export_checkpoint(
        args.src,
        args.dst,
        to=args.to,
        dtype=args.dtype,
        max_shard_size=args.max_shard_size,
        overwrite=args.overwrite,
        revision=args.revision,
        subfolder=args.subfolder,
        verify=args.verify,
        progress=not args.quiet,
    )
    print(
        f"wrote {result.path}: {result.to}, {result.total_size / 1e6:,.1f} MB in "
        f"{len(result.files)} file{'s' if len(result.files) > 1 else ''}"
    )
    print(
        f"parameters: {result.source_parameters:,} -> {result.exported_parameters:,} ({result.parameter_growth:+.2%})"
        + (" (the headwise gate is stored once per channel)" if result.exported_parameters > result.source_parameters else "")
    )
    if result.max_difference is not None:
        print(f"largest logit difference from {args.src} (float32): {result.max_difference:g}")
    return 0
