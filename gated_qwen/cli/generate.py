"""``gated-qwen generate``: complete prompts with a Qwen3Gated model (a released arm, a checkpoint, or the embedded default)."""

from __future__ import annotations

import json
import re
import sys


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def _unescape(text: str) -> str:
    r"""``\n``, ``\t`` and ``\\`` typed on a shell command line, as the characters they name."""
    return re.sub(r"\\([nt\\])", lambda match: _ESCAPES[match[1]], text)


def add_parser(subparsers) -> None:
    from ..utils.names import ATTENTION_IMPLEMENTATIONS
    from ._arguments import add_device_and_dtype, add_model_source, number

    parser = subparsers.add_parser(
        "generate",
        help="complete prompts with a model",
        description="Complete each prompt (arguments, --prompts-file, or stdin, one per line) with a Qwen3 or "
        "Qwen3Gated model. A single prompt streams its tokens as they come; several run as left-padded batches.",
    )
    parser.add_argument("prompts", nargs="*", metavar="PROMPT", help="prompts to complete")
    source = parser.add_argument_group("model")
    source.add_argument(
        "--model",
        metavar="PATH_OR_HUB_ID",
        help="checkpoint folder or hub id, e.g. QwQZh/gated_attention (default: the model embedded in this install)",
    )
    add_model_source(source, what="--model")
    source.add_argument("--tokenizer", metavar="PATH_OR_HUB_ID", help="load the tokenizer from here instead")
    add_device_and_dtype(source)
    source.add_argument(
        "--attn",
        default=None,
        choices=ATTENTION_IMPLEMENTATIONS,
        help="attention implementation (default: transformers' choice)",
    )
    inputs = parser.add_argument_group("prompts")
    inputs.add_argument("--prompts-file", metavar="PATH", help="a file with one prompt per line ('-': stdin)")
    inputs.add_argument("--batch-size", type=number(int, 1), default=8, help="prompts per batch (default 8)")
    inputs.add_argument("--chat", action="store_true", help="wrap each prompt in the tokenizer's chat template")
    inputs.add_argument("--system", help="system prompt for --chat")
    decoding = parser.add_argument_group("decoding")
    decoding.add_argument("--max-new-tokens", type=number(int, 1), default=64, help="default 64")
    mode = decoding.add_mutually_exclusive_group()
    mode.add_argument("--greedy", dest="do_sample", action="store_false", default=None, help="greedy decoding")
    mode.add_argument(
        "--do-sample",
        dest="do_sample",
        action="store_true",
        help="sample (implied by --temperature/--top-p/--top-k; default: the model's generation config)",
    )
    decoding.add_argument("--temperature", type=number(float, 0, low_open=True))
    decoding.add_argument("--top-p", type=number(float, 0, 1, low_open=True))
    decoding.add_argument("--top-k", type=number(int, 0))
    decoding.add_argument("--repetition-penalty", type=number(float, 0, low_open=True))
    decoding.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed torch first (default 0): the same command gives the same text every run; another seed, another sample",
    )
    decoding.add_argument(
        "--stop",
        action="append",
        metavar="STRING",
        type=_unescape,
        help=r"stop once the completion contains STRING, kept in the output (repeatable; \n and \t understood)",
    )
    output = parser.add_argument_group("output")
    output.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per prompt: prompt, completion, new_tokens, seconds, tokens_per_second",
    )
    output.add_argument("--no-stream", action="store_true", help="print a single prompt's completion at the end")
    output.add_argument("--verbose", action="store_true", help="show transformers' log messages and progress bars")
    parser.set_defaults(run=run)


def read_prompts(args) -> list[str]:
    """The prompts of the command line, then of --prompts-file; stdin when there are none and it is not a terminal."""
    from ..errors import GatedQwenError

    prompts = list(args.prompts)
    if args.prompts_file == "-" or (args.prompts_file is None and not prompts and not sys.stdin.isatty()):
        prompts += [line for line in sys.stdin.read().splitlines() if line.strip()]
    elif args.prompts_file is not None:
        with open(args.prompts_file, encoding="utf-8") as handle:
            prompts += [line for line in handle.read().splitlines() if line.strip()]
    if not prompts:
        raise GatedQwenError("no prompt: give one as an argument, in --prompts-file, or on stdin")
    return prompts


def resolve_model_source(model: str | None) -> str:
    """``--model``, or the embedded default model when it is absent."""
    from .. import default_models
    from ..errors import GatedQwenError

    if model is not None:
        return model
    default = default_models.default_model_path()
    if default is None:
        raise GatedQwenError(
            "--model is required: this install has no embedded default model. "
            "Pass a checkpoint folder or a hub id, e.g. --model QwQZh/gated_attention --subfolder 1B_gate_headwise"
        )
    return str(default)


def run(args) -> int:
    from ..errors import GatedQwenError
    from ..utils.verbosity import quiet_transformers

    if args.system is not None and not args.chat:
        raise GatedQwenError("--system needs --chat")
    prompts = read_prompts(args)
    with quiet_transformers(args.verbose):
        return _generate(args, prompts)


def _generate(args, prompts: list[str]) -> int:
    from ..tools.generation import CompletionStreamer, build_generation_config, generate, load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(
        resolve_model_source(args.model),
        subfolder=args.subfolder,
        revision=args.revision,
        tokenizer=args.tokenizer,
        device=args.device,
        dtype=args.dtype,
        attn_implementation=args.attn,
    )
    generation_config = build_generation_config(
        model,
        tokenizer,
        max_new_tokens=args.max_new_tokens,
        do_sample=args.do_sample,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        repetition_penalty=args.repetition_penalty,
        stop_strings=args.stop,
    )
    stream = len(prompts) == 1 and not (args.json or args.no_stream)
    streamer = CompletionStreamer(tokenizer, generation_config.stop_strings) if stream else None
    completions = generate(
        model,
        tokenizer,
        prompts,
        generation_config,
        batch_size=args.batch_size,
        chat=args.chat,
        system=args.system,
        seed=args.seed,
        streamer=streamer,
    )
    if stream:
        # A chat prompt is wrapped in a template, so only the reply is shown; a plain one is continued.
        print("" if args.chat else prompts[0], end="", flush=True)
        for _ in completions:
            pass  # the streamer has printed the completion and the final newline
        return 0
    for number, completion in enumerate(completions):
        if args.json:
            print(json.dumps(completion.to_json(), ensure_ascii=False), flush=True)
            continue
        if number:
            print()
        print(("" if args.chat else completion.prompt) + completion.completion, flush=True)
    return 0
