"""``gated-qwen export``: write a gated checkpoint as a stock architecture that engines read without gated-qwen."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    # No torch or transformers here: building the parser must stay instant (--to is checked in run).
    parser = subparsers.add_parser(
        "export",
        help="export a gated checkpoint to transformers' stock Qwen3.5 architecture",
        description="Stream a gated checkpoint (a released arm or one saved by gated-qwen; a folder or a hub id) "
        "tensor by tensor into a stock transformers Qwen3_5ForCausalLM checkpoint (model_type qwen3_5_text, "
        "every layer full attention), which computes the same model and loads without gated-qwen. A headwise "
        "gate is stored elementwise (+6.8% parameters on the released 1.7B arm). SRC is only read; DST is "
        "written atomically.",
    )
    from ._arguments import add_checkpoint_arguments

    add_checkpoint_arguments(
        parser,
        src_help="a gated checkpoint folder or a hub id",
        verify_help="load SRC (gated-qwen) and DST (transformers' Qwen3_5ForCausalLM) in float32 on CPU and print "
        "the largest logit difference",
    )
    parser.add_argument("--to", required=True, metavar="ARCH", help="target architecture: qwen3_5")
    parser.set_defaults(run=run)


def run(args) -> int:
    from ..transforms.export import export_checkpoint
    from ._arguments import checkpoint_options, written

    result = export_checkpoint(args.src, args.dst, to=args.to, **checkpoint_options(args))
    print(f"wrote {written(result)} ({result.to})")
    import json

    # an MoE export also gains Qwen3.5-MoE's shared experts (zero), whatever its gate
    moe = json.loads((result.path / "config.json").read_text())["model_type"] == "qwen3_5_moe_text"
    print(
        f"parameters: {result.source_parameters:,} -> {result.exported_parameters:,} ({result.parameter_growth:+.2%})"
        + (
            (
                " (Qwen3.5-MoE's shared experts, zero here, and a headwise gate, if any, stored once per channel)"
                if moe
                else " (the headwise gate is stored once per channel)"
            )
            if result.exported_parameters > result.source_parameters
            else ""
        )
    )
    if result.max_difference is not None:
        print(f"largest logit difference from {args.src} (float32): {result.max_difference:g}")
    return 0
