"""``gated-qwen convert``: write the gated variant of a stock Qwen3 checkpoint."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    from ..utils.names import CHECKPOINT_CONVERSION_GATES, CONVERSION_INITS
    from ._arguments import add_checkpoint_arguments, add_gate_variant_arguments

    parser = subparsers.add_parser(
        "convert",
        help="convert a Qwen3 checkpoint into a gated one, or re-save a released arm as safetensors",
        description="Stream a Qwen3 checkpoint (a folder or a hub id; safetensors or pytorch_model.bin) tensor by "
        "tensor into a Qwen3Gated checkpoint: q_proj grows by the gate rows; with --init identity (default) the "
        "converted model computes exactly what the source did. --gate keep keeps the source's own gate and "
        "changes no tensor: a released arm becomes a clean gated-qwen checkpoint (safetensors, model_type "
        "qwen3_gated), loaded fast from then on. SRC is only read; DST is written atomically.",
    )
    add_checkpoint_arguments(
        parser,
        src_help="a Qwen3 checkpoint folder or a hub id, e.g. Qwen/Qwen3-0.6B",
        verify_help="load SRC and DST on CPU and print the largest logit difference",
    )
    parser.add_argument(
        "--gate",
        choices=CHECKPOINT_CONVERSION_GATES,
        default="headwise",
        help="gate type to add (default: headwise); keep: the source's own gate, re-saved unchanged",
    )
    parser.add_argument(
        "--init",
        choices=CONVERSION_INITS,
        default="identity",
        help="identity: zero gate rows and doubled o_proj, the same outputs bit for bit (default); "
        "random: gate rows drawn like the model's initializer",
    )
    add_gate_variant_arguments(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    from ..errors import GatedQwenError
    from ..transforms.conversion import convert_checkpoint
    from ..utils.names import GATE_VARIANT_DEFAULTS
    from ._arguments import checkpoint_options, gate_variant_options, written

    variant = gate_variant_options(args)
    if args.gate == "keep":
        if variant != GATE_VARIANT_DEFAULTS:
            raise GatedQwenError("--gate keep re-saves the source's own gate; leave the --gate-* variant options out")
        variant = {}
    result = convert_checkpoint(
        args.src, args.dst, gate=args.gate, init=args.init, **checkpoint_options(args), **variant
    )
    how = f"{result.gate} gate kept" if args.gate == "keep" else f"{args.gate} gate, {args.init} init"
    print(f"wrote {written(result)} ({how})")
    if result.max_difference is not None:
        print(f"largest logit difference from {args.src}: {result.max_difference:g}")
    return 0
